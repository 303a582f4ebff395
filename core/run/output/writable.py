"""Whether a run can write its output folder, asked before anything is built or written.

Without this, an ``--output_dir`` that is a file, lies under a file, or sits on a
read-only mount fails minutes later (after the dataset and model are built) with an
``OSError`` traceback from whichever write comes first.
"""

from __future__ import annotations

import os
from pathlib import Path

from lerobot_kit.core.errors import ConfigError


def check_writable(output_dir: Path) -> None:
    """One ``ConfigError`` line when ``output_dir`` cannot be created or written."""
    existing = output_dir.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        where = "is an existing file" if existing == output_dir.absolute() else f"is under {existing}, a file"
        raise ConfigError(f"--output_dir={output_dir} {where}, not a folder: pass a folder path")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(
            f"--output_dir={output_dir}: {existing} is not writable (a read-only mount, or no permission): "
            "pass an --output_dir on a writable file system"
        )
