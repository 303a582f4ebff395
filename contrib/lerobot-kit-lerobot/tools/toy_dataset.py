"""A small LeRobot v3.0 video dataset, written by LeRobot's own ``LeRobotDataset`` writer
(the most faithful way to get a dataset exactly as LeRobot records one), for the bridge's
tests and its benchmark. No download: the frames are generated.

The action is a fixed linear map of the state plus the camera's mean brightness, so a
policy can learn it from both inputs, and a falling loss means it is learning. Episodes
take their task text in turn from ``TASKS`` (LeRobot's ``meta/tasks.parquet``), for the
language-conditioned policies.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

STATE_DIM = ACTION_DIM = 3
TASKS = ("reach the target", "reach the target slowly")


def make_dataset(root: Path, repo_id: str, *, episodes: int, length: int, image_hw: tuple[int, int] | None,
                 fps: int = 10, env_state_dim: int = 0, cameras: tuple[str, ...] = ("top",)) -> Path:
    """The dataset; ``image_hw=None`` leaves the cameras out (a dataset the VLAs must refuse);
    ``env_state_dim`` adds an ``observation.environment_state`` of that width (PushT's layout: its keypoints);
    ``cameras`` names the cameras (``observation.images.<name>``), each seeing the same scene."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    features = {
        "observation.state": {"dtype": "float32", "shape": (STATE_DIM,), "names": ["x", "y", "z"]},
        "action": {"dtype": "float32", "shape": (ACTION_DIM,), "names": ["dx", "dy", "dz"]},
    }
    if env_state_dim:
        features["observation.environment_state"] = {"dtype": "float32", "shape": (env_state_dim,), "names": None}
    for camera in cameras if image_hw is not None else ():
        features[f"observation.images.{camera}"] = {
            "dtype": "video", "shape": (*image_hw, 3), "names": ["height", "width", "channels"],
        }
    dataset = LeRobotDataset.create(repo_id, fps, features, root=root, robot_type="toy", use_videos=True)
    rng = np.random.default_rng(0)
    mix = rng.normal(size=(STATE_DIM, ACTION_DIM)).astype(np.float32)
    for episode in range(episodes):
        state = rng.uniform(-1, 1, STATE_DIM).astype(np.float32)
        for _ in range(length):
            brightness = (state[0] + 1) / 2
            action = (state @ mix + brightness).astype(np.float32)
            frame = {"observation.state": state, "action": action, "task": TASKS[episode % len(TASKS)]}
            if env_state_dim:
                frame["observation.environment_state"] = np.resize(state, env_state_dim)
            shade = rng.integers(0, 255)
            if image_hw is not None:
                image = np.full((*image_hw, 3), int(40 + 170 * brightness), dtype=np.uint8)
                image[: image_hw[0] // 2, :, 1] = shade
                frame.update({f"observation.images.{camera}": image for camera in cameras})
            dataset.add_frame(frame)
            state = np.clip(state + 0.1 * np.tanh(action), -1, 1).astype(np.float32)
        dataset.save_episode()
    dataset.finalize()
    return root
