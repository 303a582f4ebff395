"""8. Activation checkpointing and compile on ACT at LeRobot's sizes, batch 8, with images.

Memory: FSDP(2) rank processes assemble the run as ``lerobot train`` does
(``core.run.prepare_run``) with and without ``--accelerator.activation_checkpointing``,
take one warm-up step (AdamW state now exists), reset the kernel's resident high-water
mark (``/proc/self/clear_refs``), take two more steps and read it again: the peak
resident memory of each rank during training, and its growth above the resident set
before the steps — the activations kept for backward, the unit being gathered and the
gradients in flight, which is what checkpointing shrinks. Each setting runs in fresh
processes, so one's freed memory cannot hide the other's peak.

Compile: one process assembles the same run twice, eager and with
``--accelerator.compile``, and times the two in alternating blocks of steps; the first
compiled step (where compilation happens) is reported apart.

The image backbone is torchvision's resnet18 when torchvision is installed (the
``vision`` extra), else the built-in conv net; the row names say which.

Run as a script (``python ac_compile.py worker OUTDIR SPEC_JSON``) this module is the
rank worker.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _common import (
    LEROBOT_ACT,
    Context,
    Result,
    Row,
    alternate,
    launch_ranks,
    paired,
    rss_now,
    rss_peak,
    write_rank_result,
)

NAME = "ac_compile"
SMOKE_ACT = ["--policy.dim_model=32", "--policy.dim_feedforward=64", "--policy.n_heads=2",
             "--policy.n_encoder_layers=2", "--policy.n_vae_encoder_layers=1", "--policy.chunk_size=5",
             "--policy.n_action_steps=5"]
DATA = ["--batch_size=8", "--dataset.image=true", "--dataset.num_episodes=4", "--dataset.episode_length=30"]
AC = "--accelerator.activation_checkpointing=true"
COMPILE = "--accelerator.compile=true"
MEASURED_STEPS = 2


# ----------------------------------------------------------------------------- rank worker


def _reset_peak() -> None:
    """Set this process's resident high-water mark (VmHWM) to its resident set now."""
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")


def _prepare(flags: list[str], ctx: Any, outdir: Path) -> tuple[Any, list[Any]]:
    """The run's components and a few preprocessed batches from its own loader."""
    from lerobot_kit.core.config.flags import parse_train_config
    from lerobot_kit.core.run.prepare import prepare_run

    config = parse_train_config([*flags, f"--output_dir={outdir}"])
    prepared = prepare_run(config, ctx)
    batches = iter(prepared.loader)
    return prepared.run, [prepared.run.preprocessor(next(batches)) for _ in range(MEASURED_STEPS + 1)]


def _step(run: Any, batch: Any) -> float:
    """One training step on the run's own components; seconds."""
    start = time.perf_counter()
    loss, _ = run.parallel.module(batch)
    loss.backward()
    run.parallel.finish_grad_sync()
    run.parallel.clip_grad_norm(run.config.optimizer.grad_clip_norm)
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def _memory(flags: list[str], ctx: Any, outdir: Path) -> dict[str, Any]:
    run, batches = _prepare(flags, ctx, outdir)
    _step(run, batches[0])
    gc.collect()
    _reset_peak()
    before = rss_now()
    for batch in batches[1:]:
        _step(run, batch)
    return {"rss_before_steps": before, "rss_peak_steps": rss_peak()}


def _speed(flags: list[str], ctx: Any, outdir: Path, reps: int, block: int) -> dict[str, Any]:
    eager, batches = _prepare(flags, ctx, outdir / "eager")
    compiled, _ = _prepare([*flags, COMPILE], ctx, outdir / "compiled")
    first_eager = _step(eager, batches[0])
    first_compiled = _step(compiled, batches[0])  # compiles every unit's graph
    steady = [batches[i % len(batches)] for i in range(block)]

    def timed(run: Any) -> float:
        return statistics.mean(_step(run, batch) for batch in steady)

    compiled_times, eager_times = alternate(reps, lambda: timed(compiled), lambda: timed(eager))
    return {"first_eager": first_eager, "first_compiled": first_compiled, "compiled": compiled_times,
            "eager": eager_times}


