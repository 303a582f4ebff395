"""LeRobot's π0.5 sharded by FSDP(2) through the LeRobot bridge: what each rank holds and
the largest all-gather, against one process.

π0.5 (LeRobot's own classes, built at reduced sizes by the bridge's ``--policy.sizes``:
6 joint layer pairs, SigLIP with 2 layers, a 320-token vocabulary) is assembled exactly
as ``lerobot train`` assembles it (``core.run.prepare_run``: LeRobot v3 video dataset
with task texts, LeRobot's processors, the model built on the main process and on the
meta device elsewhere, parallelize, the initial broadcast, AdamW) in real rank
processes (gloo), once as one process and once as FSDP(2), and takes one step. Each rank
counts the bytes of the live tensors it holds (local parameter shards, gradients before
they are freed, optimizer state) and, around the step, the output size of every
all-gather FSDP issues (each unit's parameters gathered in full).

Rows: the fullest FSDP(2) rank's parameter + gradient + AdamW bytes against one
process's / 2 (goal ≤ 1.05: everything is sharded, frozen parameters too); the largest
all-gather against the whole model's parameter bytes (goal ≤ 0.15: no unit is a large
part of the model — a joint pair is one unit, not the whole model).

Needs LeRobot 0.6 and the bridge (``contrib/lerobot-kit-lerobot``), so it runs with the
interpreter of the venv the bridge's ``ci.sh`` builds, not from ``run.py``:

    $VENV/bin/python benchmarks/vla_sharding.py [--workdir DIR] [--json out.json]

Run as ``python vla_sharding.py worker OUTDIR SPEC_JSON`` this module is the rank worker.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import Row, judge, launch_ranks, one_step_held_bytes, write_rank_result

REPO = Path(__file__).resolve().parents[1]
BRIDGE_TOOLS = REPO / "contrib" / "lerobot-kit-lerobot" / "tools"
BYTES_GOAL = "<= 1.05"
GATHER_GOAL = "<= 0.15"
PI_SIZES = {
    "vocab_size": 320,
    "gemma_2b": {"width": 64, "depth": 6, "mlp_dim": 256, "num_heads": 8, "num_kv_heads": 1, "head_dim": 8},
    "gemma_300m": {"width": 32, "depth": 6, "mlp_dim": 128, "num_heads": 8, "num_kv_heads": 1, "head_dim": 8},
    "vision": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
               "patch_size": 16},
}


def policy_flags(tokenizer: Path) -> list[str]:
    return [
        "--policy.type=lerobot_pi05", f"--policy.tokenizer_name={tokenizer}", "--policy.chunk_size=4",
        "--policy.n_action_steps=4", "--policy.max_state_dim=8", "--policy.max_action_dim=8",
        "--policy.tokenizer_max_length=24", "--policy.image_resolution=[64,64]",
        f"--policy.sizes={json.dumps(PI_SIZES)}",
    ]


# ----------------------------------------------------------------------------- rank worker


class GatherSizes:
    """Records the output bytes of every ``all_gather_into_tensor`` (what FSDP2 gathers a unit into)."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.sizes: list[int] = []
        self._dist, self._original = dist, dist.all_gather_into_tensor

    def __enter__(self) -> GatherSizes:
        def recorded(output: Any, *args: Any, **kwargs: Any) -> Any:
            self.sizes.append(output.numel() * output.element_size())
            return self._original(output, *args, **kwargs)

        self._dist.all_gather_into_tensor = recorded
        return self

    def __exit__(self, *exc: object) -> None:
        self._dist.all_gather_into_tensor = self._original


