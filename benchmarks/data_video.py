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

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

from _common import REPO, Context

NAME = "data_video"
EPISODE_FRAMES = 200
SHAPE = (480, 640)
FPS = 30
REPO_ID = "bench/video"
LEROBOT_PYTHON = os.environ.get("LEROBOT_PYTHON", "/root/lerobot-venv/bin/python")
CHUNK = 50  # action chunk of the loader rows (ACT's at LeRobot's sizes is 100; its default chunk_size here is 50)


def video_dataset(ctx: Context, frames: int, cameras: int = 1) -> Path:
    """The folder of a ``frames``-frame dataset with ``cameras`` cameras (smoke: toy sizes),
    written on first use."""
    episode = ctx.pick(25, EPISODE_FRAMES)
    shape = ctx.pick((48, 64), SHAPE)
    suffix = "" if cameras == 1 else f"_cameras{cameras}"
    root = ctx.workdir / NAME / f"frames{frames}_{shape[0]}x{shape[1]}{suffix}"
    if (root / "meta/info.json").is_file():
        return root
    if cameras > 1:
        return _more_cameras(video_dataset(ctx, frames), ctx.folder(NAME, root.name), cameras)
    sys.path.insert(0, str(REPO / "tests"))
    from lerobot_dataset_factory import write_lerobot_dataset

    folder = ctx.folder(NAME, root.name)
    os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1's banner and per-file settings: errors only
    write_lerobot_dataset(folder, [episode] * (frames // episode), video=True, image_shape=shape, codec="av1",
                          fps=FPS, keep_cameras=False)
    return folder


def _more_cameras(source: Path, root: Path, cameras: int) -> Path:
    """A copy of the one-camera dataset ``source`` with ``cameras`` cameras: the others are
    copies of its camera's video files, as LeRobot lays out a camera (its own ``videos/<key>``
    folder, ``info.json`` feature, ``meta/episodes`` columns and stats). The same pictures
    cost a decoder what another camera's would."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    shutil.copytree(source, root, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".lerobot_kit_cache"))
    info = json.loads((root / "meta/info.json").read_text())
    stats = json.loads((root / "meta/stats.json").read_text())
    key = next(k for k, f in info["features"].items() if f["dtype"] == "video")
    for n in range(1, cameras):
        extra = f"{key}_{n}"
        shutil.copytree(root / "videos" / key, root / "videos" / extra)
        info["features"][extra] = info["features"][key]
        stats[extra] = stats[key]
        for path in sorted((root / "meta/episodes").rglob("*.parquet")):
            table = pq.read_table(path)
            for column in [c for c in table.column_names if c.startswith(f"videos/{key}/")]:
                table = table.append_column(column.replace(f"videos/{key}/", f"videos/{extra}/"),
                                            pa.array(table[column].to_numpy()))
            pq.write_table(table, path)
    (root / "meta/info.json").write_text(json.dumps(info, indent=4))
    (root / "meta/stats.json").write_text(json.dumps(stats, indent=4))
    return root


def lerobot_python() -> str | None:
    """A Python that imports LeRobot, or None: ``$LEROBOT_PYTHON``, else the LeRobot bridge's
    CI venv (``contrib/lerobot-kit-lerobot/ci.sh`` caches it), else ``/root/lerobot-venv``."""
    if "LEROBOT_PYTHON" in os.environ:
        return LEROBOT_PYTHON if Path(LEROBOT_PYTHON).is_file() else None
    cache = Path(os.environ.get("LEROBOT_KIT_CACHE", Path.home() / ".cache/lerobot-kit"))
    found = sorted(cache.glob("lerobot-venv-*/bin/python"), key=lambda path: path.stat().st_mtime)
    candidates = [*reversed(found), Path(LEROBOT_PYTHON)]
    return next((str(path) for path in candidates if path.is_file()), None)


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


# Run by LeRobot's Python and kept running: LeRobot's reader as lerobot-train feeds it
# (LeRobotDataset with its default video backend, a shuffled DataLoader), the action
# chunk of ``CHUNK`` frames. Each input line is a command: ``rate SKIP N`` takes SKIP
# batches (those the workers prefetched while idle) and then times N, printing samples/s
# and samples per CPU-second of the process and its workers (those ended included);
# ``digest [indices]`` prints, per index, the sha256 of each camera frame as uint8.
LEROBOT_LOADER = """
import hashlib, json, sys, time, psutil, torch
from lerobot.datasets.lerobot_dataset import LeRobotDataset
root, batch, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(1)
dataset = LeRobotDataset("{repo_id}", root=root, delta_timestamps={{"action": [i / {fps} for i in range({chunk})]}})
loader = torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=workers)
def endless():
    while True:
        yield from loader
