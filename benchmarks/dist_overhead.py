"""3. Distributed overhead on CPU: DDP(2) and FSDP(2) against two independent processes.

Each side is the real ``lerobot train`` console script, one thread per process. The
distributed runs train on 2 ranks with ``--batch_size=B`` per rank; the reference is
two single-process runs of batch B started together — the same arithmetic on the same
two cores with no communication — so the ratio is what gradient all-reduce (DDP) or
parameter all-gather plus gradient reduce-scatter (FSDP) cost here. Step times come
from the runs' ``logs/metrics.jsonl`` (``samples_per_s`` of each log window after the
first, warm-up window). Launch order rotates per repetition. Reported, not judged: on
CPU over gloo the cost says little about GPUs over NCCL.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from _common import (Context, Result, Row, clean_env, console_script, free_port, logged_rows, paired, rank_env,
                     run_together)

NAME = "dist_overhead"
BATCH = 8


def _step_time(output_dir: Path, samples_per_step: int) -> float:
    """Mean seconds per step over the log windows after the first."""
    windows = [row["samples_per_s"] for row in logged_rows(output_dir)][1:]
    return statistics.mean(samples_per_step / rate for rate in windows)


def run(ctx: Context) -> Result:
    window = ctx.pick(2, 15)
    steps = window * ctx.pick(3, 5)
    reps = ctx.pick(1, 2)
    train = [console_script("lerobot"), "train"]
    common = [f"--steps={steps}", f"--log_freq={window}", "--save_checkpoint=false", f"--batch_size={BATCH}"]
    layouts = {"ddp2": [], "fsdp2": ["--parallelism.dp_shard=2"]}
    times: dict[str, list[float]] = {"independent": [], **{name: [] for name in layouts}}
    order = ["independent", *layouts]
    for rep in range(reps):
        for kind in order[rep % len(order):] + order[: rep % len(order)]:
            folder = ctx.folder(NAME, f"{kind}{rep}")
            if kind == "independent":
                outs = [folder / f"single{i}" for i in range(2)]
                commands = [([*train, *common, f"--output_dir={out}"], clean_env(folder)) for out in outs]
                run_together(commands, folder, timeout=600)
                times[kind].append(statistics.mean(_step_time(out, BATCH) for out in outs))
            else:
                port = free_port()
                argv = [*train, *common, *layouts[kind], f"--output_dir={folder / 'run'}"]
                run_together([(argv, rank_env(folder, r, 2, port)) for r in range(2)], folder, timeout=600)
                times[kind].append(_step_time(folder / "run", 2 * BATCH))
    result = Result(details={"batch_per_process": BATCH, "steps": steps, "window": window, "step_s": times})
    for kind in layouts:
        stats: dict[str, Any] = paired(times[kind], times["independent"])
        result.details[kind] = stats
        result.rows.append(Row(
            f"{kind} step time vs 2 independent processes", stats["ours"] * 1e3, stats["reference"] * 1e3, "ms",
            stats["ratio"], note="communication cost on CPU/gloo; not judged",
        ))
    return result
