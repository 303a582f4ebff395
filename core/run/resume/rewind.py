"""``--resume_from``: a run that continues from an older step than its newest drops the later ones first.

Those step folders continue the run past the resumed step along a path this run
replaces; left in place, they would be overwritten one save at a time, sit beside a
``last`` that no longer points to the newest, and be kept by retention (which keeps the
highest steps) in place of the new ones. ``last`` is first pointed at the resumed step
(atomically), so a crash at any moment leaves a ``last`` that resumes; each folder is
renamed to ``NNNNNN.deleting`` before removal, as retention does, so a half-deleted
folder never carries a step's name.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from lerobot_kit.core.checkpoint.retention import DELETING_SUFFIX
from lerobot_kit.core.layout import paths


def discard_later_steps(resume_from: Path, later: tuple[Path, ...]) -> None:
    """Main process only, before the first step."""
    root = resume_from.parent
    link_tmp = root / (paths.LAST_LINK + paths.TMP_SUFFIX)
    if link_tmp.is_symlink() or link_tmp.exists():
        link_tmp.unlink()
    link_tmp.symlink_to(resume_from.name)
    os.replace(link_tmp, root / paths.LAST_LINK)
    for folder in later:
        doomed = folder.with_name(folder.name + DELETING_SUFFIX)
        os.replace(folder, doomed)
        shutil.rmtree(doomed)
