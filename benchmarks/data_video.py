"""LeRobot v3.0 video datasets for the data benchmarks, and LeRobot's own reader as a reference.

The datasets are written by the tests' factory (``tests/lerobot_dataset_factory.py``)
with LeRobot's recorder settings: one 480×640 camera, SVT-AV1 at GOP 2, crf 30, preset
12, 4:2:0 (``codec="av1"``), 200-frame episodes in one data file and one video file, as
LeRobot packs them. Frames are rendered and encoded a few at a time, so writing an
8k-frame dataset needs no more memory than a 2k one. A dataset is written once per work
folder and reused by every data benchmark.

LeRobot's ``LeRobotDataset`` (PyAV backend) is measured side by side when a Python with
LeRobot installed is found (``$LEROBOT_PYTHON``, else ``/root/lerobot-venv/bin/python``);
the main environment never imports LeRobot.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from _common import REPO, Context

NAME = "data_video"
EPISODE_FRAMES = 200
SHAPE = (480, 640)
FPS = 30
REPO_ID = "bench/video"
LEROBOT_PYTHON = os.environ.get("LEROBOT_PYTHON", "/root/lerobot-venv/bin/python")


def video_dataset(ctx: Context, frames: int) -> Path:
    """The folder of a ``frames``-frame dataset (smoke: toy sizes), written on first use."""
    episode = ctx.pick(25, EPISODE_FRAMES)
    shape = ctx.pick((48, 64), SHAPE)
    root = ctx.workdir / NAME / f"frames{frames}_{shape[0]}x{shape[1]}"
    if (root / "meta/info.json").is_file():
        return root
    sys.path.insert(0, str(REPO / "tests"))
    from lerobot_dataset_factory import write_lerobot_dataset

    folder = ctx.folder(NAME, root.name)
    os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1's banner and per-file settings: errors only
    write_lerobot_dataset(folder, [episode] * (frames // episode), video=True, image_shape=shape, codec="av1",
                          fps=FPS, keep_cameras=False)
    return folder


def lerobot_python() -> str | None:
    """A Python that imports LeRobot, or None."""
    return LEROBOT_PYTHON if Path(LEROBOT_PYTHON).is_file() else None


# Run by LeRobot's Python: open the dataset, serve the given items, report memory and a
# digest of each item's camera frame (as uint8), to compare the items with ours.
LEROBOT_PROBE = """
import hashlib, json, sys, torch
from lerobot.datasets.lerobot_dataset import LeRobotDataset
root, indices, chunk = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
base = rss("VmRSS:")
dataset = LeRobotDataset("{repo_id}", root=root, video_backend="pyav",
                         delta_timestamps={{"action": [i / {fps} for i in range(chunk)]}})
camera = dataset.meta.video_keys[0]
digests = [hashlib.sha256((dataset[i][camera] * 255).round().to(torch.uint8).numpy().tobytes()).hexdigest()
           for i in indices]
print(json.dumps({{"baseline": base, "peak": rss("VmHWM:"), "frames": len(dataset), "digests": digests}}))
""".format(repo_id=REPO_ID, fps=FPS)
