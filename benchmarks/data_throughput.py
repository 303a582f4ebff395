"""7. Data: samples/s the data pipeline delivers, against what a step eats and what decoding allows.

Loader vs step: for the embedded default dataset and a LeRobot-format dataset on disk
(written by the tests' dataset factory: parquet data with a PNG camera), the loader is
the one ``lerobot train`` builds (``core.data.loader.build_loader``), drained for a block
of batches; the consumer is the bare training step of the default ACT on the same data
and batch (``loop_overhead.bare_loop``), the fastest a step can eat. Blocks alternate;
the goal is a 10× margin.

Per worker, on video: on the 2k-frame 480×640 SVT-AV1 (GOP 2) dataset of ``data_video``,
this process does what one DataLoader worker does for the loader ``lerobot train``
builds (ACT's 100-frame action chunk and the camera frame per item; under uniform random
sampling each request is a collated batch of 8, under
``--dataset.sampler.type=episode_blocks`` a window's batches), counted in samples/s. The
reference is the limit of any reader: PyAV decoding the same file front to back, one
thread, converting every frame to RGB as LeRobot's reader does (by one converter for all
frames, as the reader converts them, not one per frame as ``to_ndarray(format=...)``). Both run single-threaded
in this process and are timed in CPU seconds (a worker's throughput when it has a core:
on a shared machine, wall time measures the neighbours too). Blocks alternate.

Against LeRobot and against the decoder, on 1 and 3 cameras: the 2k-frame 480×640 AV1
datasets of ``data_video`` (3 cameras: the camera's files copied to two more cameras),
the loader ``lerobot train`` builds (``build_loader``: shuffled, batch 8, 2 workers,
action chunk 50) drained in this process, in samples/s of wall time. Its batches hold the
camera frames as uint8, as the training step receives them (it makes them float on the
device: ``core.data.loader.batch_to_device``). Beside it, blocks alternating: LeRobot's
reader as lerobot-train feeds it (``LeRobotDataset`` with its default video backend in a
shuffled DataLoader of 2 workers, in LeRobot's own Python: ``data_video.lerobot_python``;
its batches hold float32 frames; left out when there is none, and in smoke runs), goal
≥ 5×; and the decoder's limit on the same cores: 2 processes (one per worker) decoding
the same files front to back, one thread each, every frame converted to RGB by one
converter, in frames over the cameras, goal ≥ 0.5. That ratio is counted per CPU-second
(user and system time of the loader's main process and workers, camera threads included,
against the decoding processes'), the throughput each side gets from the same cores: on a
machine shared with other work, wall time favours the side with more runnable threads
(the loader's main process and camera threads), and the wall-time figures are in the
details. A third reference, reported without a goal, is the same 2 processes reading
random frames as cheaply as a random reader can (seek to the key frame at or before the
frame, decode up to it, convert that frame): what uniform sampling costs the decoder
alone. The same loader with ``--dataset.sampler.type=episode_blocks`` (a worker decodes
a window of blocks of an episode's consecutive frames, each front to back, straight into
the window's shuffled batches) is held to the front-to-back limit too, goal ≥ 0.5. Each block first takes the batches the workers prefetched while the other side
ran, then times the next ones. Whether the camera frames of 16 random items equal
LeRobot's is a row of its own; each comparison's details record the load average after
it, and the comparison with LeRobot's reader also per CPU-second of each side's processes
(its ended workers included).

Data wait: ``lerobot train`` with ACT at LeRobot's sizes (``_common.LEROBOT_ACT``: 51.6 M
parameters with resnet18, batch 8) on that dataset with the default workers; the log's
``data_s`` (the step's wait for its batch) against the step time, after two warm-up
steps. resnet18 needs torchvision (the ``vision`` extra). torchvision's wheels are built
for one torch each, and its compiled operators (detection ops, which resnet18 never
uses) fail to register on another build, such as a CPU torch beside a CUDA torchvision;
then the run imports torchvision's Python modules without them (``TORCHVISION_MODULES``)
and the row says so. Without torchvision the row is left out.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from _common import (
    LEROBOT_ACT,
    REPO,
    Context,
    LineServer,
    Result,
    Row,
    alternate,
    clean_env,
    judge,
    logged_rows,
    paired,
    run_timed,
    samples_per_cpu_second,
)
from data_video import CHUNK, LEROBOT_LOADER, lerobot_python, rgb_converter, video_dataset
from loop_overhead import bare_loop

NAME = "data"
GOAL = ">= 10"
BATCH = 8
BLOCK_GOAL = ">= 0.5"
WAIT_GOAL = "<= 0.05"
LEROBOT_GOAL = ">= 5"
LIMIT_GOAL = ">= 0.5"
BLOCKS_FLAG = "--dataset.sampler.type=episode_blocks"
LIMIT_NOTES = {
    "decoder limit": "ours: build_loader (shuffled, batch {batch}, {workers} workers, chunk {chunk}, uint8 frames), "
                     "CPU of its main process and workers; limit: {workers} processes, 1 PyAV thread each, every "
                     "frame decoded and converted to RGB24, frames / cameras",
    "decoder limit, episode blocks": "ours: build_loader as above with " + BLOCKS_FLAG + "; limit: {workers} "
                                     "processes decoding front to back as above",
    "random-read limit": "limit: {workers} processes, 1 PyAV thread each, a random frame each: seek to the key frame "
                         "at or before it, decode up to it, convert it to RGB24; frames / cameras",
}
WORKERS = 2
CAMERAS = (1, 3)
SAME_ITEMS = 16


def _lerobot_dataset(ctx: Context) -> list[str]:
    """Write a LeRobot v3.0 dataset with a camera; return the flags that select it."""
    sys.path.insert(0, str(REPO / "tests"))
    from lerobot_dataset_factory import write_lerobot_dataset

    root = ctx.folder(NAME, "lerobot_dataset")
    episodes = ctx.pick([30, 30], [200] * 20)
    write_lerobot_dataset(root, episodes, image=True, image_size=ctx.pick(16, 96))
    return ["--dataset.repo_id=bench/reach_camera", f"--dataset.root={root}"]


def _loader_rate(ctx: Context, flags: list[str], batches: int, slug: str) -> Callable[[], float]:
    """A function giving samples/s over ``batches`` batches of the loader ``lerobot train``
    builds for ``flags`` in this process (one iterator throughout, as in a run)."""
    import torch

    from lerobot_kit.core.config.flags import parse_train_config
    from lerobot_kit.core.data.build import build_dataset
    from lerobot_kit.core.data.loader import build_loader
    from lerobot_kit.core.data.sampler import DataPosition

    config = parse_train_config([*flags, f"--output_dir={ctx.folder(NAME, slug) / 'run'}"])
    loader = build_loader(build_dataset(config), config, 1, 0, DataPosition(), torch.device("cpu"))
    iterator = iter(loader)

    def rate() -> float:
        start = time.perf_counter()
        for _ in range(batches):
            next(iterator)
        return batches * BATCH / (time.perf_counter() - start)

    return rate


def _front_to_back(video: Path) -> Callable[[], float]:
    """Frames per CPU-second of PyAV decoding ``video`` whole, one thread, each frame converted
    to RGB (``data_video.rgb_converter``)."""
    import av

    to_rgb = rgb_converter()

    def rate() -> float:
        start, count = time.process_time(), 0
        with av.open(str(video)) as container:
            stream = container.streams.video[0]
            stream.codec_context.thread_count = 1
            for frame in container.decode(stream):
                to_rgb(frame)
                count += 1
        return count / (time.process_time() - start)

    return rate


def _loader_vs_step(ctx: Context, result: Result) -> None:
    datasets = {"reach": ("reach (default)", [])}
    if all(importlib.util.find_spec(m) for m in ("pyarrow", "PIL")):
        datasets["lerobot"] = ("lerobot format, 1 camera", _lerobot_dataset(ctx))
    else:
        result.details["skipped"] = "lerobot format: needs pip install 'lerobot-kit[dataset]'"
    for slug, (label, dataset_flags) in datasets.items():
        flags = [*dataset_flags, f"--batch_size={BATCH}"]
        loader = _loader_rate(ctx, flags, ctx.pick(5, 100), slug)
        step = bare_loop(flags)
        steps = ctx.pick(2, 15)
        delivered, consumed = alternate(ctx.pick(2, 4), loader, lambda: BATCH / step(steps))
        stats = paired(delivered, consumed)
        result.details[label] = {**stats, "delivered": delivered, "consumed": consumed}
        result.rows.append(Row(
            f"{label}: loader vs training step", stats["ours"], stats["reference"], "samples/s", stats["ratio"],
            GOAL, judge(stats["ratio"], GOAL), "consumer: bare ACT step, batch 8",
        ))


def _worker_rate(ctx: Context, flags: list[str], samples: int, slug: str) -> Callable[[], float]:
    """Samples/s of the work one DataLoader worker does for the loader of ``flags``: the
    requests its sampler makes, served in this process (``--num_workers=0``), without what
    the main process adds."""
    import torch

    from lerobot_kit.core.config.flags import parse_train_config
    from lerobot_kit.core.data.build import build_dataset
    from lerobot_kit.core.data.loader import build_loader
    from lerobot_kit.core.data.sampler import DataPosition

    config = parse_train_config([*flags, "--num_workers=0", f"--output_dir={ctx.folder(NAME, slug) / 'run'}"])
    requests = iter(build_loader(build_dataset(config), config, 1, 0, DataPosition(), torch.device("cpu")).loader)
    return samples_per_cpu_second(requests, samples)


def _per_worker(ctx: Context, result: Result, root: Path) -> None:
    flags = ["--dataset.repo_id=bench/video", f"--dataset.root={root}", "--policy.chunk_size=100",
             "--policy.n_action_steps=100", f"--batch_size={BATCH}"]
    reference = _front_to_back(next((root / "videos").rglob("*.mp4")))
    samplers = {"random": [], "episode blocks": ["--dataset.sampler.type=episode_blocks"]}
    for label, extra in samplers.items():
        ours = _worker_rate(ctx, [*flags, *extra], ctx.pick(16, 200), f"worker_{label.replace(' ', '_')}")
        ours()  # warm-up: the decoder opened, first-call allocations
        delivered, limit = alternate(ctx.pick(2, 4), ours, reference)
        stats = paired(delivered, limit)
        result.details[f"per worker, {label}"] = {**stats, "delivered": delivered, "front_to_back": limit}
        goal = BLOCK_GOAL if label == "episode blocks" else ""
        result.rows.append(Row(
            f"per worker, {label} sampling: samples/s vs PyAV decoding the file front to back", stats["ours"],
            stats["reference"], "samples/s", stats["ratio"], goal, judge(stats["ratio"], goal),
            "2k frames 480x640 AV1 GOP 2, batch 8, ACT chunk 100",
        ))


def _drain(batches: Iterator[Any], skip: int, count: int, pids: list[int], per_cpu: list[float]) -> float:
    """Samples/s over ``count`` batches, after taking ``skip`` (those prefetched while idle);
    appends to ``per_cpu`` the samples per CPU-second the processes ``pids`` spent meanwhile."""
    for _ in range(skip):
        next(batches)
    start, cpu = time.perf_counter(), _cpu_seconds(pids)
    for _ in range(count):
        next(batches)
    per_cpu.append(count * BATCH / max(_cpu_seconds(pids) - cpu, 1 / os.sysconf("SC_CLK_TCK")))
    return count * BATCH / (time.perf_counter() - start)


def _cpu_seconds(pids: list[int]) -> float:
    """CPU seconds (user and system, all threads) the processes have used so far (``/proc``)."""
    ticks = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def _decoder_limit(ctx: Context, root: Path, cameras: int, per_cpu: list[float]
                   ) -> tuple[Callable[[], float], Callable[[], float], list[LineServer]]:
    """Samples/s (frames per second over the cameras) of ``WORKERS`` processes, one decoder
    thread each, at once on the dataset's video files: decoding them front to back (the
    limit), and reading random frames (seek, decode to the frame, convert it: what any
    random reader pays at least). Both convert each frame they hand out to RGB. Each call
    appends to ``per_cpu`` the same frames per CPU-second of those processes."""
    files = sorted(str(path) for path in (root / "videos").rglob("*.mp4"))
    script = str(Path(__file__).with_name("data_video.py"))
    servers = [LineServer([sys.executable, script, "front_to_back", *files[n:], *files[:n]], clean_env(ctx.workdir))
               for n in range(WORKERS)]
    frames = ctx.pick(40, 600)

    def rate(command: str) -> float:
        for server in servers:
            server.send(command)
        done = [server.reply() for server in servers]
        seconds = max(d["end"] for d in done) - min(d["start"] for d in done)
        decoded = sum(d["frames"] for d in done) / cameras
        per_cpu.append(decoded / sum(d["cpu"] for d in done))
        return decoded / seconds

    return lambda: rate(str(frames)), lambda: rate(f"random {frames // 2}"), servers


def _same_items(ctx: Context, root: Path, lerobot: LineServer) -> bool:
    """Whether the camera frames of random items equal those LeRobot's reader serves."""
    import hashlib

    from lerobot_kit.plugins.datasets.lerobot.plugin import LeRobotDatasetConfig
    from lerobot_kit.plugins.datasets.lerobot.reader import make_lerobot_dataset

    dataset = make_lerobot_dataset(LeRobotDatasetConfig(repo_id="bench/video", root=str(root)), {})
    indices = np.random.default_rng(0).permutation(len(dataset))[:SAME_ITEMS].tolist()
    cameras = dataset.meta.image_keys()
    ours = [[hashlib.sha256(item[key].contiguous().numpy().tobytes()).hexdigest() for key in cameras]
            for item in dataset.items(indices, uint8_cameras=True)]
    theirs = lerobot.ask(f"digest {json.dumps(indices)}")["digests"]
    return ours == theirs


