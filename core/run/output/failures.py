"""A write of the run's output that fails during training: every rank stops at one step, with one line.

The main process alone appends ``logs/metrics.jsonl`` (training and evaluation rows),
feeds the tracker and publishes a checkpoint written in the background; a background
write fails in a thread, noticed by each rank at its own moment. Raising where the failure
happens would end one process while the others wait in the next step's collective. So
the failure is recorded here
and posted as a stop request (``preemption.StopAgreement``): the ranks agree to stop at
the same step boundary, as for a signal, but without writing a checkpoint on the way
out. After the loop they exchange what failed (also during the last step, which no
agreement follows) and every rank raises the same line: what was being written, the
path and errno, the step the run stopped after and where ``checkpoints/last`` points —
the last published checkpoint, intact, which the run continues from once the cause is
fixed. (A failed background write gets its own line from the checkpoint saver, raised
on every rank when they next wait for that save together.)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lerobot_kit.core.checkpoint.write_failures import fix_for
from lerobot_kit.core.distributed.process_group import DistContext, all_gather_objects
from lerobot_kit.core.errors import LerobotError, os_error_line
from lerobot_kit.core.layout import paths


class OutputWriteError(LerobotError):
    """A file of the run's output (the metrics log, the tracker's, a checkpoint's publish) could not be
    written; every rank stopped."""


class OutputFailures:
    """This rank's first failed output write, kept until the ranks agree to stop."""

    def __init__(self, ctx: DistContext, output_dir: Path) -> None:
        self.ctx = ctx
        self.output_dir = output_dir
        self.first: tuple[str, str] | None = None  # what failed, and what to do about it

    @contextmanager
    def recorded(self, what: str) -> Iterator[None]:
        """Around writes of ``what`` (e.g. "the metrics log"): an ``OSError`` is recorded, not raised."""
        try:
            yield
        except OSError as exc:
            self.record(f"could not write {what}: {os_error_line(exc)}", fix_for(exc.errno))

    def record(self, what: str, fix: str) -> None:
        """A failure described by the code that met it (the checkpoint saver's background side)."""
        if self.first is None:
            self.first = (what, fix)

    def pending(self) -> bool:
        """Whether this rank asks the others to stop (read by the stop agreement before each step)."""
        return self.first is not None

    def agreed_error(self, step: int) -> OutputWriteError | None:
        """Collective, after the loop: when any rank recorded a failure (before the ranks agreed to
        stop, or during the last step), the first rank's line, for every rank to raise."""
        described = [first for first in all_gather_objects(self.ctx, self.first) if first is not None]
        if not described:
            return None
        what, fix = described[0]
        last = paths.last_checkpoint(self.output_dir)
        kept = f"{paths.CHECKPOINTS_DIR}/{paths.LAST_LINK} points to {last.name}" if last else "no checkpoint yet"
        fix = f"; {fix} (--resume=true)" if fix else "; then resume (--resume=true)"
        return OutputWriteError(f"{what}; the run stopped after step {step}; {kept}{fix}")
