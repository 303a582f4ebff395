"""The embedded default dataset: a 2-D point reaching a target, driven by a scripted expert.

Generated with numpy from ``generation_seed`` (no download, a few milliseconds), so
``lerobot train`` works on a fresh machine and tests train on real, learnable data.

The expert is a speed-limited proportional controller with first-order smoothing:
``a_t = 0.7 a_{t-1} + 0.3 clip(gain (target - p_t))``; the agent integrates it,
``p_{t+1} = p_t + a_t / fps``. The state carries the previous command, so both the
next action and the whole future chunk are deterministic functions of the state — a
policy can drive its loss far down, which makes training regressions visible.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from lerobot_kit.api import (
    ACTION_KEY,
    IMAGE_PREFIX,
    STATE_KEY,
    DatasetMeta,
    FeatureSpec,
    InMemoryDataset,
    compute_stats,
)

if TYPE_CHECKING:
    from lerobot_kit.plugins.datasets.reach.plugin import ReachDatasetConfig

FPS = 10
GAIN = 0.8  # proportional gain of the expert, 1/s
MAX_SPEED = 0.3  # arena units per second: most of an episode is motion, not idling
SMOOTHING = 0.7  # weight of the previous command
BLOB_SIGMA = 0.12  # rendered blob radius, arena units
AGENT_RGB = np.array([0.2, 0.6, 1.0])
TARGET_RGB = np.array([1.0, 0.3, 0.2])
IMAGE_KEY = IMAGE_PREFIX + "top"
STATE_NAMES = ["agent_x", "agent_y", "target_x", "target_y", "agent_vx", "agent_vy"]
ACTION_NAMES = ["vx", "vy"]
_RENDER_CHUNK = 1024  # frames rendered at once: bounds memory for large images


def make_reach_dataset(config: ReachDatasetConfig, delta_indices: dict[str, list[int]]) -> InMemoryDataset:
    """Build the reach dataset; stats cover every generated frame."""
    states, actions = _rollout(config.num_episodes, config.episode_length, config.generation_seed)
    frames: dict[str, np.ndarray] = {STATE_KEY: states, ACTION_KEY: actions}
    features = {
        STATE_KEY: FeatureSpec("float32", (len(STATE_NAMES),), STATE_NAMES),
        ACTION_KEY: FeatureSpec("float32", (len(ACTION_NAMES),), ACTION_NAMES),
    }
    if config.image:
        size = config.image_size
        frames[IMAGE_KEY] = render(states[:, 0:2], states[:, 2:4], size)
        features[IMAGE_KEY] = FeatureSpec("image", (3, size, size), ["channels", "height", "width"])
    meta = DatasetMeta(
        features=features,
        stats=compute_stats(frames, features),
        fps=FPS,
        num_episodes=config.num_episodes,
        num_frames=len(states),
    )
    episode_index = np.repeat(np.arange(config.num_episodes), config.episode_length)
    return InMemoryDataset(meta, frames, episode_index, delta_indices)


def _rollout(num_episodes: int, length: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Run the expert on all episodes at once; returns frame-major states and actions."""
    rng = np.random.default_rng(seed)
    pos = rng.uniform(-1.0, 1.0, size=(num_episodes, 2))
    target = rng.uniform(-0.8, 0.8, size=(num_episodes, 2))
    prev = np.zeros((num_episodes, 2))
    states = np.empty((num_episodes, length, len(STATE_NAMES)))
    actions = np.empty((num_episodes, length, len(ACTION_NAMES)))
    for t in range(length):
        states[:, t] = np.concatenate([pos, target, prev], axis=1)
        action = expert_action(pos, target, prev)
        actions[:, t] = action
        pos = move(pos, action)
        prev = action
    flat = (num_episodes * length, -1)
    return states.reshape(flat).astype(np.float32), actions.reshape(flat).astype(np.float32)


def expert_action(pos: np.ndarray, target: np.ndarray, prev: np.ndarray) -> np.ndarray:
    """The expert's next command [n,2] for agents at ``pos`` whose last command was ``prev``.

    Public because the reach environment (``plugins.envs.reach``) drives the same expert,
    so its baseline is the policy's teacher, not a look-alike.
    """
    command = GAIN * (target - pos)
    speed = np.linalg.norm(command, axis=1, keepdims=True)
    command *= np.minimum(1.0, MAX_SPEED / np.maximum(speed, 1e-12))
    return SMOOTHING * prev + (1.0 - SMOOTHING) * command


def move(pos: np.ndarray, action: np.ndarray) -> np.ndarray:
    """The dynamics: one frame of the commanded velocity (shared with the environment)."""
    return pos + action / FPS


def render(agent: np.ndarray, target: np.ndarray, size: int) -> np.ndarray:
    """Top-down uint8 images [N,3,size,size]: Gaussian blobs, +y up, arena [-1,1]^2."""
    xs = np.linspace(-1.0, 1.0, size)
    ys = xs[::-1]
    out = np.empty((len(agent), 3, size, size), dtype=np.uint8)
    for lo in range(0, len(agent), _RENDER_CHUNK):
        hi = lo + _RENDER_CHUNK
        image = _blob(agent[lo:hi], xs, ys)[:, None] * AGENT_RGB[None, :, None, None]
        image += _blob(target[lo:hi], xs, ys)[:, None] * TARGET_RGB[None, :, None, None]
        out[lo:hi] = np.round(np.clip(image, 0.0, 1.0) * 255.0).astype(np.uint8)
    return out


def _blob(centres: np.ndarray, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Separable Gaussian: [n, size, size] with peak 1 at each centre."""
    scale = -0.5 / BLOB_SIGMA**2
    across = np.exp(scale * (xs[None, :] - centres[:, 0:1]) ** 2)
    down = np.exp(scale * (ys[None, :] - centres[:, 1:2]) ** 2)
    return down[:, :, None] * across[:, None, :]
