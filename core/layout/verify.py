"""A checkpoint's files checked against its manifest before they are loaded.

Resume checks the whole step folder, ``--policy.path`` the ``pretrained_model/`` it
reads; a file that changed since the save stops the load with one line naming it. Step
folders saved before manifests existed still load, after one notice. Torch-free.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from lerobot_kit.core.errors import CheckpointError
from lerobot_kit.core.layout.file_access import CheckpointAccessError
from lerobot_kit.core.layout.manifest import MANIFEST, has_manifest, manifest_findings, read_manifest
from lerobot_kit.core.layout.paths import PRETRAINED_DIR, TRAINING_STATE_DIR, TRAINING_STEP

logger = logging.getLogger("lerobot_kit")


def damage(step_dir: Path, only: Iterable[str] | None, advice: str, skip: Iterable[str] = ()) -> str | None:
    """The one-line error for files of ``step_dir`` (``only`` those, none under ``skip``:
    files the load does not read) that differ from its manifest, or None when they match
    or there is no manifest (then logs one notice).

    A file the system refuses to read is named with its errno and fix, not as damage, and
    ``advice`` (what to do about a damaged checkpoint) is not given for it."""
    step_dir = Path(step_dir)
    if not has_manifest(step_dir):
        logger.warning(f"{step_dir}: no {MANIFEST} (saved before checksums were recorded); its files load unverified")
        return None
    try:
        skipped = tuple(skip)
        if skipped:
            only = [rel for rel in (only or read_manifest(step_dir)) if not _under(rel, skipped)]
        findings = manifest_findings(step_dir, only)
    except CheckpointAccessError as exc:
        return str(exc)
    except CheckpointError as exc:
        return f"{exc}; the checkpoint is damaged: {advice}"
    if not findings:
        return None
    unreadable = [finding for finding in findings if finding.unreadable]
    if unreadable:
        return unreadable[0].line + _more(len(unreadable), "more unreadable files")
    return f"{findings[0].line}{_more(len(findings), 'more files')}; the checkpoint is damaged: {advice}"


def check_pretrained(pretrained_dir: Path) -> None:
    """Before ``--policy.path`` (or ``load_pretrained``) reads a checkpoint's ``pretrained_model/``:
    its files against ``../checksums.json``. A folder outside a step folder (``save_pretrained``'s)
    has no manifest to check and is read as it is."""
    pretrained_dir = Path(pretrained_dir)
    step_dir = pretrained_dir.parent
    if pretrained_dir.name != PRETRAINED_DIR or not (step_dir / TRAINING_STATE_DIR / TRAINING_STEP).is_file():
        return
    problem = damage(step_dir, [PRETRAINED_DIR], "load an earlier step folder of the run")
    if problem is not None:
        raise CheckpointError(problem)


def _more(count: int, what: str) -> str:
    return f" (and {count - 1} {what})" if count > 1 else ""


def _under(rel: str, folders_or_files: tuple[str, ...]) -> bool:
    return any(rel == f or rel.startswith(f + "/") for f in folders_or_files)
