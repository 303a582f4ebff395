"""``--keep_last_checkpoints=K``: old step folders go once a newer one is safely published.

Called by the main process right after a publish, so the folders it deletes are never
the only good checkpoint: the newest is complete and ``last`` points to it. The folder
``last`` points to is always kept, even when it is not the newest by step (a run resumed
from an older checkpoint); the K-1 highest other steps stay beside it.

A folder is first renamed to ``NNNNNN.deleting`` (atomic) and only then removed, so a
crash in the middle of a deletion never leaves a half-deleted folder under a step's
name, where a user or ``--policy.path`` could take it for a checkpoint; leftovers are
removed by the next call. Temporary folders of steps below the one just published are
removed too, whatever K: at most one save is in flight, so they belong to saves that
died (killed, or out of disk space) and would only hold their space.

A folder the file system refuses to delete (a permission, a file another program holds
open on NFS) is one warning line naming the path and errno; the run goes on, since the
new checkpoint is published, and the next call tries again.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from lerobot_kit.core.errors import os_error_line
from lerobot_kit.core.layout import paths

logger = logging.getLogger("lerobot_kit")

DELETING_SUFFIX = ".deleting"


def prune(output_dir: Path, published_step: int, keep: int) -> list[Path]:
    """Main process only. Returns the step folders deleted (those the file system let go)."""
    root = paths.checkpoints_root(output_dir)
    for entry in list(root.iterdir()):
        stale_tmp = entry.name.endswith(paths.TMP_SUFFIX) and _step(entry.name) < published_step
        if entry.name.endswith(DELETING_SUFFIX) or stale_tmp:
            shutil.rmtree(entry, ignore_errors=True)
    if keep <= 0:
        return []
    last = paths.last_checkpoint(output_dir)
    steps = sorted(
        (d for d in root.iterdir() if paths.is_step_dir_name(d.name) and not d.is_symlink() and d.is_dir()),
        key=lambda d: int(d.name),
    )
    others = [d for d in steps if last is None or d.resolve() != last.resolve()]
    kept = set(others[max(0, len(others) - (keep - 1)):])
    removed = []
    for folder in (d for d in others if d not in kept):
        try:
            doomed = folder.with_name(folder.name + DELETING_SUFFIX)
            os.replace(folder, doomed)
            shutil.rmtree(doomed)
        except OSError as exc:
            logger.warning(f"warning: the old checkpoint {folder.name} is not removed ({os_error_line(exc)}); "
                           "it stays on the disk, and the next checkpoint tries again")
            continue
        removed.append(folder)
    return removed


def _step(name: str) -> int:
    """The step of ``NNNNNN.tmp``; the other entries (``last``, ``last.tmp``) sort above every step."""
    digits = name.split(".", 1)[0]
    return int(digits) if paths.is_step_dir_name(digits) else 1 << 62
