"""Crash-safe step folders: a checkpoint becomes visible only when it is complete.

Every rank writes into ``NNNNNN.tmp``; after all ranks finish, the main process
fsyncs, renames it to ``NNNNNN`` and then swaps the ``last`` symlink with an atomic
``os.replace``. The checksum manifest is written into the temporary folder just before,
so a published step folder always has one, and every file gets the mode the umask gives
(``core.layout.file_modes``). A crash at any point leaves the previous checkpoint and
``last`` intact; a stale ``.tmp`` is wiped by the next save of that step and ignored by resume.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from lerobot_kit.core.layout import paths
from lerobot_kit.core.layout.file_modes import match_umask_tree
from lerobot_kit.core.layout.files import check_complete
from lerobot_kit.core.layout.fsync import fsync_dir, fsync_tree
from lerobot_kit.core.layout.manifest import FileDigest, write_manifest
from lerobot_kit.core.layout.training_step import read_training_step


def temp_step_dir(output_dir: Path, step: int) -> Path:
    return paths.checkpoints_root(output_dir) / (paths.step_dir_name(step) + paths.TMP_SUFFIX)


def prepare_temp_dir(output_dir: Path, step: int) -> Path:
    """Main process only: an empty temporary folder for this step's checkpoint."""
    tmp = temp_step_dir(output_dir, step)
    if tmp.exists():
        shutil.rmtree(tmp)
    (tmp / paths.PRETRAINED_DIR).mkdir(parents=True)
    (tmp / paths.TRAINING_STATE_DIR).mkdir()
    return tmp


def publish(output_dir: Path, step: int, digests: Mapping[str, FileDigest] | None = None) -> Path:
    """Main process only: record the checksum manifest of the finished temporary folder,
    then make it the step folder and ``last``. ``digests``: those the writing ranks took.

    A folder that lacks a file its own ``training_step.json`` makes required (a checkpoint
    format that did not write what it reported) is refused before anything is published.
    """
    root = paths.checkpoints_root(output_dir)
    tmp = temp_step_dir(output_dir, step)
    final = root / paths.step_dir_name(step)
    check_complete(tmp, read_training_step(tmp), "nothing was published; the previous checkpoint is intact")
    match_umask_tree(tmp)  # whichever library wrote a file, colleagues read it as the umask allows
    write_manifest(tmp, digests)
    fsync_tree(tmp)
    if final.exists():
        # Re-saving a step (e.g. after a resume at that step): move the old one aside first
        # so that ``final`` never holds a mix of both.
        stale = root / (paths.step_dir_name(step) + ".old")
        if stale.exists():
            shutil.rmtree(stale)
        os.replace(final, stale)
        os.replace(tmp, final)
        shutil.rmtree(stale)
    else:
        os.replace(tmp, final)
    link_tmp = root / (paths.LAST_LINK + paths.TMP_SUFFIX)
    if link_tmp.is_symlink() or link_tmp.exists():
        link_tmp.unlink()
    link_tmp.symlink_to(final.name)
    os.replace(link_tmp, root / paths.LAST_LINK)
    fsync_dir(root)
    return final
