"""Mixture scale: a mixture of 500 small datasets against 10 larger ones, and against one.

The same 50k frames in three layouts of LeRobot v3.0 datasets (the tests' factory: state,
action and one 96×96 video camera encoded as LeRobot records, SVT-AV1 at GOP 2; 50-frame
episodes): a mixture of 10 members, a mixture of 500 members, and one dataset holding
them all. ``--smoke``: 1k frames, 5 and 25 members, a 32×32 camera.

Start-up and memory: ``lerobot train --dataset.mixture=<json file> --steps=2`` (default
ACT, batch 8, 2 DataLoader workers) as a subprocess, 10 members against 500, alternating:
the time from spawn to its first step's log line, and the peak of the summed resident
memory of its process tree (the training process and its workers, sampled every 10 ms:
``ru_maxrss`` would give the largest process alone). Goal: 500 members within 1.5× of
10 for both — opening a member reads its metadata only, and each process keeps a bounded
number of files open whatever the number of members.

Throughput: samples/s of the loader ``lerobot train`` builds for the 500-member mixture
against one dataset holding the same frames, with the random sampler and with
``--dataset.sampler.type=episode_blocks``. As ``data``'s per-worker rows: the requests
its sampler makes, served in this process (``--num_workers=0``, what one worker does),
in CPU seconds, blocks alternating, after a pass over every member (column caches built,
files in the page cache). Goal: ≥ 0.9. Random sampling draws each sample's member
afresh: a batch of 8 reads 8 members, one item each, where the single dataset reads its
8 items together. The same rows at the size robots record: 2k frames of one 480×640
camera in 20-frame episodes, a mixture of 100 members against one dataset (``--smoke``:
200 frames of 48×64, 10 members), where decoding dominates; the memory bound on open decoders (384 MB: about 125 of
480×640) keeps all of them open.

Beside each throughput layout, a diagnostic row (not judged): PyAV alone seeking, decoding
and converting the same random frames, from the mixture's files in turn against the one
dataset's file, every decoder open. Consecutive requests in different files find each
decoder's pictures cold in the CPU's caches; that ratio is the ceiling decoding itself
puts on the loader's, with no reader code involved.

Every measured process starts under a soft open-file limit of 1024 (``OPEN_FILE_LIMIT``,
many systems' default; the hard limit where that is lower), this one and the training
commands alike: a process keeps three quarters of its limit of video decoders open
(768), and its mapped data files hold no descriptor. A mixture whose members hold more
videos raises its soft limit toward the hard one; the result records the limits (soft at
start, hard, soft once the mixture was opened) and the load average around each row.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from _common import (
    REPO,
    Context,
    Result,
    Row,
    alternate,
    clean_env,
    console_script,
    judge,
    paired,
    samples_per_cpu_second,
    time_to_line,
)

NAME = "mixture_scale"
BATCH = 8
WORKERS = 2
SCALE_GOAL = "<= 1.5"
RATE_GOAL = ">= 0.9"
FIRST_STEP = "step 1/2"
MB = 1 << 20
OPEN_FILE_LIMIT = 1024  # the soft open-file limit every measured process starts under


@dataclass(frozen=True)
class Layouts:
    """The same frames as a mixture of ``counts[layout]`` members for each layout: ``total``
    frames in episodes of ``episode`` frames, one camera of ``shape`` (height, width)."""

    total: int
    counts: dict[str, int]
    episode: int
    shape: tuple[int, int]

    def camera(self) -> str:
        return f"{self.shape[0]}x{self.shape[1]}"

    def folder(self, ctx: Context, layout: str) -> Path:
        return ctx.workdir / NAME / f"{layout}{self.counts[layout]}_{self.total}_{self.camera()}"


def _small(ctx: Context) -> Layouts:
    """Many small members, as a mixture of hundreds of datasets has: 96×96, opening a file costs more than decoding."""
    return Layouts(ctx.pick(1000, 50_000), {"few": ctx.pick(5, 10), "many": ctx.pick(25, 500), "single": 1},
                   ctx.pick(10, 50), ctx.pick((32, 32), (96, 96)))


def _large(ctx: Context) -> Layouts:
    """A camera of the size robots record (480×640), where decoding a frame costs more than opening its file."""
    return Layouts(ctx.pick(200, 2000), {"many": ctx.pick(10, 100), "single": 1}, ctx.pick(10, 20),
                   ctx.pick((48, 64), (480, 640)))


def _datasets(ctx: Context, layouts: Layouts) -> dict[str, list[Path]]:
    """Roots of each layout, written on first use."""
    sys.path.insert(0, str(REPO / "tests"))
    from lerobot_dataset_factory import write_lerobot_dataset

    os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1's banner and per-file settings: errors only
    roots: dict[str, list[Path]] = {}
    for layout, count in layouts.counts.items():
        folder = layouts.folder(ctx, layout)
        roots[layout] = [folder / f"member{n:03d}" for n in range(count)]
        if not (folder / "complete").is_file():
            ctx.folder(NAME, folder.name)
            episodes = [layouts.episode] * (layouts.total // count // layouts.episode)
            for n, root in enumerate(roots[layout]):
                write_lerobot_dataset(root, episodes, video=True, image_shape=layouts.shape, codec="av1", seed=n,
                                      keep_cameras=False)
            (folder / "complete").write_text("")
    return roots


def _mixture_file(ctx: Context, roots: list[Path]) -> Path:
    path = ctx.workdir / NAME / f"{roots[0].parent.name}.json"
    members = [{"repo_id": f"bench/member{n:03d}", "root": str(root)} for n, root in enumerate(roots)]
    path.write_text(json.dumps(members))
    return path


def _dataset_flags(ctx: Context, roots: list[Path]) -> list[str]:
    if len(roots) == 1:
        return ["--dataset.repo_id=bench/single", f"--dataset.root={roots[0]}"]
    return [f"--dataset.mixture={_mixture_file(ctx, roots)}"]


# ----------------------------------------------------------------------------- start-up and memory


def _train(ctx: Context, roots: list[Path]) -> Callable[[], dict[str, float]]:
    runs = iter(range(1000))
    folder = ctx.folder(NAME, f"train{len(roots)}")

    def once() -> dict[str, float]:
        argv = [console_script("lerobot"), "train", *_dataset_flags(ctx, roots), "--steps=2", "--log_freq=1",
                f"--batch_size={BATCH}", f"--num_workers={WORKERS}", "--save_checkpoint=false",
                f"--output_dir={folder / f'run{next(runs)}'}"]
        timed = time_to_line(argv, clean_env(ctx.workdir), FIRST_STEP, timeout=900, tree_rss=True)
        return {"first_step_s": timed.seconds, "peak_rss": timed.peak_rss, "processes": timed.processes,
                "load_average_1min": os.getloadavg()[0]}

    return once


def _scale(ctx: Context, result: Result, few: list[Path], many: list[Path]) -> None:
    runs = {len(few): _train(ctx, few), len(many): _train(ctx, many)}
    for run in runs.values():
        run()  # warm-up: files in the page cache, column caches of the first batches built
    measured: dict[int, list[dict[str, float]]] = {count: [] for count in runs}
    for rep in range(ctx.pick(1, 5)):  # A B, B A, ...: a drift of the machine's load hits both
        for count in (len(many), len(few)) if rep % 2 == 0 else (len(few), len(many)):
            measured[count].append(runs[count]())
    result.details["train"] = {str(count): records for count, records in measured.items()}
    label = f"{len(many)} vs {len(few)} members, same frames"
    for figure, unit, scale, name in (("first_step_s", "s", 1, "time to first step"),
                                      ("peak_rss", "MB", MB, "peak RSS, training process + workers")):
        ours, reference = ([r[figure] / scale for r in measured[count]] for count in (len(many), len(few)))
        stats = paired(ours, reference)
        result.rows.append(Row(
            f"lerobot train --dataset.mixture, {label}: {name}", stats["ours"], stats["reference"], unit,
            stats["ratio"], SCALE_GOAL, judge(stats["ratio"], SCALE_GOAL),
            f"ACT, batch {BATCH}, {WORKERS} workers; reference: {len(few)} members; open-file limit {_soft_limit()}",
        ))


# ----------------------------------------------------------------------------- throughput


def _loader_rate(ctx: Context, flags: list[str], episode: int, samples: int, slug: str) -> Callable[[], float]:
    """Samples per CPU-second of the requests the loader of ``flags`` makes, served in this
    process (one worker's work), after one pass over every member."""
    import torch

    from lerobot_kit.core.config.flags import parse_train_config
    from lerobot_kit.core.data.build import build_dataset
    from lerobot_kit.core.data.loader import build_loader
    from lerobot_kit.core.data.sampler import DataPosition

    config = parse_train_config([*flags, f"--batch_size={BATCH}", "--num_workers=0",
                                 f"--output_dir={ctx.folder(NAME, slug) / 'run'}"])
    dataset = build_dataset(config)
    for i in range(0, len(dataset), episode):  # every member's files opened once, caches built
        dataset[i]
    requests = iter(build_loader(dataset, config, 1, 0, DataPosition(), torch.device("cpu")).loader)
    return samples_per_cpu_second(requests, samples)


def _throughput(ctx: Context, result: Result, layouts: Layouts, samples: int) -> None:
    roots = _datasets(ctx, layouts)
    many, single = roots["many"], roots["single"]
    samplers = {"random": [], "episode blocks": ["--dataset.sampler.type=episode_blocks"]}
    camera = layouts.camera()
    for label, extra in samplers.items():
        slug = f"{label.replace(' ', '_')}_{camera}"
        mixture = _loader_rate(ctx, [*_dataset_flags(ctx, many), *extra], layouts.episode, samples,
                               f"rate_{slug}_mixture")
        one = _loader_rate(ctx, [*_dataset_flags(ctx, single), *extra], layouts.episode, samples, f"rate_{slug}_single")
        load_before = os.getloadavg()
        delivered, reference = alternate(ctx.pick(2, 4), mixture, one)
        stats = paired(delivered, reference)
        result.details[f"loader, {label}, {camera}"] = {
            **stats, "mixture": delivered, "single": reference, "soft_open_file_limit": _soft_limit(),
            "load_average": {"before": load_before, "after": os.getloadavg()},
        }
        result.rows.append(Row(
            f"loader, {label} sampling, {camera} camera: {len(many)}-member mixture vs one dataset of the same frames",
            stats["ours"], stats["reference"], "samples/s", stats["ratio"], RATE_GOAL, judge(stats["ratio"], RATE_GOAL),
            f"one worker's work in CPU seconds; {layouts.total} frames, AV1 GOP 2, batch {BATCH}; open-file limit "
            f"{_soft_limit()}",
        ))


def _decode_rate(files: list[Path], frames_per_file: int, fps: int, requests: int,
                 opened: list[Any]) -> Callable[[], float]:
    """Frames per CPU-second of PyAV alone — seek to a frame, decode to it, convert it to RGB
    with one reused one-thread converter, as the reader converts — at random frames of random
    ``files``, every file's decoder kept open: what decoding
    the same frames costs when consecutive requests land in different files, whatever the
    reader around it does. Appends the containers it opens to ``opened``, for the caller to close."""
    import random

    import av
    from av.video.reformatter import VideoReformatter

    converter = VideoReformatter()
    options = {"threads": 1} if int(av.__version__.split(".")[0]) >= 17 else {}
    first = len(opened)
    for path in files:
        container = av.open(str(path), format="mp4")
        stream = container.streams.video[0]
        stream.codec_context.thread_count = 1
        opened.append((container, stream))
    draw = random.Random(0)
    plan = [(draw.randrange(len(files)), draw.randrange(frames_per_file)) for _ in range(requests)]

    def rate() -> float:
        start = time.process_time()
        for which, frame in plan:
            container, stream = opened[first + which]
            container.seek(round(frame / fps / stream.time_base), backward=True, stream=stream)
            for decoded in container.decode(stream):
                if decoded.pts is not None and decoded.pts * stream.time_base >= frame / fps - 0.5 / fps:
                    converter.reformat(decoded, format="rgb24", **options).to_ndarray()
                    break
        return requests / (time.process_time() - start)

    return rate


def _decode_floor(result: Result, layouts: Layouts, roots: dict[str, list[Path]], requests: int) -> None:
    """The same random frames decoded by PyAV alone from the mixture's files (one per member)
    and from the one dataset's file: the part of the loader's ratio that decoding itself
    sets, with no reader code involved (each decoder's pictures are cold in the CPU's caches
    when the next request lands in another file)."""
    many, single = roots["many"], roots["single"]
    fps = json.loads((single[0] / "meta" / "info.json").read_text())["fps"]
    videos = [next(root.glob("videos/*/*/*.mp4")) for root in many]
    member_frames = layouts.total // len(many)
    opened: list[Any] = []
    try:
        spread = _decode_rate(videos, member_frames, fps, requests, opened)
        one = _decode_rate([next(single[0].glob("videos/*/*/*.mp4"))], layouts.total, fps, requests, opened)
        delivered, reference = alternate(4, spread, one)
    finally:  # the loader rows after this keep up to 768 decoders open under the limit of 1024
        for container, _ in opened:
            container.close()
    stats = paired(delivered, reference)
    result.details[f"decode alone, {layouts.camera()}"] = {**stats, "mixture": delivered, "single": reference}
    result.rows.append(Row(
        f"decode alone (PyAV, no reader), random frames, {layouts.camera()} camera: {len(many)} member files in "
        "turn vs one file", stats["ours"], stats["reference"], "frames/s", stats["ratio"], "", None,
        "diagnostic, not judged: the ceiling decoding sets on the loader rows above; every decoder open",
    ))


@contextlib.contextmanager
def _usual_open_file_limit() -> Iterator[dict[str, int]]:
    """This process, and the commands it starts, under a soft open-file limit of
    ``OPEN_FILE_LIMIT`` (the hard limit where that is lower), restored after; yields the
    soft limit at start and the hard limit (-1: none), for the result."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    start = OPEN_FILE_LIMIT if hard == resource.RLIM_INFINITY else min(OPEN_FILE_LIMIT, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (start, hard))
    try:
        yield {"soft_at_start": start, "hard": -1 if hard == resource.RLIM_INFINITY else hard}
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _soft_limit() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def run(ctx: Context) -> Result:
    result = Result()
    small, large = _small(ctx), _large(ctx)
    result.details["layouts"] = {"small": small.counts, "large": large.counts}
    with _usual_open_file_limit() as limits:
        result.details["open_file_limit"] = limits
        _decode_floor(result, small, _datasets(ctx, small), ctx.pick(32, 2000))
        _throughput(ctx, result, small, ctx.pick(32, 2000))
        _decode_floor(result, large, _datasets(ctx, large), ctx.pick(16, 400))
        _throughput(ctx, result, large, ctx.pick(16, 400))
        roots = _datasets(ctx, small)
        _scale(ctx, result, roots["few"], roots["many"])
    return result


if __name__ == "__main__":
    sys.exit("run through benchmarks/run.py")
