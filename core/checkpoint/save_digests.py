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

from lerobot_kit.core.distributed.process_group import DistContext, all_gather_objects
from lerobot_kit.core.layout.manifest import FileDigest, hash_files

SHARD_SUFFIX = ".distcp"


def own_shard_digests(step_dir: Path, rank: int) -> dict[str, FileDigest]:
    """Digests of the DCP shard files rank ``rank`` wrote under ``step_dir``, keyed relative to it."""
    step_dir = Path(step_dir)
    own = [path for path in sorted(step_dir.rglob(f"__{rank}_*{SHARD_SUFFIX}")) if path.is_file()]
    return hash_files(step_dir, [path.relative_to(step_dir).as_posix() for path in own])


def gather_digests(ctx: DistContext, mine: dict[str, FileDigest], group: Any = None) -> dict[str, FileDigest]:
    """Collective over ``group`` (spanning every rank; default: all ranks): every rank's own
    shard digests (``own_shard_digests``), merged, on every rank."""
    return {rel: digest for part in all_gather_objects(ctx, mine, group) for rel, digest in part.items()}
