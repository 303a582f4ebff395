"""7. Data: samples/s the sampler and loader deliver, against what a training step consumes.

For the embedded default dataset and a LeRobot-format dataset on disk (written by the
tests' dataset factory: parquet data with a PNG camera, read by the ``lerobot``
dataset plugin), the loader is the one ``lerobot train`` builds (``core.run.
prepare_run``: ``ResumableBatchSampler`` + ``DataLoader`` with the configured
workers), drained for a block of batches. The consumer is the bare training step of
the default ACT on the same dataset and batch (``loop_overhead.bare_loop``), the
fastest a step can eat. Blocks alternate; the goal is a 10× margin, so data never
limits a step.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from typing import Callable

from _common import REPO, Context, Result, Row, alternate, judge, paired
from loop_overhead import bare_loop

NAME = "data"
GOAL = ">= 10"
BATCH = 8


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
    builds for ``flags`` (one iterator throughout, as in a run)."""
    from lerobot_kit.core.distributed.process_group import init_distributed
    from lerobot_kit.core.config.flags import parse_train_config
    from lerobot_kit.core.run.prepare import prepare_run

    config = parse_train_config([*flags, f"--output_dir={ctx.folder(NAME, slug) / 'run'}"])
    iterator = iter(prepare_run(config, init_distributed(60)).loader)

    def rate() -> float:
        start = time.perf_counter()
        for _ in range(batches):
            next(iterator)
        return batches * BATCH / (time.perf_counter() - start)

    return rate


def run(ctx: Context) -> Result:
    datasets = {"reach": ("reach (default)", [])}
    result = Result()
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
    return result