def _against_lerobot_and_decoder(ctx: Context, result: Result) -> None:
    from lerobot_kit.core.config.data_options import SamplerConfig
    from lerobot_kit.core.data.loader import PREFETCH_BATCHES, PREFETCH_WINDOWS

    python = None if ctx.smoke else lerobot_python()
    if python is None:
        result.details["lerobot reader"] = "left out: a smoke run, or no Python with LeRobot ($LEROBOT_PYTHON)"
    skip, reps = WORKERS * PREFETCH_BATCHES, ctx.pick(2, 6)
    # Under block sampling a worker delivers a window of batches at a time: skip what the
    # workers have ready, and time several windows, so the windows in the making at either
    # end weigh little.
    window = SamplerConfig().buffer_size // BATCH
    blocks_skip, blocks_count = (WORKERS * PREFETCH_WINDOWS + 1) * window, ctx.pick(1, 8) * window
    for cameras in CAMERAS:
        root = video_dataset(ctx, ctx.pick(100, 2000), cameras)
        label = f"loader, {cameras} camera{'s' if cameras > 1 else ''} {_shape(root)} AV1"
        loader, ours, ours_cpu = _timed_loader(ctx, root, cameras, [], skip, ctx.pick(2, 30))
        blocks_loader, blocks, blocks_cpu = _timed_loader(ctx, root, cameras, [BLOCKS_FLAG], blocks_skip, blocks_count)
        loaders = [loader, blocks_loader]
        limit_cpu: list[float] = []
        limit, random_limit, servers = _decoder_limit(ctx, root, cameras, limit_cpu)
        front_to_back = f"decoding the same files front to back on {WORKERS} processes"
        try:
            for delivering, delivered_cpu, sampling, reference, what, goal, note in (
                (ours, ours_cpu, "", limit, "decoder limit", LIMIT_GOAL, front_to_back),
                (ours, ours_cpu, "", random_limit, "random-read limit", "",
                 f"the decoder reading random frames on {WORKERS} processes"),
                (blocks, blocks_cpu, ", episode blocks sampling", limit, "decoder limit, episode blocks", LIMIT_GOAL,
                 front_to_back),
            ):
                delivered_cpu.clear()
                limit_cpu.clear()
                delivered, decoder = alternate(reps, delivering, reference)
                stats = paired(delivered_cpu, limit_cpu)
                result.details[f"{label}, {what}"] = {
                    **stats, "ours_per_cpu_s": list(delivered_cpu), "limit_per_cpu_s": list(limit_cpu),
                    "wall": {**paired(delivered, decoder), "delivered": delivered, "limit": decoder},
                    "load_average": os.getloadavg()}
                result.rows.append(Row(
                    f"{label}{sampling}: samples per CPU-second vs {note}", stats["ours"], stats["reference"],
                    "samples/CPU-s", stats["ratio"], goal, judge(stats["ratio"], goal),
                    LIMIT_NOTES[what].format(batch=BATCH, workers=WORKERS, chunk=CHUNK),
                ))
            if python is not None:
                lerobot = LineServer([python, "-c", LEROBOT_LOADER, str(root), str(BATCH), str(WORKERS)],
                                     clean_env(ctx.workdir), timeout=1800)
                servers.append(lerobot)
                theirs_cpu: list[float] = []

                def theirs() -> float:
                    reply = lerobot.ask(f"rate {skip} {ctx.pick(2, 10)}")
                    theirs_cpu.append(reply["per_cpu"])
                    return reply["rate"]

                theirs()  # warm-up
                ours_cpu.clear()
                theirs_cpu.clear()
                delivered, reference = alternate(reps, ours, theirs)
                stats = paired(delivered, reference)
                backend, version = lerobot.ready["backend"], lerobot.ready["lerobot"]
                result.details[f"{label}, lerobot"] = {
                    **stats, "delivered": delivered, "lerobot": reference, "backend": backend, "version": version,
                    "per_cpu_s": {**paired(ours_cpu, theirs_cpu), "ours": list(ours_cpu), "lerobot": theirs_cpu},
                    "load_average": os.getloadavg()}
                result.rows.append(Row(
                    f"{label}: samples/s vs LeRobot's reader", stats["ours"], stats["reference"], "samples/s",
                    stats["ratio"], LEROBOT_GOAL, judge(stats["ratio"], LEROBOT_GOAL),
                    f"LeRobot {version} LeRobotDataset ({backend}) in a shuffled DataLoader, same batch, workers, "
                    "chunk",
                ))
                equal = _same_items(ctx, root, lerobot)
                result.rows.append(Row(
                    f"{cameras} camera{'s' if cameras > 1 else ''}: {SAME_ITEMS} random items' camera frames "
                    "bit-identical to LeRobot's reader", float(equal), 1.0, "all equal", float(equal), ">= 1",
                    judge(float(equal), ">= 1"), f"LeRobotDataset ({backend})",
                ))
        finally:
            for each in loaders:
                each.close()
            for server in servers:
                server.close()