batches = endless()
def cpu_seconds():
    me = psutil.Process()
    times = [me.cpu_times()]
    for child in me.children(recursive=True):
        try:
            times.append(child.cpu_times())
        except psutil.NoSuchProcess:
            pass
    return sum(t.user + t.system for t in times) + times[0].children_user + times[0].children_system
from importlib.metadata import version
print(json.dumps({{"backend": dataset._video_backend, "lerobot": version("lerobot")}}), flush=True)
for line in sys.stdin:
    command, *args = line.split(" ", 1)
    if command == "rate":
        skip, n = map(int, args[0].split())
        for _ in range(skip):
            next(batches)
        start, cpu = time.perf_counter(), cpu_seconds()
        for _ in range(n):
            next(batches)
        print(json.dumps({{"rate": n * batch / (time.perf_counter() - start),
                          "per_cpu": n * batch / (cpu_seconds() - cpu)}}), flush=True)
    else:
        items = [dataset[i] for i in json.loads(args[0])]
        digests = [[hashlib.sha256((item[key] * 255).round().to(torch.uint8).numpy().tobytes()).hexdigest()
                    for key in dataset.meta.video_keys] for item in items]
        print(json.dumps({{"digests": digests}}), flush=True)
""".format(repo_id=REPO_ID, fps=FPS, chunk=CHUNK)


def rgb_converter() -> Callable[[Any], Any]:
    """``frame -> frame.to_ndarray(format="rgb24")``, the same pixels, by one converter (one
    thread) for every frame: ``to_ndarray(format=...)`` sets one up per frame (and, from PyAV
    17, a pool of threads), which costs more than converting."""
    import av
    from av.video.reformatter import VideoReformatter

    options = {"threads": 1} if int(av.__version__.split(".")[0]) >= 17 else {}
    converter = VideoReformatter()
    return lambda frame: converter.reformat(frame, format="rgb24", **options).to_ndarray()


def front_to_back(paths: list[str]) -> None:
    """Kept running, the decoder's limits on the dataset's files, one thread each. A line ``N``
    decodes N frames cycling through the files front to back, each converted to RGB
    (``rgb_converter``); ``random N`` reads N frames at random places as the cheapest random
    reader can (seek to the key frame at or before the frame, decode up to it, convert that
    one frame to RGB). Prints the frames, the ``perf_counter`` times it started and ended, and
the CPU seconds it used."""
    import random

    import av

    to_rgb = rgb_converter()

    def frames():
        while True:
            for path in paths:
                with av.open(path) as container:
                    stream = container.streams.video[0]
                    stream.codec_context.thread_count = 1
                    yield from container.decode(stream)

    opened = [av.open(path) for path in paths]
    for container in opened:
        container.streams.video[0].codec_context.thread_count = 1
    draw = random.Random(0)

    def random_frame() -> None:
        container = draw.choice(opened)
        stream = container.streams.video[0]
        wanted = draw.randrange(stream.frames) / FPS
        container.seek(round(wanted / stream.time_base), backward=True, any_frame=False, stream=stream)
        for frame in container.decode(stream):
            if float(frame.pts * stream.time_base) >= wanted - float(stream.time_base) / 2:
                to_rgb(frame)
                return

    decoded = frames()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        mode, _, count = line.strip().rpartition(" ")
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(int(count)):
            random_frame() if mode == "random" else to_rgb(next(decoded))
        print(json.dumps({"frames": int(count), "start": start, "end": time.perf_counter(),
                          "cpu": time.process_time() - cpu}), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["front_to_back"]:
        front_to_back(sys.argv[2:])
    else:
        sys.exit("run through benchmarks/run.py")
