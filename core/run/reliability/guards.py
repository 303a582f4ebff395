"""The fault-handling layer around the training loop, behind four calls the loop makes.

The loop asks ``stop_now`` before each step and reports ``step_started`` /
``step_finished``; behind them sit the stop-on-signal agreement (``preemption``), which
also stops every rank when one could not write the run's output (``output.failures``),
the hang watchdog (``watchdog``) and, when ``LEROBOT_KIT_FAULT`` asks, fault injection
(``fault_injection``, docs/fault-injection.md).
So the loop stays one straight path, and each concern is a module of its own.

``guarded_run`` wraps the whole of ``train``: its stop handlers are installed at the first
line of start-up, with the watch on the launcher's life (``launcher_watch``), and the
process's exit code is the one the run ended with.
"""

from __future__ import annotations

import functools
import signal
from typing import TYPE_CHECKING, Callable, TypeVar

from lerobot_kit.core.checkpoint.disk_space import DiskFullError
from lerobot_kit.core.checkpoint.write_failures import CheckpointWriteError
from lerobot_kit.core.run.output.failures import OutputFailures, OutputWriteError
from lerobot_kit.core.run.reliability import fault_injection
from lerobot_kit.core.run.reliability.launcher_watch import LauncherWatch
from lerobot_kit.core.run.reliability.nonfinite import NonFiniteError
from lerobot_kit.core.run.reliability.preemption import (
    RunStopped,
    StartupStopped,
    StopAgreement,
    StopSignals,
    installed_stop_signals,
    startup_stopped,
)
from lerobot_kit.core.run.reliability.watchdog import StepWatchdog

if TYPE_CHECKING:
    from lerobot_kit.core.config.schema import TrainConfig
    from lerobot_kit.core.run.components import RunComponents

Result = TypeVar("Result")

# Raised on every rank at the same point of the loop, after the ranks agreed on it (a
# non-finite step, a save the disk cannot hold or the file system refused), and after the
# loop (a refused write of the run's other output): like a stop, the ranks close their
# process group together.
LOOP_ERRORS = (NonFiniteError, DiskFullError, CheckpointWriteError)
EVERY_RANK_ERRORS = (*LOOP_ERRORS, OutputWriteError)


def guarded_run(train: Callable[[TrainConfig], Result]) -> Callable[[TrainConfig], Result]:
    """``train`` with the stop signals handled from its first line.

    During start-up a stop signal ends the run at once with ``RunStopped`` (exit code 75,
    as a stop at a step boundary); ``RunGuards`` takes the same handlers over for the loop.
    A rank that a launcher started stops the same way when that launcher dies.
    A run that ends on a stop or on an error every rank agreed on has only its exit left:
    from there on signals are ignored (``RunGuards.finish``), so that every rank exits with
    the run's code — torchrun signals the ranks still exiting as soon as one has exited.
    """

    @functools.wraps(train)
    def run(config: TrainConfig) -> Result:
        requests = StopSignals(config.preemption, starting=True)
        requests.install()
        # A rank whose launcher dies stops as on a stop signal (``launcher_watch``); the watch
        # ends before the handlers do, so its signal never meets the default ones.
        watch = LauncherWatch.start_if_launched(requests)
        try:
            try:
                result = train(config)
            finally:
                if watch is not None:
                    watch.close()
        except StartupStopped as exc:
            requests.ignore()
            raise startup_stopped(exc.signal) from exc
        except (RunStopped, *EVERY_RANK_ERRORS):
            requests.ignore()
            raise
        except BaseException:
            requests.restore()
            raise
        requests.restore()
        return result

    return run


class RunGuards:
    """Built on every rank at the same point of start-up (the agreement creates a process group)."""

    def __init__(self, run: RunComponents) -> None:
        config, ctx = run.config, run.ctx
        installed = installed_stop_signals()
        self._own_handlers = installed is None
        self.requests = installed or StopSignals(config.preemption, ctx.rank)
        self.failures = OutputFailures(ctx, run.output_dir)
        self.agreement = StopAgreement(self.requests, ctx.distributed, failing=self.failures.pending)
        timeout = config.parallelism.step_timeout_s
        self.watchdog = StepWatchdog(timeout, ctx.rank) if timeout is not None else None
        self.faults = fault_injection.from_env(run)

    def start(self) -> None:
        """Just before the first step: from here on a signal stops the run at a step boundary."""
        if self._own_handlers:
            self.requests.install()
        self.requests.loop_started()
        if self.watchdog is not None:
            self.watchdog.start()

    def stop_now(self) -> bool:
        """Before each step, on every rank; true on all ranks at once when any was asked to stop."""
        return self.agreement.stop_now()

    @property
    def stopped_by(self) -> signal.Signals | None:
        """The signal the ranks agreed to stop on, or None when the run went to its end (or failed)."""
        return self.agreement.agreed

    def output_error(self, step: int) -> OutputWriteError | None:
        """Collective, after the loop: on every rank, the ``OutputWriteError`` to raise when a rank
        could not write the run's output, else None."""
        return self.failures.agreed_error(step)

    def step_started(self, step: int) -> None:
        """``step`` is the number of the step about to run (checkpoints count the same way)."""
        if self.watchdog is not None:
            self.watchdog.step_started(step)
        for fault in self.faults:
            fault.step_started(step)

    def step_finished(self, step: int) -> None:
        """After the step's optimizer update, before its log line and checkpoint."""
        if self.watchdog is not None:
            self.watchdog.step_finished()
        for fault in self.faults:
            fault.step_finished(step)

    def finish(self, agreed_error: bool = False) -> None:
        """After the loop and its last checkpoint, or as an error of ``EVERY_RANK_ERRORS`` leaves
        it (``agreed_error``). Under ``guarded_run``, a run that stopped on a signal or on such
        an error has nothing left for a signal to stop — its ranks close their process group
        and exit with the run's code — so signals are ignored from here; a run that went to
        its end gets default signal handling back, as it does outside ``guarded_run``."""
        self.agreement.close()
        if self.watchdog is not None:
            self.watchdog.close()
        if not self._own_handlers and (agreed_error or self.stopped_by is not None):
            self.requests.ignore()
        else:
            self.requests.restore()
