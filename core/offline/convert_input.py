"""What ``convert-dcp`` is given, checked before torch is imported.

The conversion rewrites ``checksums.json`` from the files it finds, so it does not run
past a checkpoint holding something no reader opens (a named pipe, a device, a folder
where a file should be) or a file the system will not read: each is refused in the line
``inspect-checkpoint`` and the loaders name it with. The command calls this first, so such
a checkpoint is refused in the time a torch-free check takes. Torch-free.
"""

from __future__ import annotations

from pathlib import Path

from lerobot_kit.core.errors import CheckpointError
from lerobot_kit.core.layout.paths import (
    ADAPTER_WEIGHTS,
    DCP_MODEL_DIR,
    MODEL_WEIGHTS,
    PRETRAINED_DIR,
    TRAINING_STATE_DIR,
    find_step_dir,
)
from lerobot_kit.core.layout.validate import (
    NOT_A_FILE,
    UNREADABLE,
    check_pretrained_folder,
    check_step_folder,
    refuse,
)


def resolve_pretrained_dir(checkpoint_dir: Path) -> Path:
    """A step folder, its ``pretrained_model/``, or a run folder (its ``last`` step)."""
    checkpoint_dir = Path(checkpoint_dir)
    if not checkpoint_dir.exists():
        raise CheckpointError(f"{checkpoint_dir}: no such checkpoint folder")
    if (checkpoint_dir / DCP_MODEL_DIR).is_dir() or checkpoint_dir.name == PRETRAINED_DIR:
        return checkpoint_dir
    return find_step_dir(checkpoint_dir) / PRETRAINED_DIR


def check_convertible(checkpoint_dir: Path, overwrite: bool) -> Path:
    """The ``pretrained_model/`` to convert, once no entry of its checkpoint is something other than
    a file or folder, and no file the conversion reads is unreadable; the weights file ``overwrite``
    replaces may be anything. Else one ``CheckpointError`` line."""
    pretrained = resolve_pretrained_dir(checkpoint_dir)
    if pretrained.name == PRETRAINED_DIR and (pretrained.parent / TRAINING_STATE_DIR).is_dir():
        checked = check_step_folder(pretrained.parent)
    else:
        checked = check_pretrained_folder(pretrained)
    replaced = {f"{checked.pretrained}/{name}" for name in (MODEL_WEIGHTS, ADAPTER_WEIGHTS)} if overwrite else set()
    # Not a file anywhere: checksums.json would lose it. Unreadable: where the conversion reads.
    stops = [p for p in checked.problems if p.file not in replaced and (
        p.cause == NOT_A_FILE or (p.cause == UNREADABLE and checked.blocks_loading(p)))]
    refuse(checked.root, stops, "nothing was converted: convert an earlier step folder of the run")
    return pretrained
