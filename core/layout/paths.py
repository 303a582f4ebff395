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

import errno
import os
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


class DamagedLastError(CheckpointError):
    """A run's ``checkpoints/last`` that cannot be followed, or leads out of the run: the run
    folder is damaged (not a wrong path), and nothing is read through the link."""


def step_dir_name(step: int) -> str:
    return f"{step:06d}"


def is_step_dir_name(name: str) -> bool:
    return name.isdigit() and len(name) >= 6


def checkpoints_root(output_dir: Path) -> Path:
    return output_dir / CHECKPOINTS_DIR


def last_checkpoint(output_dir: Path) -> Path | None:
    """The step folder ``checkpoints/last`` points to, or None when there is none.

    ``last`` must name a step folder of this run: a link that loops, dangles or leads out
    of ``checkpoints/`` (into another run, whose steps the ``--resume_from`` rule does not
    guard) is one ``CheckpointError`` line, and nothing is read through it.
    """
    root = checkpoints_root(output_dir)
    link = root / LAST_LINK
    fix = (f"point it at a step folder of this run (ln -sfn NNNNNN {link}) or remove it (the newest complete "
           "step folder is then used)")
    if not link.is_symlink():
        if not link.exists():
            return None
        if link.is_dir():  # a copy that dereferenced the link: a step folder itself
            return link
        raise DamagedLastError(f"{link}: not a link to a step folder; {fix}")
    try:
        target = link.resolve(strict=True)
    except RuntimeError as exc:  # Python < 3.13 reports a link loop so
        raise DamagedLastError(f"{link}: a symbolic link that loops; {fix}") from exc
    except OSError as exc:
        raise DamagedLastError(f"{link} points to {os.readlink(link)}, which {_unreachable(exc)}; {fix}") from exc
    if target.parent != root.resolve() or not is_step_dir_name(target.name) or not target.is_dir():
        raise DamagedLastError(f"{link} points to {target}, which is not a step folder of {root}; {fix}")
    return target


def resumable_steps(output_dir: Path) -> dict[int, Path]:
    """Complete step folders by step: published atomically, so every ``NNNNNN`` folder is whole."""
    root = checkpoints_root(output_dir)
    if not root.is_dir():
        return {}
    return {
        int(d.name): d for d in root.iterdir()
        if is_step_dir_name(d.name) and not d.is_symlink() and (d / PRETRAINED_DIR).is_dir()
        and (d / TRAINING_STATE_DIR).is_dir()
    }


def later_steps(output_dir: Path, step: int) -> tuple[Path, ...]:
    """The complete step folders after ``step``, oldest first: those ``--resume_from=<step>`` deletes."""
    steps = resumable_steps(output_dir)
    return tuple(steps[s] for s in sorted(steps) if s > step)


def follow_last(step_dir: Path) -> Path:
    """``step_dir``, or the step folder it names when it is a run's ``checkpoints/last`` link (checked
    as ``last_checkpoint`` checks it: a path through ``last`` never leaves the run)."""
    step_dir = Path(step_dir)
    if step_dir.name == LAST_LINK and step_dir.parent.name == CHECKPOINTS_DIR and step_dir.is_symlink():
        target = last_checkpoint(step_dir.parent.parent)
        assert target is not None  # the link exists
        return target
    return step_dir


def resolves_inside(path: Path, root: Path) -> bool:
    """Whether ``path``, every symbolic link on the way followed, lies in ``root`` (or is it)."""
    try:
        return Path(path).resolve().is_relative_to(Path(root).resolve())
    except (OSError, RuntimeError):  # a link that loops
        return False


def link_target(path: Path) -> str:
    """Where ``path`` leads, its links followed, for messages."""
    try:
        return str(Path(path).resolve())
    except (OSError, RuntimeError):
        return "a link that loops"


def find_step_dir(path: Path) -> Path:
    """Accept a step folder, its ``pretrained_model/``, or a run folder (then ``last``); a path
    through a run's ``last`` is followed only into that run."""
    path = Path(path)
    if path.name == PRETRAINED_DIR or path.name == TRAINING_STATE_DIR:
        step_dir = follow_last(path.parent)
        if not path.is_dir():
            raise CheckpointError(f"{path}: no such checkpoint folder")
        return step_dir
    if path.name == CHECKPOINTS_DIR and ((path / LAST_LINK).is_symlink() or (path / LAST_LINK).exists()):
        last = last_checkpoint(path.parent)
        assert last is not None  # the link exists
        return last
    path = follow_last(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint folder")
    if (path / PRETRAINED_DIR).is_dir():
        return path
    if (path / CHECKPOINTS_DIR).is_dir():
        last = last_checkpoint(path)
        if last is not None:
            return last
    raise CheckpointError(
        f"{path}: not a checkpoint (expected a step folder such as checkpoints/005000 holding {PRETRAINED_DIR}/)"
    )


def is_policy_folder(path: Path) -> bool:
    """A folder that ``save_pretrained`` wrote outside any step folder (a copied
    ``pretrained_model/``, LeRobot's output, a Hub snapshot): it holds ``config.json`` and
    is not the ``pretrained_model/`` of a step folder, whose training state belongs with it."""
    path = Path(path)
    if not (path / POLICY_CONFIG).is_file():
        return False
    parent = path.parent
    in_step_folder = path.name == PRETRAINED_DIR and (
        (parent / TRAINING_STATE_DIR).exists() or is_step_dir_name(parent.name) or parent.name == LAST_LINK
    )
    return not in_step_folder


def find_pretrained_dir(path: Path) -> Path:
    """A folder holding ``config.json``: a ``pretrained_model/`` or a step folder's."""
    path = Path(path)
    if path.name != PRETRAINED_DIR and (path / POLICY_CONFIG).is_file():
        return path
    return find_step_dir(path) / PRETRAINED_DIR


def _unreachable(exc: OSError) -> str:
    return "does not exist" if exc.errno == errno.ENOENT else f"cannot be followed ({exc.strerror or exc})"
