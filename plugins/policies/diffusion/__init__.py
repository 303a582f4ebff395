"""The built-in Diffusion Policy plugin (config is torch-free; the model loads lazily)."""

from __future__ import annotations

from typing import Callable

from lerobot_kit.api import hookimpl
from lerobot_kit.plugins.policies.diffusion.configuration import DiffusionConfig


@hookimpl
def lerobot_register_policies(register: Callable[..., None]) -> None:
    register("diffusion", DiffusionConfig, "lerobot_kit.plugins.policies.diffusion.modeling:DiffusionPolicy")