def _measure(flags: list[str], ctx: Any, outdir: Path) -> dict[str, Any]:
    from lerobot_kit.core.config.flags import parse_train_config
    from lerobot_kit.core.run.prepare import prepare_run

    config = parse_train_config([*flags, f"--output_dir={outdir / 'run'}"])
    prepared = prepare_run(config, ctx)
    parallel = prepared.run.parallel
    gathers = GatherSizes()
    held, loss = one_step_held_bytes(prepared, config.optimizer.grad_clip_norm, around_step=gathers)
    return {
        "layout": prepared.run.dims.layout,
        **held,
        "trainable_params": sum(p.numel() for p in parallel.model.parameters() if p.requires_grad),
        "gathers": gathers.sizes,
        "units": [g.name for g in parallel.wrap.groups] + list(parallel.wrap.paths),
        "loss": loss,
    }


def _worker(outdir: Path, flags: list[str]) -> None:
    from lerobot_kit.core.distributed.process_group import init_distributed, shutdown

    ctx = init_distributed(timeout_s=300)
    result = _measure(flags, ctx, outdir)
    shutdown(ctx)
    write_rank_result(outdir, ctx.rank, result)


# ----------------------------------------------------------------------------- benchmark


def _total(held: dict[str, Any]) -> int:
    return held["params_bytes"] + held["grads_bytes"] + held["optimizer_bytes"]


def measure(workdir: Path) -> tuple[list[Row], dict[str, Any]]:
    sys.path.insert(0, str(BRIDGE_TOOLS))
    from toy_dataset import make_dataset
    from vla_assets import write_tokenizer

    data = make_dataset(workdir / "data", "bridge/reach", episodes=4, length=24, image_hw=(48, 64))
    tokenizer = write_tokenizer(workdir / "tokenizer")
    common = ["--dataset.repo_id=bridge/reach", f"--dataset.root={data}", "--num_workers=0", "--seed=3",
              *policy_flags(tokenizer)]
    runs = {}
    for name, world, layout in (("single", 1, ["--batch_size=8"]),
                                ("fsdp2", 2, ["--batch_size=4", "--parallelism.dp_shard=2"])):
        folder = workdir / name
        folder.mkdir(parents=True, exist_ok=True)
        runs[name] = launch_ranks([__file__, "worker", str(folder), json.dumps([*common, *layout])], world, folder,
                                  timeout=900)
    single, fsdp = runs["single"][0], runs["fsdp2"]
    ours = max(_total(rank) for rank in fsdp)  # the fullest rank: what must fit on one device
    reference = _total(single) / 2
    ratio = ours / reference
    largest = max(max(rank["gathers"]) for rank in fsdp)
    model = single["model_bytes"]
    rows = [
        Row("fsdp2 param+grad+optim bytes per rank vs one process / 2", ours / 1e6, reference / 1e6, "MB", ratio,
            BYTES_GOAL, judge(ratio, BYTES_GOAL)),
        Row("fsdp2 largest all-gather vs the model's parameter bytes", largest / 1e6, model / 1e6, "MB",
            largest / model, GATHER_GOAL, judge(largest / model, GATHER_GOAL),
            f"{len(fsdp[0]['units'])} units, {len(fsdp[0]['gathers'])} all-gathers per step"),
    ]
    return rows, {"single": single, "fsdp2": fsdp, "flags": common}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        import lerobot_kit_lerobot  # noqa: F401
    except ImportError:
        print("error: vla_sharding needs LeRobot and the LeRobot bridge: run it with the python of the venv "
              "contrib/lerobot-kit-lerobot/ci.sh builds", file=sys.stderr)
        return 2
    from run import table

    with tempfile.TemporaryDirectory(prefix="lerobot-vla-") as scratch:
        workdir = (args.workdir or Path(scratch)).resolve()
        rows, details = measure(workdir)
    print(table([("vla_sharding", row) for row in rows]))
    if args.json is not None:
        args.json.write_text(json.dumps({"rows": [row.to_json() for row in rows], "details": details}, indent=1))
    return 0 if all(row.met is not False for row in rows) else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        _worker(Path(sys.argv[2]), json.loads(sys.argv[3]))
    else:
        sys.exit(main(sys.argv[1:]))
