"""The built-in ACT policy plugin (config is torch-free; the model loads lazily)."""

from __future__ import annotations

from typing import Callable

from lerobot_kit.api import hookimpl
from lerobot_kit.plugins.policies.act.configuration import ACTConfig


@hookimpl
def lerobot_register_policies(register: Callable[..., None]) -> None:
    register("act", ACTConfig, "lerobot_kit.plugins.policies.act.modeling:ACTPolicy")
