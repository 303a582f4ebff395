"""8. Data memory: the LeRobot reader's memory is flat in dataset size and shared by ranks.

For LeRobot v3.0 video datasets of 2k and 8k frames (``data_video``: 480×640, SVT-AV1
GOP 2 as LeRobot records), a fresh process imports the reader, then opens the dataset
and builds 64 random items (ACT's 100-frame action chunk, the camera's current frame),
with a cold column cache. Reported: its peak resident memory (``VmHWM``) above the RSS
after imports; beside it, LeRobot's ``LeRobotDataset`` (PyAV backend) doing the same
in its own environment, when available — and whether its 64 camera frames are
bit-identical to ours.

Two ranks: two processes on this node open the 8k dataset at once, read every row of
its numeric columns and serve 64 items. While both are alive each measures its growth
since its imports: memory private to it, plus its proportional share (``Pss``: a page
mapped by both counts half in each) of the pages it maps from the dataset folder. The
sum over both ranks, the node's memory for the dataset, is compared with one in-memory
copy of the decoded frames, which each rank held before this reader.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from _common import Context, Result, Row, clean_env, judge, run_together
from data_video import LEROBOT_PROBE, REPO_ID, lerobot_python, video_dataset

if TYPE_CHECKING:
    from lerobot_kit.plugins.datasets.lerobot.reader import LeRobotDataset

NAME = "data_memory"
ITEMS = 64
CHUNK = 100  # ACT's action chunk at LeRobot's sizes
PEAK_GOAL_MB = 300
GROWTH_GOAL_MB = 100
MB = 1 << 20


def _indices(frames: int) -> list[int]:
    return np.random.default_rng(0).integers(0, frames, ITEMS).tolist()


def _ours(ctx: Context, root: Path) -> dict[str, float]:
    shutil.rmtree(root / ".lerobot_kit_cache", ignore_errors=True)  # cold: the cache is built while opening
    argv = [sys.executable, __file__, "probe", str(root), json.dumps(_indices(_frames(root)))]
    out = subprocess.run(argv, capture_output=True, text=True, env=clean_env(ctx.workdir), timeout=600, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _lerobot(ctx: Context, python: str, root: Path) -> dict[str, float]:
    argv = [python, "-c", LEROBOT_PROBE, str(root), json.dumps(_indices(_frames(root))), str(CHUNK)]
    out = subprocess.run(argv, capture_output=True, text=True, env=clean_env(ctx.workdir), timeout=900, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _frames(root: Path) -> int:
    return int(json.loads((root / "meta/info.json").read_text())["total_frames"])


def _camera_shape(root: Path) -> list[int]:
    """(height, width, channels) of the dataset's camera."""
    features = json.loads((root / "meta/info.json").read_text())["features"]
    return next(f for f in features.values() if f["dtype"] == "video")["shape"]


def _shape(root: Path) -> str:
    height, width, _ = _camera_shape(root)
    return f"{height}x{width}"


def run(ctx: Context) -> Result:
    result = Result()
    sizes = ctx.pick((100, 400), (2000, 8000))
    python = None if ctx.smoke else lerobot_python()  # LeRobot's start-up alone would double a smoke run
    if python is None:
        result.details["lerobot"] = "LeRobot's reader not measured (smoke run, or no $LEROBOT_PYTHON)"
    above: dict[int, float] = {}
    theirs: dict[int, float] = {}
    for frames in sizes:
        root = video_dataset(ctx, frames)
        ours = _ours(ctx, root)
        above[frames] = (ours["peak"] - ours["baseline"]) / MB
        details = {"ours": ours}
        if python is not None:
            reference = _lerobot(ctx, python, root)
            theirs[frames] = (reference["peak"] - reference["baseline"]) / MB
            equal = ours["digests"] == reference["digests"]
            details.update(lerobot=reference, camera_frames_equal=equal)
            result.rows.append(Row(
                f"{frames} frames: 64 camera frames bit-identical to LeRobot's PyAV reader", float(equal), 1.0,
                "all equal", float(equal), ">= 1", judge(float(equal), ">= 1"), "LeRobotDataset video_backend=pyav",
            ))
        result.details[f"frames{frames}"] = details
        result.rows.append(Row(
            f"{frames} frames {_shape(root)} AV1: open + {ITEMS} random items, peak RSS above imports",
            above[frames], theirs.get(frames), "MB", above[frames] / theirs[frames] if frames in theirs else None,
            f"<= {PEAK_GOAL_MB} MB", above[frames] <= PEAK_GOAL_MB, "reference: LeRobot's LeRobotDataset",
        ))
    small, large = sizes
    growth = above[large] - above[small]
    their_growth = theirs[large] - theirs[small] if theirs else None
    result.rows.append(Row(
        f"peak growth from {small} to {large} frames", growth, their_growth, "MB", None,
        f"<= {GROWTH_GOAL_MB} MB", growth <= GROWTH_GOAL_MB, "reference: LeRobot's LeRobotDataset",
    ))
    result.rows.append(_two_ranks(ctx, video_dataset(ctx, large)))
    result.details["two_ranks"] = result.rows[-1].note
    return result


