"""Stopping a run on request: at a step boundary every rank agrees on, with a checkpoint.

Schedulers preempt a job by signalling it (SLURM: SIGTERM, then SIGKILL after a grace
period; many sites send SIGUSR1 ahead of time) and expect it to be requeued and rerun.
A signal may reach one rank (``kill`` of a worker) or all of them at slightly different
moments, so no rank may stop on its own: each rank only records the request, and once
per step the ranks all-reduce (MAX) a flag on a gloo group of their own. Every rank reads
the same result after the same step, so all stop there, write one checkpoint and exit
with ``EXIT_STOPPED``; the restarted run continues from that checkpoint.

The all-reduce of step k is started before step k and read before step k+1, so it runs
while step k computes and never stalls the loop (nor, under NCCL, synchronises the GPU):
a request that arrives during step k stops the run after step k+1.

Launchers relay the signal they receive to their workers (torchrun passes its SIGTERM or
SIGINT on, and a terminal's Ctrl-C reaches every process of the foreground group), so one
request often arrives twice within milliseconds; only a signal more than
``REPEAT_GRACE_S`` after the first counts as a second one, which ends the process at once
without a checkpoint (the previous one stays intact).

Before the first step there is nothing to save and no step boundary to wait for, while
start-up (building the dataset and its stats, the model, restoring a checkpoint) can take
minutes: a request then stops the run at once. The handler, installed when ``train``
starts (``core.run.reliability.guards.guarded_run``), raises ``StartupStopped`` wherever the process
is, and the run ends with ``EXIT_STOPPED`` as after a stop at a step boundary: the
rerun starts where this one did.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from lerobot_kit.core.config.schema import PreemptionConfig
from lerobot_kit.core.errors import EXIT_STOPPED, LerobotError

REPEAT_GRACE_S = 2.0
# The flag of a rank that could not write the run's output (``output.failures``): above
# every signal number, so that the MAX of the ranks' flags says "failed" over "signalled".
OUTPUT_FAILED = 1 << 10


class RunStopped(LerobotError):
    """The run stopped on a signal after saving; rerunning the same command continues it."""

    exit_code = EXIT_STOPPED


class StartupStopped(BaseException):
    """Raised by the stop handler during start-up. A ``BaseException``, as ``KeyboardInterrupt``
    is, so that the code it interrupts does not take it for one of its own errors."""

    def __init__(self, signum: signal.Signals) -> None:
        super().__init__(signum.name)
        self.signal = signum


def startup_stopped(signum: signal.Signals) -> RunStopped:
    return RunStopped(f"stopped by {signum.name} during start-up, before the first step; no checkpoint was written, "
                      "so rerunning the same command starts where this one did")


def run_stopped(signal_name: str, step: int, steps: int, checkpoint: str | None, saving: bool) -> RunStopped:
    """The line a stopped run ends with; ``checkpoint`` is known on the main process only."""
    if not saving:
        return RunStopped(f"stopped by {signal_name} at step {step}/{steps}; checkpoints are off, so a rerun "
                          "starts over")
    saved = checkpoint or "the checkpoint of that step"
    return RunStopped(f"stopped by {signal_name} at step {step}/{steps} after saving {saved}; a torchrun or SLURM "
                      "restart continues from it, as does this command with --resume=auto")


class StopSignals:
    """Signal handlers that record a stop request (main thread only: Python's rule); while
    ``starting``, they raise ``StartupStopped`` instead.

    ``rank`` None: the ``RANK`` the launcher exported, read when a signal arrives (a handler
    installed before the process group knows its rank only from there).
    """

    def __init__(self, config: PreemptionConfig, rank: int | None = None, *, starting: bool = False) -> None:
        self.signals = [signal.Signals(n) for n in config.signal_numbers()]
        self._rank = rank
        self.starting = starting
        self.received: signal.Signals | None = None
        self._received_at = 0.0
        self._previous: dict[signal.Signals, Any] = {}

    @property
    def rank(self) -> int:
        return self._rank if self._rank is not None else int(os.environ.get("RANK", "0"))

    def install(self) -> None:
        global _installed
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._handle)
        _installed = self

    def loop_started(self) -> None:
        """From the first step on, a request is recorded and the ranks stop at a step boundary."""
        self.starting = False

    def restore(self) -> None:
        global _installed
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
        if _installed is self:
            _installed = None

    def ignore(self) -> None:
        """The run has ended, on a stop or an error every rank agreed on; only closing its
        process group and exiting are left. A signal now (torchrun signals the ranks still
        exiting once the first has exited) must not turn the exit code the run ended with
        into a death by signal, as it would under the default handlers, which Python's exit
        puts back in place of its own: the signals are ignored until the exit."""
        global _installed
        for signum in self.signals:
            signal.signal(signum, signal.SIG_IGN)
        self._previous.clear()
        if _installed is self:
            _installed = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if self.received is None:
            self.received, self._received_at = signal.Signals(signum), now
            if self.starting:
                _say(f"rank {self.rank}: {self.received.name} received during start-up; stopping now (no step has "
                     "run, so there is nothing to save)")
                raise StartupStopped(self.received)
            _say(f"rank {self.rank}: {self.received.name} received; stopping at the next step boundary with a "
                 f"checkpoint (a second signal ends the run at once, without one)")
            return
        if now - self._received_at < REPEAT_GRACE_S:
            return  # the same request, relayed by a launcher
        _say(f"rank {self.rank}: {signal.Signals(signum).name} received again; exiting now without a checkpoint")
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


_installed: StopSignals | None = None  # signal handlers are the process's: one set at a time


def installed_stop_signals() -> StopSignals | None:
    """The handlers ``guarded_run`` installed for this run, if it runs under it."""
    return _installed


class StopAgreement:
    """Once per step, whether any rank has a stop request; the same answer on every rank.

    A request is a signal, or ``failing()``: a write of the run's output failed on this
    rank. The ranks then stop alike, with ``agreed`` left None (no signal, no checkpoint).
    """

    def __init__(self, requests: StopSignals, distributed: bool, failing: Callable[[], bool] | None = None) -> None:
        self.requests = requests
        self.failing = failing
        self.agreed: signal.Signals | None = None
        self._group: Any = None
        self._pending: Any = None
        self._flag: Any = None
        if distributed:
            import torch.distributed as dist

            from lerobot_kit.core.distributed.process_group import per_default_group

            # Collective: every rank creates it at the same point of start-up. gloo on the CPU,
            # so reading the flag never waits for an accelerator.
            self._group = per_default_group("stop agreement", lambda: dist.new_group(backend="gloo"))

    def stop_now(self) -> bool:
        """Call once per step on every rank, before the step; true: stop here."""
        if self._group is None:
            return self._settle(self._local())
        import torch
        import torch.distributed as dist

        if self._pending is not None:
            self._pending.wait()
            agreed = int(self._flag.item())
            if agreed:
                self._pending = None
                return self._settle(agreed)
        self._flag = torch.tensor([self._local()], dtype=torch.int32)
        self._pending = dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, group=self._group, async_op=True)
        return False

    def _local(self) -> int:
        """This rank's flag: ``OUTPUT_FAILED``, the signal received, or 0."""
        if self.failing is not None and self.failing():
            return OUTPUT_FAILED
        received = self.requests.received
        return int(received) if received is not None else 0

    def _settle(self, flag: int) -> bool:
        """Record the signal the ranks agreed on, if any; true: stop here."""
        if flag and flag != OUTPUT_FAILED:
            self.agreed = signal.Signals(flag)
        return bool(flag)

    def close(self) -> None:
        """Let the last all-reduce finish (every rank started it) before the group goes away."""
        if self._pending is not None:
            self._pending.wait()
            self._pending = None


def _say(line: str) -> None:
    """Straight to stderr: this runs inside a signal handler, and other ranks log errors only."""
    os.write(2, (line + "\n").encode())