def _timed_loader(ctx: Context, root: Path, cameras: int, flags: list[str], skip: int, count: int
                  ) -> tuple[Any, Callable[[], float], list[float]]:
    """The loader ``lerobot train`` builds on ``root`` (with ``flags``), warmed up; a call
    that drains ``count`` of its batches after ``skip`` (samples/s) and the list it appends
    those batches' samples per CPU-second of its processes to."""
    import torch

    from lerobot_kit.core.config.flags import parse_train_config
    from lerobot_kit.core.data.build import build_dataset
    from lerobot_kit.core.data.loader import build_loader
    from lerobot_kit.core.data.sampler import DataPosition

    slug = f"cameras{cameras}" + ("_blocks" if flags else "")
    config = parse_train_config([
        "--dataset.repo_id=bench/video", f"--dataset.root={root}", f"--policy.chunk_size={CHUNK}",
        f"--policy.n_action_steps={CHUNK}", f"--batch_size={BATCH}", f"--num_workers={WORKERS}",
        f"--output_dir={ctx.folder(NAME, slug) / 'run'}", *flags])
    loader = build_loader(build_dataset(config), config, 1, 0, DataPosition(), torch.device("cpu"))
    batches = iter(loader)
    pids, per_cpu = [os.getpid()], []  # this process; its workers once started
    drain = lambda: _drain(batches, skip, count, pids, per_cpu)  # noqa: E731
    drain()  # warm-up: workers started, decoders opened, column caches built
    pids += [worker.pid for worker in loader._workers._workers]  # DataLoader's worker processes
    return loader, drain, per_cpu


