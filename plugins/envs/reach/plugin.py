"""The built-in reach environment plugin (torch-free: ``lerobot train --help`` and ``lerobot plugins`` import it)."""

from __future__ import annotations

from typing import Callable

from pydantic import Field

from lerobot_kit.api import EnvConfig, hookimpl


class ReachEnvConfig(EnvConfig):
    type: str = Field("reach", description="Evaluation environment type, from the plugin registry (`lerobot plugins`).")
    image: bool = Field(
        False, description="Also return the top-down camera (observation.images.top), for policies trained on "
        "--dataset.image=true."
    )
    image_size: int = Field(32, ge=8, description="Camera height and width in pixels (the dataset's --dataset.image_size).")
    episode_length: int = Field(100, ge=1, description="Steps before an episode is truncated (the dataset's episodes: 100).")
    success_radius: float = Field(
        0.05, gt=0, description="An episode succeeds, and ends, when the agent is this close to the target."
    )
    render_size: int = Field(128, ge=16, description="Height and width of video frames in pixels.")


@hookimpl
def lerobot_register_envs(register: Callable[..., None]) -> None:
    register("reach", ReachEnvConfig, "lerobot_kit.plugins.envs.reach.env:ReachEnv")
