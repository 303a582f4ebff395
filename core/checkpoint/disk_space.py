"""A checkpoint that does not fit on the disk: refused before writing, or cleaned up after.

Before a save, every rank estimates the bytes it is about to write (its share) from its
live tensors, and the ranks compare shares with the free space of the checkpoint folder
(one small all-gather). If any rank lacks room, every rank stops at once with the same
line naming the folder, the bytes needed and the bytes free, before anything is written;
as they all stop at the same point, they close their process group together and each
exits with the error's code (a rank that left its group to the interpreter's exit could
die of SIGABRT tearing it down after a peer had gone).

The estimate cannot see other writers: ranks that share one disk each count only their
own share, and other programs keep writing. So a write may still fail with ``ENOSPC``:
an ``OSError`` from Python, a ``SafetensorError`` from safetensors, a DCP
``CheckpointException`` wrapping one per rank — or, from torch's zip writer (DCP's
non-tensor items), an "unexpected pos" error that has lost the errno; so a failed write
that leaves less than ``OTHER_FILES_BYTES`` free counts as a full disk too. Then, as
for any failed write of a save (``write_failures``), the main process removes the
unfinished ``NNNNNN.tmp`` folder — a full disk left full would make the retry fail the
same way — and every rank ends with the same kind of line; ``checkpoints/last`` was
never touched.
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lerobot_kit.core.errors import CheckpointError
from lerobot_kit.core.layout import paths
from lerobot_kit.core.layout.byte_size import byte_size

if TYPE_CHECKING:
    from lerobot_kit.core.checkpoint.state import CheckpointState

# JSON files, processors, RNG state and safetensors headers, beyond the tensors counted.
OTHER_FILES_BYTES = 1 << 20


class DiskFullError(CheckpointError):
    """The checkpoint does not fit on the disk; nothing of it is left behind."""


class DiskSpaceRefused(DiskFullError):
    """The check before a save found too little room: raised on every rank at the same step,
    before anything is written, so the ranks can close their process group together."""


def share_bytes(state: CheckpointState) -> int:
    """About how many bytes this rank writes for one checkpoint of ``state``.

    Weights: the full tensors in the gathered file (main process; sharded runs under a
    format with a gathered file; only the trainable ones for PEFT) and this rank's shards
    (formats with DCP shards). Optimizer state: this rank's shards (sharded runs), else
    the whole state on the main process. HSDP replicas hold the same shards and DCP has
    each written once, spread over the replicas.
    """
    facts, is_main = state.facts, state.ctx.is_main
    stored = [p for p in state.model.parameters() if p.requires_grad or state.weights.naming.include_frozen]
    full_weights = sum(p.numel() * p.element_size() for p in stored)
    optimizer = sum(_local_bytes(v) for entry in state.optimizer.state.values() for v in entry.values())
    if not facts.sharded:
        return full_weights + optimizer + OTHER_FILES_BYTES if is_main else 0
    gathered = facts.checkpoint_format != "dcp"  # a plugin format may write both: counted as both
    shards = facts.checkpoint_format != "safetensors"
    share = (optimizer + (sum(_local_bytes(p) for p in stored) if shards else 0)) // facts.topology.dp_replicate
    if is_main:
        share += (full_weights if gathered else 0) + OTHER_FILES_BYTES
    return share


def _local_bytes(value: Any) -> int:
    """Bytes of a tensor this rank holds (a DTensor's local shard); 0 for non-tensors."""
    local = getattr(value, "to_local", None)
    tensor = local() if callable(local) else value
    return tensor.numel() * tensor.element_size() if hasattr(tensor, "element_size") else 0


def free_bytes(folder: Path) -> int:
    """Free bytes of the file system ``folder`` is (or will be) on."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    return shutil.disk_usage(existing).free


def check_room(state: CheckpointState, step: int) -> int:
    """Collective, before a save: ``DiskSpaceRefused`` on every rank when some rank's share does
    not fit in the free space it sees. Returns the bytes all ranks will write together."""
    from lerobot_kit.core.distributed.process_group import all_gather_objects

    folder = paths.checkpoints_root(state.output_dir)
    mine = (state.ctx.rank, share_bytes(state), free_bytes(folder))
    everyone = all_gather_objects(state.ctx, mine)
    total = sum(needed for _, needed, _ in everyone)
    short = [(rank, needed, free) for rank, needed, free in everyone if needed > free]
    if short:
        rank, needed, free = short[0]
        raise DiskSpaceRefused(
            f"checkpoint of step {step} not written: {folder} has {byte_size(free)} free and rank {rank} needs about "
            f"{byte_size(needed)} for its part ({byte_size(total)} for all ranks); {last_text(state.output_dir)}; free space or "
            "keep fewer checkpoints (--keep_last_checkpoints), then resume"
        )
    return total


def disk_full(state: CheckpointState, step: int, needed_total: int, removed: str) -> DiskFullError:
    """The error for a save that ran out of space; ``removed`` says what became of its temporary
    folder (``write_failures.remove_unfinished``, which the caller ran)."""
    folder = paths.checkpoints_root(state.output_dir)
    return DiskFullError(
        f"checkpoint of step {step} not written: the disk of {folder} is full (No space left on device while "
        f"writing it; it needs about {byte_size(needed_total)}; {removed}, which leaves {byte_size(free_bytes(folder))} free); "
        f"{last_text(state.output_dir)}; free space or keep fewer checkpoints (--keep_last_checkpoints), then resume"
    )


def root_error(exc: BaseException) -> BaseException:
    """What actually failed under ``exc``: DCP's own message names only the failing ranks."""
    return next((e for e in underlying_errors(exc) if getattr(e, "failures", None) is None), exc)


def is_disk_full(exc: BaseException, folder: Path) -> bool:
    """Whether ``exc``, a failed write into ``folder``, is (or wraps) one that found no space left."""
    for error in underlying_errors(exc):
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            return True
        if "No space left on device" in str(error) or "StorageFull" in str(error):
            return True
    return not isinstance(exc, KeyboardInterrupt) and free_bytes(folder) < OTHER_FILES_BYTES


def underlying_errors(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then the per-rank errors a DCP ``CheckpointException`` carries, then causes
    and contexts, breadth first: the first one that wraps nothing is the real failure."""
    seen: set[int] = set()
    pending = [exc]
    while pending:
        error = pending.pop(0)
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        yield error
        failures = getattr(error, "failures", None)
        if isinstance(failures, dict):
            pending.extend(wrapped[0] if isinstance(wrapped, tuple) else wrapped for wrapped in failures.values())
        pending.extend(e for e in (error.__cause__, error.__context__) if e is not None)


def last_text(output_dir: Path) -> str:
    """Where ``checkpoints/last`` points, for the line of a save that did not happen."""
    last = paths.last_checkpoint(output_dir)
    return f"{paths.CHECKPOINTS_DIR}/{paths.LAST_LINK} still points to {last.name}" if last else "no checkpoint yet"
