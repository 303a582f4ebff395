"""The plugin module named by the ``lerobot_kit`` entry point: hook implementations only.

``lerobot`` imports this module for every command, ``--help`` included, so it imports
no torch: config classes are plain pydantic, and the model, dataset generator and
checkpoint format are registered as ``"module:attribute"`` strings that are imported
only when a run actually uses them.
"""

from __future__ import annotations

from typing import Callable

from lerobot_kit.api import hookimpl
from lerobot_kit_mlp.configuration import PendulumDatasetConfig, ResidualMLPConfig

__all__ = ["PendulumDatasetConfig", "ResidualMLPConfig"]


@hookimpl
def lerobot_register_policies(register: Callable[..., None]) -> None:
    register("residual_mlp", ResidualMLPConfig, "lerobot_kit_mlp.modeling:ResidualMLPPolicy")


@hookimpl
def lerobot_register_datasets(register: Callable[..., None]) -> None:
    register("pendulum", PendulumDatasetConfig, "lerobot_kit_mlp.dataset:make_pendulum_dataset")


@hookimpl
def lerobot_register_checkpoint_formats(register: Callable[..., None]) -> None:
    register("safetensors_fp16", "lerobot_kit_mlp.format:Fp16SafetensorsFormat")
