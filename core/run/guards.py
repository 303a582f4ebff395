"""The fault-handling layer around the training loop, behind four calls the loop makes.

The loop asks ``stop_now`` before each step and reports ``step_started`` /
``step_finished``; behind them sit the stop-on-signal agreement (``preemption``), which
also stops every rank when one could not write the run's output (``output_failures``),
the hang watchdog (``watchdog``) and, in tests only, fault injection (``fault_injection``).
So the loop stays one straight path, and each concern is a module of its own.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING

from lerobot_kit.core.run import fault_injection
from lerobot_kit.core.run.output_failures import OutputFailures
from lerobot_kit.core.run.preemption import StopAgreement, StopSignals
from lerobot_kit.core.run.watchdog import StepWatchdog

if TYPE_CHECKING:
    from lerobot_kit.core.run.components import RunComponents


class RunGuards:
    """Built on every rank at the same point of start-up (the agreement creates a process group)."""

    def __init__(self, run: RunComponents) -> None:
        config, ctx = run.config, run.ctx
        self.requests = StopSignals(config.preemption, ctx.rank)
        self.failures = OutputFailures(ctx, run.output_dir)
        self.agreement = StopAgreement(self.requests, ctx.distributed, failing=self.failures.pending)
        timeout = config.parallelism.step_timeout_s
        self.watchdog = StepWatchdog(timeout, ctx.rank) if timeout is not None else None
        self.faults = fault_injection.from_env(run)

    def start(self) -> None:
        """Just before the first step: from here on a signal stops the run at a step boundary."""
        self.requests.install()
        if self.watchdog is not None:
            self.watchdog.start()

    def stop_now(self) -> bool:
        """Before each step, on every rank; true on all ranks at once when any was asked to stop."""
        return self.agreement.stop_now()

    @property
    def stopped_by(self) -> signal.Signals | None:
        """The signal the ranks agreed to stop on, or None when the run went to its end (or failed)."""
        return self.agreement.agreed

    def raise_if_failed(self, step: int) -> None:
        """Collective, after the loop: ``OutputWriteError`` on every rank when a rank could not
        write the run's output."""
        self.failures.raise_if_any(step)

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

    def finish(self) -> None:
        """After the loop and its last checkpoint: default signal handling again."""
        self.agreement.close()
        if self.watchdog is not None:
            self.watchdog.close()
        self.requests.restore()
