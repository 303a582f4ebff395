"""2. Memory per rank: what each rank really holds under DDP(2), FSDP(2), FSDP(4), HSDP(2×2).

Real rank processes (gloo) assemble the run exactly as ``lerobot train`` does
(``core.run.prepare_run``: dataset, processors, the policy built on the main process
and on the meta device elsewhere, parallelize, weights broadcast, AdamW), take one
step, and count the bytes of the live tensors they hold: local parameter shards,
gradients before they are freed, and optimizer state. The goal compares FSDP over N
shards with DDP's per-rank bytes divided by N (HSDP(2×2) shards over 2).

Start-up memory: ``ru_maxrss`` after ``prepare_run`` minus the resident set before it,
per rank, in fresh processes (DDP(2) and FSDP(2) launches), against the model's full
fp32 bytes. Under FSDP only the main process may materialise the whole model (it
initialises the weights that are then broadcast shard by shard); the others must
stay well below one model.

Run as a script (``python memory_per_rank.py worker OUTDIR SPEC_JSON``) this module
is the rank worker.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from _common import Context, Result, Row, judge, launch_ranks, one_step_held_bytes, rss_now, rss_peak, write_rank_result

NAME = "memory"
GOAL = "<= 1.05"
# LeRobot's ACT width with 4 encoder and 4 decoder layers: 47.6 M parameters, 190 MB fp32.
FULL_MODEL = ["--policy.dim_model=512", "--policy.dim_feedforward=3200", "--policy.n_encoder_layers=4",
              "--policy.n_decoder_layers=4"]
SMOKE_MODEL = ["--policy.dim_model=32", "--policy.dim_feedforward=64", "--policy.n_heads=2",
               "--policy.n_encoder_layers=2", "--policy.n_vae_encoder_layers=1", "--policy.chunk_size=5",
               "--policy.n_action_steps=5"]
COMMON = ["--batch_size=2", "--dataset.num_episodes=4", "--dataset.episode_length=30"]
LAYOUTS: dict[str, list[str]] = {
    "ddp2": [],
    "fsdp2": ["--parallelism.dp_shard=2"],
    "fsdp4": ["--parallelism.dp_shard=4"],
    "hsdp2x2": ["--parallelism.dp_replicate=2", "--parallelism.dp_shard=2"],
}
# (world size, scenarios) per launch. Start-up memory needs fresh processes, so the full
# run gives DDP(2) and FSDP(2) a launch each; the smoke run saves one launch (its
# start-up figures for fsdp2 then follow ddp2 in the same processes: only the path is tested).
FULL_LAUNCHES = [(2, ["ddp2"]), (2, ["fsdp2"]), (4, ["fsdp4", "hsdp2x2"])]
SMOKE_LAUNCHES = [(2, ["ddp2", "fsdp2"]), (4, ["fsdp4", "hsdp2x2"])]
SHARDS = {"fsdp2": 2, "fsdp4": 4, "hsdp2x2": 2}


# ----------------------------------------------------------------------------- rank worker


def _import_run_modules(config: Any) -> None:
    """Import now what ``prepare_run`` imports on first use, so that the start-up growth
    counts memory the run allocates, not code it loads."""
    import torch.distributed.checkpoint.state_dict  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401

    import lerobot_kit.core.model.policy  # noqa: F401
    import lerobot_kit.core.model.processor  # noqa: F401
    from lerobot_kit.core.registry.registry import get_registry

    registry = get_registry()
    registry.policy(config.policy.type).load()
    registry.dataset(config.dataset.type).load()


def _measure(flags: list[str], ctx: Any, outdir: Path) -> dict[str, Any]:
    from lerobot_kit.core.config.flags import parse_train_config
    from lerobot_kit.core.run.prepare import prepare_run

    config = parse_train_config([*flags, f"--output_dir={outdir / 'run'}"])
    _import_run_modules(config)
    before = rss_now()
    prepared = prepare_run(config, ctx)
    startup_peak = rss_peak()
    held, _loss = one_step_held_bytes(prepared, config.optimizer.grad_clip_norm)
    full_bytes = held.pop("model_bytes")
    return {
        "layout": prepared.run.dims.layout,
        **held,
        "full_model_bytes": full_bytes,
        "rss_before_build": before,
        "rss_peak_after_build": startup_peak,
    }


def _worker(outdir: Path, scenarios: dict[str, list[str]]) -> None:
    from lerobot_kit.core.distributed.process_group import init_distributed, shutdown

    ctx = init_distributed(timeout_s=300)
    result = {name: _measure(flags, ctx, outdir / name) for name, flags in scenarios.items()}
    shutdown(ctx)
    write_rank_result(outdir, ctx.rank, result)


# ----------------------------------------------------------------------------- benchmark


def _total(held: dict[str, Any]) -> int:
    return held["params_bytes"] + held["grads_bytes"] + held["optimizer_bytes"]


def run(ctx: Context) -> Result:
    model = ctx.pick(SMOKE_MODEL, FULL_MODEL)
    per_rank: dict[str, list[dict[str, Any]]] = {}
    for world_size, scenarios in ctx.pick(SMOKE_LAUNCHES, FULL_LAUNCHES):
        folder = ctx.folder(NAME, "+".join(scenarios))
        spec = {name: [*model, *COMMON, *LAYOUTS[name]] for name in scenarios}
        ranks = launch_ranks([__file__, "worker", str(folder), json.dumps(spec)], world_size, folder, timeout=600)
        for name in scenarios:
            per_rank[name] = [r[name] for r in ranks]

    result = Result(details={"model_flags": model, "per_rank": per_rank})
    ddp = max(_total(r) for r in per_rank["ddp2"])
    for name, shards in SHARDS.items():
        ours = max(_total(r) for r in per_rank[name])  # the fullest rank: what must fit on one device
        ratio = ours / (ddp / shards)
        result.rows.append(Row(
            f"{name} param+grad+optim bytes per rank vs DDP/{shards}", ours / 1e6, ddp / shards / 1e6, "MB",
            ratio, GOAL, judge(ratio, GOAL),
        ))
    full = per_rank["ddp2"][0]["full_model_bytes"]
    for name in ("ddp2", "fsdp2"):
        for rank, held in enumerate(per_rank[name]):
            grown = held["rss_peak_after_build"] - held["rss_before_build"]
            sharded_peer = name == "fsdp2" and rank > 0
            goal = "< 1" if sharded_peer else ""
            result.rows.append(Row(
                f"{name} rank {rank} start-up RSS growth vs full model", grown / 1e6, full / 1e6, "MB",
                grown / full, goal, judge(grown / full, goal),
                "must not hold the whole model" if sharded_peer else "main/replica: holds the whole model",
            ))
    return result


if __name__ == "__main__":
    if sys.argv[1:2] != ["worker"]:
        sys.exit("usage: python memory_per_rank.py worker OUTDIR SPEC_JSON (started by benchmarks/run.py)")
    _worker(Path(sys.argv[2]), json.loads(sys.argv[3]))