def _shape(root: Path) -> str:
    features = json.loads((root / "meta/info.json").read_text())["features"]
    height, width, _ = next(f for f in features.values() if f["dtype"] == "video")["shape"]
    return f"{height}x{width}"


def _data_wait(ctx: Context, result: Result, root: Path) -> None:
    torchvision = None if ctx.smoke else _torchvision()  # the smoke run's ACT has no resnet18
    if torchvision is None and not ctx.smoke:
        result.details["data wait"] = "left out: ACT's resnet18 needs torchvision (pip install 'lerobot-kit[vision]')"
        return
    policy = ["--policy.type=act", *LEROBOT_ACT, "--policy.vision_backbone=resnet18"] if not ctx.smoke else [
        "--policy.type=act", "--policy.dim_model=32", "--policy.dim_feedforward=64", "--policy.chunk_size=10",
        "--policy.n_action_steps=10"]
    steps = ctx.pick(3, 8)
    out = ctx.folder(NAME, "data_wait") / "run"
    entry = ("" if torchvision in (None, "torchvision") else TORCHVISION_MODULES) + (
        "import sys; from lerobot_kit.cli.main import cli; sys.argv[0] = 'lerobot'; cli()")
    argv = [sys.executable, "-c", entry, "train", "--dataset.repo_id=bench/video", f"--dataset.root={root}",
            *policy, f"--batch_size={BATCH}", f"--steps={steps}", "--log_freq=1", "--save_checkpoint=false",
            f"--output_dir={out}"]
    run_timed(argv, clean_env(ctx.workdir), timeout=1800)
    logged = logged_rows(out)[2:]
    wait = sum(m["data_s"] for m in logged)
    step = sum(BATCH / m["samples_per_s"] for m in logged)
    ratio = wait / step
    result.details["data wait"] = {"torchvision": torchvision, "data_s": [m["data_s"] for m in logged],
                                   "step_s": [BATCH / m["samples_per_s"] for m in logged]}
    result.rows.append(Row(
        "ACT at LeRobot's sizes, default workers: data wait per step vs step time", wait / len(logged),
        step / len(logged), "s", ratio, WAIT_GOAL, judge(ratio, WAIT_GOAL),
        f"resnet18 ({torchvision}), LeRobot's ACT sizes (51.6 M), batch 8; 480x640 AV1" if torchvision else "smoke",
    ))