def _two_ranks(ctx: Context, root: Path) -> Row:
    folder = ctx.folder(NAME, "two_ranks")
    probe = [sys.executable, __file__, "rank", str(root), json.dumps(_indices(_frames(root))), str(folder)]
    run_together([([*probe, str(rank)], clean_env(ctx.workdir)) for rank in range(2)], folder, timeout=900)
    grown = sum(json.loads((folder / f"pss{rank}.json").read_text())["grown"] for rank in range(2)) / MB
    height, width, channels = _camera_shape(root)
    decoded = _frames(root) * height * width * channels / MB
    ratio = grown / decoded
    return Row(f"2 ranks on one node, {_frames(root)} frames: node memory growth vs one decoded copy of its frames",
               grown, decoded, "MB", ratio, "< 0.1", judge(ratio, "< 0.1"),
               "private memory + PSS of the dataset's mapped files, both ranks, both open")


# ----------------------------------------------------------------------------- probes


def _status(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(field))


def _memory(root: str) -> int:
    """Bytes private to this process, plus its ``Pss`` share of mappings from ``root``.

    Shared libraries are left out: their pages' shares move with every process on the
    machine that maps them, and they are no part of a dataset.
    """
    total, in_root = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if not fields[0].endswith(":"):  # a mapping's header: address range ... [path]
                in_root = len(fields) >= 6 and fields[5].startswith(root)
            elif in_root and fields[0] == "Pss:":
                total += int(fields[1]) * 1024
            elif not in_root and fields[0] in ("Private_Clean:", "Private_Dirty:"):
                total += int(fields[1]) * 1024
    return total


def _open_dataset(root: str) -> LeRobotDataset:
    from lerobot_kit.plugins.datasets.lerobot.plugin import LeRobotDatasetConfig
    from lerobot_kit.plugins.datasets.lerobot.reader import make_lerobot_dataset

    return make_lerobot_dataset(LeRobotDatasetConfig(repo_id=REPO_ID, root=root), {"action": list(range(CHUNK))})


def _imports() -> None:
    """What opening a dataset needs imported: the baseline the peak is measured above."""
    import torch  # noqa: F401

    import lerobot_kit.plugins.datasets.lerobot.reader  # noqa: F401
    import lerobot_kit.plugins.datasets.lerobot.stats  # noqa: F401
    from lerobot_kit.plugins.datasets.lerobot.files import require_pyarrow
    from lerobot_kit.plugins.datasets.lerobot.video import require_video_decoder

    require_pyarrow()
    require_video_decoder(None, [])


def _probe(root: str, indices: list[int]) -> None:
    """Open, build the items (keeping a digest of each camera frame, not the frame), report."""
    import hashlib

    import torch

    _imports()
    baseline = _status("VmRSS:")
    dataset = _open_dataset(root)
    camera = dataset.meta.image_keys()[0]
    digests = [hashlib.sha256((dataset[i][camera] * 255).round().to(torch.uint8).numpy().tobytes()).hexdigest()
               for i in indices]
    print(json.dumps({"baseline": baseline, "peak": _status("VmHWM:"), "frames": len(dataset), "digests": digests}))


def _rank(root: str, indices: list[int], folder: str, rank: int) -> None:
    """Hold the dataset open with every numeric row touched, then measure PSS while the peer does too."""
    _imports()
    root = str(Path(root).resolve())
    baseline = _memory(root)
    dataset = _open_dataset(root)
    total = 0.0
    for position in range(len(dataset.episodes)):
        columns, rows = dataset.episode_arrays(position)
        total += sum(float(np.asarray(array[rows]).sum()) for array in columns.numeric.values())
    for i in indices:
        dataset[i]
    out = Path(folder)
    (out / f"ready{rank}").write_text("")
    deadline = time.monotonic() + 600
    while not all((out / f"ready{r}").exists() for r in range(2)) and time.monotonic() < deadline:
        time.sleep(0.05)
    grown = _memory(root) - baseline
    (out / f"pss{rank}.json").write_text(json.dumps({"grown": grown, "checksum": total}))
    (out / f"done{rank}").write_text("")
    while not all((out / f"done{r}").exists() for r in range(2)) and time.monotonic() < deadline:
        time.sleep(0.05)


if __name__ == "__main__":
    if sys.argv[1:2] == ["probe"]:
        _probe(sys.argv[2], json.loads(sys.argv[3]))
    elif sys.argv[1:2] == ["rank"]:
        _rank(sys.argv[2], json.loads(sys.argv[3]), sys.argv[4], int(sys.argv[5]))
    else:
        sys.exit("run through benchmarks/run.py")
