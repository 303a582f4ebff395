"""Built-in checkpoint formats: safetensors (gathered), dcp (shards), safetensors_dcp (both)."""

from __future__ import annotations

from typing import Callable

from lerobot_kit.api import hookimpl


@hookimpl
def lerobot_register_checkpoint_formats(register: Callable[..., None]) -> None:
    register("safetensors", "lerobot_kit.plugins.formats.builtin:SafetensorsFormat")
    register("dcp", "lerobot_kit.plugins.formats.builtin:DcpFormat")
    register("safetensors_dcp", "lerobot_kit.plugins.formats.builtin:SafetensorsDcpFormat")
