"""A checkpoint the file system refuses: one line on every rank, ``last`` untouched, no ``.tmp`` left.

Any write of a save can fail: a full disk (``disk_space``), a file system remounted
read-only, an exhausted quota, a permission. A save runs in phases (``save_phase``);
each ends with the ranks exchanging whether their part failed — one small all-gather
where a barrier stood before — so a rank whose write failed never leaves the others
waiting in a collective it will not join: every rank leaves the save at the same point.
Inside a phase, a failed main-process write through the API's writers is held until
the phase ends (``held_until_phase_end``), so a format's collectives after it (DCP
shards after the gathered file) still run on every rank.

Then ``cleaned_up`` turns the agreed failure into one line, the same on every rank: the
step, the path and errno that failed, what became of the unfinished ``NNNNNN.tmp`` (the
main process removes it) and where ``checkpoints/last`` points: it was never touched. On
a file system that refuses the removal too (read-only), the folder stays and the line
says so; resume ignores ``.tmp`` folders, and the next save of that step, or the next
published checkpoint after it, removes it.

Only failures of the writes are agreed on: an ``OSError`` (also inside safetensors' or
DCP's wrappers, or torch's zip writer, which loses the errno), or the checkpoint's own
refusal (a ``CheckpointError``). Anything else is a bug and propagates as it is.
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch.distributed.checkpoint.api import CheckpointException

from lerobot_kit.core.checkpoint import disk_space
from lerobot_kit.core.distributed.process_group import all_gather_objects, broadcast_object
from lerobot_kit.core.errors import CheckpointError, first_line, os_error_line
from lerobot_kit.core.layout import atomic, paths

if TYPE_CHECKING:
    from lerobot_kit.core.checkpoint.state import CheckpointState

# What torch's zip writer (DCP's non-tensor entries) says when a write fails: the errno is lost.
_ZIP_WRITER_FAILURES = ("PytorchStreamWriter failed", "unexpected pos", "inline_container")

# What to do about a refused write, by errno; anything else: find the cause in the system's message.
_FIXES = {
    errno.EROFS: "the file system became read-only: remount it read-write (or move the run's folder), then resume",
    errno.EDQUOT: "a disk quota is exhausted: free space under it (or keep fewer checkpoints), then resume",
    errno.EACCES: "permission denied: let this user write the run's folder again, then resume",
    errno.EPERM: "operation not permitted: let this user write the run's folder again, then resume",
}
_DEFAULT_FIX = "fix what the system reports, then resume"


class CheckpointWriteError(CheckpointError):
    """A checkpoint's write was refused (not for space); every rank raises it alike, nothing was published."""


@dataclass(frozen=True)
class Failure:
    """What failed on one rank, as plain text: it is sent to the other ranks."""

    rank: int
    what: str  # "<path>: <strerror> (errno NAME)", a refusal's own line, or "Type: first line"
    fix: str  # what to do about it; empty for a refusal, whose line says it
    disk_full: bool


class SaveFailed(Exception):
    """Raised on every rank alike when any rank's part of a save failed; ``cleaned_up`` words it."""

    def __init__(self, failures: list[Failure]) -> None:
        super().__init__("; ".join(f"rank {f.rank}: {f.what}" for f in failures))
        self.failures = failures


_held: ContextVar[list[OSError] | None] = ContextVar("lerobot_kit_held_write_failures", default=None)


@contextmanager
def held_until_phase_end() -> Iterator[None]:
    """Around one write of the main process: inside a save phase, an ``OSError`` is kept for the
    phase's agreement instead of raised, so the code after it still joins its collectives.
    Outside a save (``save_pretrained`` on its own) it raises at once."""
    held = _held.get()
    if held is None:
        yield
        return
    try:
        yield
    except OSError as exc:
        held.append(exc)


@contextmanager
def save_phase(state: CheckpointState, group: Any = None) -> Iterator[None]:
    """Collective (over ``group``, default all ranks): this rank's part of one phase of a save,
    then the ranks agree: ``SaveFailed`` on every rank when any part failed.

    A phase must not start a collective after a write that can fail on one rank only (a
    failing rank would go to the agreement while the others wait in that collective).
    """
    folder = paths.checkpoints_root(state.output_dir)
    held: list[OSError] = []
    token = _held.set(held)
    mine: Failure | None = None
    cause: BaseException | None = None
    try:
        yield
    except SaveFailed:
        raise
    except (Exception, CheckpointException) as exc:  # DCP's CheckpointException is a BaseException
        mine = describe(exc, state.ctx.rank, folder)
        if mine is None:
            raise
        cause = exc
    finally:
        _held.reset(token)
    if mine is None and held:
        cause = held[0]
        mine = describe(cause, state.ctx.rank, folder)
    failures = [f for f in all_gather_objects(state.ctx, mine, group) if f is not None]
    if failures:
        raise SaveFailed(failures) from cause


def describe(exc: BaseException, rank: int, folder: Path) -> Failure | None:
    """``exc`` as a failed write of this rank, or None when it is not one (a bug)."""
    errors = list(disk_space.underlying_errors(exc))
    os_error = next((e for e in errors if isinstance(e, OSError)), None)
    refusal = next((e for e in errors if isinstance(e, CheckpointError)), None)
    zip_writer = next((e for e in errors if any(m in str(e) for m in _ZIP_WRITER_FAILURES)), None)
    full = disk_space.is_disk_full(exc, folder)
    if os_error is not None:
        return Failure(rank, os_error_line(os_error), fix_for(os_error.errno), full)
    if refusal is not None:
        return Failure(rank, str(refusal), "", full)
    if zip_writer is not None or full:
        root = zip_writer or disk_space.root_error(exc)
        return Failure(rank, f"{type(root).__name__}: {first_line(root)}", _DEFAULT_FIX, full)
    return None


def fix_for(code: int | None) -> str:
    """What to do about a write the file system refused with errno ``code``."""
    return _FIXES.get(code, _DEFAULT_FIX) if code is not None else _DEFAULT_FIX


@contextmanager
def cleaned_up(state: CheckpointState, step: int, needed_total: int) -> Iterator[None]:
    """Around a whole save: a failure the ranks agreed on becomes the same line on every rank (a
    ``DiskFullError`` when the disk filled up), after the main process removed the unfinished
    temporary folder (collective then: every rank is here at once). Other errors pass through
    unchanged."""
    try:
        yield
    except SaveFailed as failed:
        removed = broadcast_object(state.ctx, remove_unfinished(state, step) if state.ctx.is_main else None)
        if any(f.disk_full for f in failed.failures):
            raise disk_space.disk_full(state, step, needed_total, removed) from failed
        raise write_error(state, step, failed.failures[0], removed) from failed


def remove_unfinished(state: CheckpointState, step: int) -> str:
    """Main process: remove the save's ``NNNNNN.tmp``; what became of it, in words."""
    tmp = atomic.temp_step_dir(state.output_dir, step)
    if not tmp.exists():
        return "nothing of it was written"
    try:
        shutil.rmtree(tmp)
    except OSError as exc:
        return (f"the unfinished {tmp} could not be removed ({exc.strerror or first_line(exc)}) and stays: resume "
                "ignores it, and the next checkpoint removes it")
    return f"{tmp.name} is removed"


def write_error(state: CheckpointState, step: int, failure: Failure, removed: str) -> CheckpointWriteError:
    """The one line for a save that failed with ``failure`` (not a full disk)."""
    fix = f"; {failure.fix}" if failure.fix else ""
    return CheckpointWriteError(
        f"checkpoint of step {step} not written: {failure.what}; {removed}; {disk_space.last_text(state.output_dir)}{fix}"
    )
