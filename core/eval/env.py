"""The evaluation environment contract: gymnasium's vector API, keyed like the dataset.

A ``VectorEnv`` steps ``num_envs`` copies of one task together, so a batch of episodes
costs one policy call per step. It follows gymnasium's conventions — ``reset(seed=…)``
returns ``(observation, info)``, ``step(action)`` returns ``(observation, reward,
terminated, truncated, info)``, ``info["is_success"]`` says whether the task is solved —
with two choices of our own:

* observations are a dict keyed by the *dataset's* feature names (``observation.state``
  float32 ``[n, *shape]``, ``observation.images.<cam>`` uint8 ``[n, 3, H, W]``, as the
  dataset stores frames), so a policy trained on the task's data reads them unchanged
  through its own preprocessor, and ``features`` describes them in the dataset's terms;
* no auto-reset: an episode that ended keeps being stepped (its results are masked by
  the rollout), because every episode of a batch must start from the seed it was
  assigned, which an auto-reset would draw anew.

``render`` (rgb frames for videos) and ``expert_action`` (a scripted baseline) are
optional. Torch-free: an environment is numpy, the policy side converts.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from lerobot_kit.core.data.dataset import FeatureSpec
from lerobot_kit.core.registry.contracts import contract

Observation = dict[str, np.ndarray]
Info = dict[str, Any]


@contract
class VectorEnv(ABC):
    """``num_envs`` environments stepped together; subclasses set the four attributes below.

    ``info`` maps names to arrays over the environments: ``is_success`` (bool ``[n]``) is
    required; ``position`` and ``goal`` (float ``[n, 2]``) are optional and, when given,
    are what the rollout plot draws.
    """

    num_envs: int
    fps: int  # frames per second of the task (videos play at this rate)
    max_episode_steps: int  # the step at which an episode is truncated
    features: dict[str, FeatureSpec]  # every observation key it returns, plus "action" (what step takes)

    @abstractmethod
    def reset(self, seed: list[int]) -> tuple[Observation, Info]:
        """Start one episode per environment, environment ``i`` from ``seed[i]`` (deterministic)."""

    @abstractmethod
    def step(self, action: np.ndarray) -> tuple[Observation, np.ndarray, np.ndarray, np.ndarray, Info]:
        """Apply ``action`` ``[n, action_dim]``; ``(observation, reward [n], terminated [n], truncated [n], info)``."""

    def render(self) -> np.ndarray | None:
        """The current frame of every environment, uint8 ``[n, H, W, 3]``; None when it cannot render."""
        return None

    def expert_action(self) -> np.ndarray | None:
        """A scripted expert's action for the current state, ``[n, action_dim]``; None when there is no expert."""
        return None

    def close(self) -> None:
        """Release what the environment holds (simulators, windows)."""
