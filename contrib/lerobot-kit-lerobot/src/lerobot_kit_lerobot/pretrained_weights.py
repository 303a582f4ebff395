"""Whether a policy folder's ``model.safetensors`` is the model its LeRobot ``config.json`` describes.

lerobot-kit checks a checkpoint's ``config.json`` before anything reads the folder, in the
same words for ``inspect-checkpoint``, ``--policy.path``, a resume and ``lerobot eval``:
the policy type's config validates it. A LeRobot config whose type or shapes were edited,
or that was copied beside another policy's weights, can still be a valid config of its
type (``"type": "act"`` beside π0.5's weights is a fine ACT config), and then only the
strict load of the weights tells: ``--policy.path`` refused the folder late, and
``inspect-checkpoint``, which loads nothing, called it valid.

So the bridge builds LeRobot's policy for the config on the meta device (shapes only: no
memory, no download, the backbone's pretrained weights and the VLM's left out) and
compares its state dict with the names and shapes in the file's header, as the strict load
would. The config alone fixes the model of every bridged type but π0/π0.5, whose sizes
are a bridge flag recorded in ``train_config.json``: in a folder LeRobot wrote (no
``train_config.json``) their sizes are unknown, and only the tensor names, with layer
numbers left out, are compared. A folder whose model cannot be built here (a VLA whose
tokenizer or VLM folder is elsewhere) is not judged: its loader says what is missing.
"""

from __future__ import annotations

import contextlib
import re
import sys
from pathlib import Path
from typing import Any

from lerobot_kit.api import MODEL_WEIGHTS, LerobotError
from lerobot_kit_lerobot.configuration import LerobotPolicyConfig, read_bridge_fields
from lerobot_kit_lerobot.policies import BRIDGED

Shapes = dict[str, tuple[int, ...]]
LAYER_NUMBER = re.compile(r"\.\d+(?=\.|$)")


def weights_problem(config: LerobotPolicyConfig, folder: Path) -> str | None:
    """One line on how ``folder``'s ``model.safetensors`` differs from the model ``config``
    builds; None when it is that model, or when that cannot be told here."""
    stored = stored_shapes(Path(folder) / MODEL_WEIGHTS)
    if stored is None:
        return None
    try:
        built = built_shapes(config, Path(folder))
    except LerobotError:
        return None
    if config.lerobot_type in ("pi0", "pi05") and "sizes" not in read_bridge_fields(Path(folder)):
        differences = name_differences(without_layer_numbers(built), without_layer_numbers(stored))
    else:
        differences = name_differences(built, stored) or shape_differences(built, stored)
    if not differences:
        return None
    more = f" (and {len(differences) - 1} more)" if len(differences) > 1 else ""
    return (
        f"{MODEL_WEIGHTS} is not the LeRobot {config.lerobot_type!r} policy this config describes: "
        f"{differences[0]}{more} (the config or the weights were replaced: edited, or copied from another "
        "checkpoint)"
    )


def stored_shapes(weights: Path) -> Shapes | None:
    """Tensor name -> shape from the file's header; None without a readable file (the
    checkpoint's own checks name a damaged one)."""
    if not weights.is_file():
        return None
    from safetensors import safe_open

    try:
        with safe_open(str(weights), framework="pt") as opened:
            return {name: tuple(opened.get_slice(name).get_shape()) for name in opened.keys()}
    except Exception:  # noqa: BLE001 - any unreadable header is the layout checks' to report
        return None


def built_shapes(config: LerobotPolicyConfig, folder: Path) -> Shapes:
    """The state dict's shapes of LeRobot's policy for ``config`` and the features its
    ``config.json`` records, built on the meta device as the bridge builds it."""
    import draccus
    import torch
    from lerobot.configs.types import PolicyFeature

    from lerobot_kit_lerobot import modeling
    from lerobot_kit_lerobot.configuration import read_lerobot_config
    from lerobot_kit_lerobot.lerobot_config import to_lerobot_config

    saved = read_lerobot_config(folder)
    without_vlm_weights = {"load_vlm_weights": False} if "load_vlm_weights" in config.lerobot_fields else {}
    config = config.model_copy(update=without_vlm_weights)
    lerobot_config = to_lerobot_config(config)
    for side in ("input_features", "output_features"):
        setattr(lerobot_config, side, draccus.decode(dict[str, PolicyFeature], saved.get(side) or {}))
    if getattr(lerobot_config, "pretrained_backbone_weights", None) is not None:
        lerobot_config.pretrained_backbone_weights = None  # the same shapes, nothing to fetch
    policy_class = getattr(modeling, BRIDGED[config.lerobot_type])
    # LeRobot's constructors print progress; the caller's stdout may be inspect-checkpoint's --json.
    with policy_class.building(config), torch.device("meta"), contextlib.redirect_stdout(sys.stderr):
        policy = modeling.build_lerobot_policy(lerobot_config, on_meta=True)
    return {name: tuple(tensor.shape) for name, tensor in policy.state_dict().items()}


def without_layer_numbers(shapes: Shapes) -> Shapes:
    return {LAYER_NUMBER.sub(".N", name): () for name in shapes}


def name_differences(built: dict[str, Any], stored: dict[str, Any]) -> list[str]:
    missing, unexpected = sorted(built.keys() - stored.keys()), sorted(stored.keys() - built.keys())
    return [f"it lacks {name!r}" for name in missing] + [f"it holds {name!r}, not in that model" for name in unexpected]


def shape_differences(built: Shapes, stored: Shapes) -> list[str]:
    return [
        f"{name!r} has shape {list(stored[name])}, and the config builds {list(built[name])}"
        for name in sorted(built.keys() & stored.keys())
        if tuple(stored[name]) != tuple(built[name])
    ]