# Imports torchvision's Python modules without its package __init__, which registers the
# compiled detection operators and fails when they were built for another torch.
TORCHVISION_MODULES = (
    "import importlib.util, pathlib, sys, types; spec = importlib.util.find_spec('torchvision'); "
    "package = types.ModuleType('torchvision'); package.__path__ = [str(pathlib.Path(spec.origin).parent)]; "
    "package.__spec__ = spec; sys.modules['torchvision'] = package; import torchvision.models; "
)


def _torchvision() -> str | None:
    """How resnet18 can be built here: "torchvision", "torchvision's Python modules", or None."""
    for how, code in (("torchvision", ""), ("torchvision's Python modules, compiled operators not loaded",
                                            TORCHVISION_MODULES)):
        probe = subprocess.run([sys.executable, "-c", code + "import torchvision.models; "
                                "torchvision.models.resnet18(weights=None)"], capture_output=True)
        if probe.returncode == 0:
            return how
    return None


def run(ctx: Context) -> Result:
    result = Result()
    _loader_vs_step(ctx, result)
    if importlib.util.find_spec("av") is None:
        result.details["video"] = "video rows left out: needs pip install 'lerobot-kit[video]'"
        return result
    root = video_dataset(ctx, ctx.pick(100, 2000))
    _per_worker(ctx, result, root)
    _against_lerobot_and_decoder(ctx, result)
    _data_wait(ctx, result, root)
    return result
