"""The ``pendulum`` dataset: a torque-driven pendulum steered to a target angle.

Generated with numpy from ``generation_seed`` in milliseconds, so the plugin trains out
of the box. The expert is a saturated PD controller with gravity compensation,

    torque = clip(KP (target - theta) - KD theta_dot + (g/l) sin(theta), -MAX_TORQUE, MAX_TORQUE)

and the pendulum integrates ``theta_ddot = -(g/l) sin(theta) - DAMPING theta_dot + torque``
(semi-implicit Euler at FPS). Plant and expert are deterministic, so the whole future
action chunk is a function of the state ``[theta, theta_dot, target]``: a policy can
drive its loss far down, which makes a broken training setup easy to see.

A dataset plugin that holds its frames in memory only needs to produce per-frame arrays
and hand them to ``InMemoryDataset``, which stacks the offsets the policy asked for
(``delta_indices``), pads at episode ends and flags the padding.
"""

from __future__ import annotations

import numpy as np

from lerobot_kit.api import ACTION_KEY, STATE_KEY, DatasetMeta, FeatureSpec, InMemoryDataset, compute_stats
from lerobot_kit_mlp.configuration import PendulumDatasetConfig

FPS = 20
GRAVITY = 9.81  # g / l, 1/s^2
DAMPING = 0.1  # 1/s
KP, KD = 20.0, 6.0  # natural frequency ~4.5 rad/s, damping ratio ~0.7
MAX_TORQUE = 12.0  # below KP * the largest initial error, so the expert saturates early on
STATE_NAMES = ["theta", "theta_dot", "target"]
ACTION_NAMES = ["torque"]


def make_pendulum_dataset(config: PendulumDatasetConfig, delta_indices: dict[str, list[int]]) -> InMemoryDataset:
    """The dataset factory registered as ``pendulum``: ``factory(config, delta_indices)``."""
    states, actions = rollout(config.num_episodes, config.episode_length, config.generation_seed)
    frames = {STATE_KEY: states, ACTION_KEY: actions}
    features = {
        STATE_KEY: FeatureSpec("float32", (len(STATE_NAMES),), STATE_NAMES),
        ACTION_KEY: FeatureSpec("float32", (len(ACTION_NAMES),), ACTION_NAMES),
    }
    meta = DatasetMeta(
        features=features,
        stats=compute_stats(frames, features),  # what the policy's (un)normaliser uses
        fps=FPS,
        num_episodes=config.num_episodes,
        num_frames=len(states),
    )
    episode_index = np.repeat(np.arange(config.num_episodes), config.episode_length)
    return InMemoryDataset(meta, frames, episode_index, delta_indices)


def expert_torque(theta: np.ndarray, theta_dot: np.ndarray, target: np.ndarray) -> np.ndarray:
    command = KP * (target - theta) - KD * theta_dot + GRAVITY * np.sin(theta)
    return np.clip(command, -MAX_TORQUE, MAX_TORQUE)


def rollout(num_episodes: int, length: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Run the expert on all episodes at once; frame-major float32 states [N, 3] and actions [N, 1]."""
    rng = np.random.default_rng(seed)
    theta = rng.uniform(-1.2, 1.2, num_episodes)
    theta_dot = rng.uniform(-1.0, 1.0, num_episodes)
    target = rng.uniform(-0.8, 0.8, num_episodes)
    dt = 1.0 / FPS
    states = np.empty((num_episodes, length, len(STATE_NAMES)))
    actions = np.empty((num_episodes, length, len(ACTION_NAMES)))
    for t in range(length):
        torque = expert_torque(theta, theta_dot, target)
        states[:, t] = np.stack([theta, theta_dot, target], axis=1)
        actions[:, t, 0] = torque
        theta_dot = theta_dot + dt * (-GRAVITY * np.sin(theta) - DAMPING * theta_dot + torque)
        theta = theta + dt * theta_dot
    flat = (num_episodes * length, -1)
    return states.reshape(flat).astype(np.float32), actions.reshape(flat).astype(np.float32)