def _worker(outdir: Path, spec: dict[str, Any]) -> None:
    # A cache of our own: the first compiled step really compiles, and no other process's
    # half-written kernels are ever loaded.
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(outdir / "inductor_cache")
    from lerobot_kit.core.distributed.process_group import init_distributed, shutdown

    ctx = init_distributed(timeout_s=1200)
    if spec["mode"] == "memory":
        result = _memory(spec["flags"], ctx, outdir / "run")
    else:
        result = _speed(spec["flags"], ctx, outdir, spec["reps"], spec["block"])
    shutdown(ctx)
    write_rank_result(outdir, ctx.rank, result)


# ----------------------------------------------------------------------------- benchmark


def _backbone() -> str:
    return "resnet18" if importlib.util.find_spec("torchvision") is not None else "conv"


def run(ctx: Context) -> Result:
    backbone = _backbone()
    model = [*ctx.pick(SMOKE_ACT, LEROBOT_ACT), f"--policy.vision_backbone={backbone}"]
    flags = [*model, *DATA, f"--dataset.image_size={ctx.pick(16, 96)}"]
    size = "toy" if ctx.smoke else "at LeRobot's sizes"
    what = f"ACT {size}, {backbone}, batch 8"
    result = Result(details={"flags": flags})

    peaks: dict[str, list[dict[str, Any]]] = {}
    for setting, extra in (("eager", []), ("ac", [AC])):
        folder = ctx.folder(NAME, f"memory_{setting}")
        spec = {"mode": "memory", "flags": [*flags, "--parallelism.dp_shard=2", *extra]}
        peaks[setting] = launch_ranks([__file__, "worker", str(folder), json.dumps(spec)], 2, folder, timeout=1200)
    result.details["memory"] = peaks
    for rank in range(2):
        with_ac, without = peaks["ac"][rank], peaks["eager"][rank]
        grown_ac = with_ac["rss_peak_steps"] - with_ac["rss_before_steps"]
        grown = without["rss_peak_steps"] - without["rss_before_steps"]
        result.rows.append(Row(
            f"fsdp2 rank {rank} peak RSS in training steps, AC vs no AC ({what})",
            with_ac["rss_peak_steps"] / 1e6, without["rss_peak_steps"] / 1e6, "MB",
            with_ac["rss_peak_steps"] / without["rss_peak_steps"],
        ))
        result.rows.append(Row(
            f"fsdp2 rank {rank} step growth above pre-step RSS, AC vs no AC", grown_ac / 1e6, grown / 1e6, "MB",
            grown_ac / grown if grown > 0 else None,
        ))

    folder = ctx.folder(NAME, "speed")
    spec = {"mode": "speed", "flags": flags, "reps": ctx.pick(1, 3), "block": ctx.pick(1, 2)}
    speed = launch_ranks([__file__, "worker", str(folder), json.dumps(spec)], 1, folder, timeout=1800)[0]
    result.details["speed"] = speed
    stats = paired(speed["compiled"], speed["eager"])
    result.rows.append(Row(
        f"single step time, --accelerator.compile=true vs eager ({what})", stats["ours"] * 1e3,
        stats["reference"] * 1e3, "ms", stats["ratio"],
    ))
    result.rows.append(Row(
        "single first step (compiles the units) vs first eager step", speed["first_compiled"],
        speed["first_eager"], "s", speed["first_compiled"] / speed["first_eager"],
    ))
    return result


if __name__ == "__main__":
    if sys.argv[1:2] != ["worker"]:
        sys.exit("usage: python ac_compile.py worker OUTDIR SPEC_JSON (started by benchmarks/run.py)")
    _worker(Path(sys.argv[2]), json.loads(sys.argv[3]))
