"""Digests for a save's manifest, taken by the ranks that wrote the files.

In a sharded save every rank writes its own DCP shard files (``__<rank>_<n>.distcp``, as
torch's ``FileSystemWriter`` names them). Each rank hashes those, just written and still
in its page cache, and the main process gathers the digests: the cost of the manifest is
spread like the writes, and the main process hashes only the rest (gathered weights,
JSON, ``.metadata``). A file no rank claims is hashed by the main process too, so the
manifest is complete whatever the naming.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lerobot_kit.core.layout.manifest import FileDigest, hash_files

SHARD_SUFFIX = ".distcp"


def own_shard_digests(step_dir: Path, rank: int) -> dict[str, FileDigest]:
    """Digests of the DCP shard files rank ``rank`` wrote under ``step_dir``, keyed relative to it."""
    step_dir = Path(step_dir)
    own = [path for path in sorted(step_dir.rglob(f"__{rank}_*{SHARD_SUFFIX}")) if path.is_file()]
    return hash_files(step_dir, [path.relative_to(step_dir).as_posix() for path in own])


def gather_shard_digests(step_dir: Path, *, distributed: bool, group: Any = None) -> dict[str, FileDigest]:
    """Collective over ``group`` when ``distributed``: every rank's own shard digests, on every rank."""
    if not distributed:
        return own_shard_digests(step_dir, 0)
    import torch.distributed as dist

    mine = own_shard_digests(step_dir, dist.get_rank(group))
    everyone: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    return {rel: digest for part in everyone for rel, digest in part.items()}
