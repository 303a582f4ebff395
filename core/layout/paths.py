"""Every file and folder name of the checkpoint layout, in one place.

Torch-free: ``inspect-checkpoint`` and ``convert-dcp`` import this without torch.

```
checkpoints/NNNNNN/pretrained_model/{config.json, train_config.json, model.safetensors,
                                     pytorch_model_fsdp_0/, adapter_model.safetensors,
                                     adapter_config.json, dataset_meta.json,
                                     policy_{pre,post}processor*.{json,safetensors}}
checkpoints/NNNNNN/training_state/{optimizer_param_groups.json, optimizer_state.safetensors,
                                   optimizer_0/, rng_state.safetensors, scheduler_state.json,
                                   scaler_state.json, training_step.json}
checkpoints/NNNNNN/checksums.json (sha256 of every other file of the step folder)
checkpoints/last -> NNNNNN
```
"""

from __future__ import annotations

from pathlib import Path

from lerobot_kit.core.errors import CheckpointError

# Bump when a change makes older checkpoints load wrongly; readers refuse other versions.
LAYOUT_VERSION = 1

CHECKPOINTS_DIR = "checkpoints"
LAST_LINK = "last"
TMP_SUFFIX = ".tmp"

PRETRAINED_DIR = "pretrained_model"
TRAINING_STATE_DIR = "training_state"

POLICY_CONFIG = "config.json"
TRAIN_CONFIG = "train_config.json"
MODEL_WEIGHTS = "model.safetensors"
DCP_MODEL_DIR = "pytorch_model_fsdp_0"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
PREPROCESSOR = "policy_preprocessor"
POSTPROCESSOR = "policy_postprocessor"
DATASET_META = "dataset_meta.json"

OPTIMIZER_PARAM_GROUPS = "optimizer_param_groups.json"
OPTIMIZER_STATE = "optimizer_state.safetensors"
DCP_OPTIMIZER_DIR = "optimizer_0"
RNG_STATE = "rng_state.safetensors"
SCHEDULER_STATE = "scheduler_state.json"
SCALER_STATE = "scaler_state.json"
TRAINING_STEP = "training_step.json"

DCP_METADATA = ".metadata"
MANIFEST = "checksums.json"


def step_dir_name(step: int) -> str:
    return f"{step:06d}"


def is_step_dir_name(name: str) -> bool:
    return name.isdigit() and len(name) >= 6


def checkpoints_root(output_dir: Path) -> Path:
    return output_dir / CHECKPOINTS_DIR


def last_checkpoint(output_dir: Path) -> Path | None:
    """The step folder ``checkpoints/last`` points to, or None when there is none."""
    link = checkpoints_root(output_dir) / LAST_LINK
    if not link.is_symlink() and not link.exists():
        return None
    target = link.resolve()
    if not target.is_dir():
        raise CheckpointError(f"{link} points to {target}, which does not exist; the checkpoint folder is damaged")
    return target


def find_step_dir(path: Path) -> Path:
    """Accept a step folder, its ``pretrained_model/``, or a run folder (then ``last``)."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint folder")
    if path.name == PRETRAINED_DIR or path.name == TRAINING_STATE_DIR:
        return path.parent
    if (path / PRETRAINED_DIR).is_dir():
        return path
    if (path / CHECKPOINTS_DIR).is_dir():
        last = last_checkpoint(path)
        if last is not None:
            return last
    if path.name == CHECKPOINTS_DIR and (path / LAST_LINK).exists():
        return (path / LAST_LINK).resolve()
    raise CheckpointError(
        f"{path}: not a checkpoint (expected a step folder such as checkpoints/005000 holding {PRETRAINED_DIR}/)"
    )


def find_pretrained_dir(path: Path) -> Path:
    """A folder holding ``config.json``: a ``pretrained_model/`` or a step folder's."""
    path = Path(path)
    if (path / POLICY_CONFIG).is_file():
        return path
    return find_step_dir(path) / PRETRAINED_DIR
