"""What to do about a checkpoint's ``config.json`` that its policy type refuses, and about a
``train_config.json`` that LeRobot's ``lerobot-train`` wrote.

Usually the file is damaged, or a newer or older lerobot-kit wrote it. But a LeRobot user's
first command is often ``--policy.path=<a folder lerobot-train wrote>``: LeRobot's
``config.json`` names the same types (``act``, ``diffusion``) with LeRobot's fields, so
without the LeRobot bridge, whose types claim such files, lerobot-kit's own type refuses
it field by field. Nothing is damaged then; the bridge is missing, and the error says so.
LeRobot's configs are told apart by the features they record, which lerobot-kit's do not.
Likewise ``--config_path`` (with or without ``--resume``) given LeRobot's own run config
would fail on each of its few dozen LeRobot fields; it is one line that says what to do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lerobot_kit.core.layout.paths import POLICY_CONFIG

# Fields every train_config.json of LeRobot's lerobot-train holds, and lerobot-kit's never.
_LEROBOT_TRAIN_FIELDS = frozenset({"wandb", "use_policy_training_preset"})

DAMAGED = "the checkpoint is damaged or was written by another version"


def written_by_lerobot(saved: Any) -> bool:
    return isinstance(saved, dict) and "input_features" in saved and "output_features" in saved


def lerobot_config_advice(saved: Any) -> str | None:
    """What to do with a ``config.json`` that LeRobot wrote, refused by the type it names; else None.
    With the bridge installed its type claims the file, but only for training from it."""
    if not written_by_lerobot(saved):
        return None
    from lerobot_kit.core.registry.registry import get_registry

    claimed = get_registry().claiming_policy_type(saved)
    if claimed:
        return (
            f"LeRobot wrote it, and lerobot-kit reads it as {claimed} only to train from it (--policy.path): "
            "load it with LeRobot's from_pretrained, or evaluate it with LeRobot's lerobot-eval"
        )
    return (
        "LeRobot wrote it (it records input_features and output_features): install the LeRobot bridge "
        "(lerobot-kit-lerobot, in contrib/ of lerobot-kit's source; Python >= 3.12) to read it as "
        f"--policy.type=lerobot_{saved.get('type')}"
    )


def refused_config_advice(saved: Any) -> str:
    """The end of the one line that refuses ``saved`` (a parsed ``config.json``)."""
    return lerobot_config_advice(saved) or DAMAGED


def lerobot_train_config_advice(path: Path, raw: dict[str, Any]) -> str | None:
    """For a ``--config_path`` file that LeRobot's ``lerobot-train`` wrote, what to do instead."""
    if not _LEROBOT_TRAIN_FIELDS <= raw.keys():
        return None
    beside = path.parent if (path.parent / POLICY_CONFIG).is_file() else "<its pretrained_model/>"
    return (
        f"a train_config.json that LeRobot's lerobot-train wrote: lerobot-kit neither reads LeRobot's settings nor "
        f"resumes LeRobot's runs (its training state is LeRobot's layout); start from its weights with "
        f"--policy.path={beside} and give the settings as flags (docs/configuration.md: Coming from lerobot-train)"
    )
