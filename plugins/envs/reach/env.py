"""The reach task, closed loop: the policy's commands move the agent.

Everything physical comes from the dataset module (``plugins.datasets.reach.data``): the
dynamics (``move``), the camera (``render``), the expert (``expert_action``), the state
layout and the start distribution. Episode ``seed`` draws its start exactly as the
dataset draws episode 0 of ``--dataset.generation_seed=seed``, so the expert driving this
environment reproduces that generated episode frame for frame (a test checks it): the
environment is the dataset's simulator, not a look-alike.

Reward is minus the distance to the target (the dense reward of gymnasium-robotics' reach
tasks): ``max_reward`` is minus the closest the agent came, and ``sum_reward`` also counts
how long it took, since an episode terminates, successfully, once the agent is within
``success_radius`` of the target (nothing more is lost after that). Episodes are
truncated after ``episode_length`` steps.
"""

from __future__ import annotations

import numpy as np

from lerobot_kit.api import ACTION_KEY, STATE_KEY, FeatureSpec, Info, Observation, VectorEnv
from lerobot_kit.plugins.datasets.reach.data import (
    ACTION_NAMES,
    FPS,
    IMAGE_KEY,
    STATE_NAMES,
    expert_action,
    move,
    render,
)
from lerobot_kit.plugins.envs.reach.plugin import ReachEnvConfig


class ReachEnv(VectorEnv):
    def __init__(self, config: ReachEnvConfig, num_envs: int) -> None:
        self.config = config
        self.num_envs = num_envs
        self.fps = FPS
        self.max_episode_steps = config.episode_length
        self.features = {
            STATE_KEY: FeatureSpec("float32", (len(STATE_NAMES),), STATE_NAMES),
            ACTION_KEY: FeatureSpec("float32", (len(ACTION_NAMES),), ACTION_NAMES),
        }
        if config.image:
            size = config.image_size
            self.features[IMAGE_KEY] = FeatureSpec("image", (3, size, size), ["channels", "height", "width"])
        zeros = np.zeros((num_envs, 2))
        self.pos, self.target, self.prev = zeros, zeros.copy(), zeros.copy()
        self.t = 0

    def reset(self, seed: list[int]) -> tuple[Observation, Info]:
        if len(seed) != self.num_envs:
            raise ValueError(f"reset needs one seed per environment ({self.num_envs}), got {len(seed)}")
        starts = []
        for s in seed:
            rng = np.random.default_rng(s)  # the dataset's draw order: agent, then target
            starts.append((rng.uniform(-1.0, 1.0, size=2), rng.uniform(-0.8, 0.8, size=2)))
        self.pos = np.stack([p for p, _ in starts])
        self.target = np.stack([g for _, g in starts])
        self.prev = np.zeros((self.num_envs, 2))
        self.t = 0
        return self._observation(), self._info()

    def step(self, action: np.ndarray) -> tuple[Observation, np.ndarray, np.ndarray, np.ndarray, Info]:
        action = np.asarray(action, dtype=np.float64).reshape(self.num_envs, len(ACTION_NAMES))
        self.pos = move(self.pos, action)
        self.prev = action
        self.t += 1
        distance = self._distance()
        reward = -distance
        terminated = distance < self.config.success_radius
        truncated = np.full(self.num_envs, self.t >= self.max_episode_steps)
        return self._observation(), reward, terminated, truncated, self._info()

    def render(self) -> np.ndarray:
        return render(self.pos, self.target, self.config.render_size).transpose(0, 2, 3, 1)

    def expert_action(self) -> np.ndarray:
        return expert_action(self.pos, self.target, self.prev)

    def _distance(self) -> np.ndarray:
        return np.linalg.norm(self.target - self.pos, axis=1)

    def _observation(self) -> Observation:
        state = np.concatenate([self.pos, self.target, self.prev], axis=1).astype(np.float32)
        observation = {STATE_KEY: state}
        if self.config.image:
            observation[IMAGE_KEY] = render(self.pos, self.target, self.config.image_size)
        return observation

    def _info(self) -> Info:
        return {
            "is_success": self._distance() < self.config.success_radius,
            "position": self.pos.copy(),
            "goal": self.target.copy(),
        }
