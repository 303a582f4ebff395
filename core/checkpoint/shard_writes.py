"""Where a checkpoint's DCP shard writes go: to the disk now, or to a background thread.

Formats (built-in or a plugin's, through ``write_shards``) and the optimizer saver all
call ``save_shards``. Whether that call blocks until the bytes are on the disk, or only
until they are copied into memory, is decided by the checkpoint saver for the span of one
save (``deferred_shard_writes``), so no format needs to know about asynchronous saving.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class DeferredWrites:
    """Staged states and their folders, in call order, for one background thread to write.

    One thread writes them one after the other: every rank then runs the same DCP
    collectives in the same order on the side group (two writes in flight at once could
    interleave their collectives differently on different ranks and hang).
    """

    stager: Any
    writes: list[tuple[dict[str, Any], Path]] = field(default_factory=list)


_deferred: ContextVar[DeferredWrites | None] = ContextVar("lerobot_kit_deferred_shard_writes", default=None)


def save_shards(state: dict[str, Any], folder: Path) -> None:
    """Collective: write ``state`` as DCP shards into ``folder``.

    Inside ``deferred_shard_writes`` the state is only staged (copied to host memory, so
    training may change the live tensors at once) and queued for ``write_deferred``.
    """
    deferred = _deferred.get()
    if deferred is None:
        import torch.distributed.checkpoint as dcp

        dcp.save(state, checkpoint_id=str(folder))
    else:
        deferred.writes.append((deferred.stager.stage(state), folder))


def write_deferred(writes: list[tuple[dict[str, Any], Path]], group: Any) -> None:
    """Collective over ``group``: the queued DCP writes, in order (run in a background thread)."""
    import torch.distributed.checkpoint as dcp

    for state, folder in writes:
        dcp.save(state, checkpoint_id=str(folder), process_group=group)


@contextmanager
def deferred_shard_writes(stager: Any) -> Iterator[DeferredWrites]:
    """Within the block, ``save_shards`` returns once its state is staged in memory."""
    deferred = DeferredWrites(stager)
    token = _deferred.set(deferred)
    try:
        yield deferred
    finally:
        _deferred.reset(token)
