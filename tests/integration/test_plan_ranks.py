"""``lerobot plan`` through the console script, and its per-rank bytes against real FSDP ranks.

Run as a script, this file is the rank worker (``python test_plan_ranks.py <dir>``): each
rank builds every scenario's policy from its flags as ``lerobot train`` does, applies
``parallelize``, takes one AdamW step on a real batch and writes the bytes it held
(local shards of parameters, gradients before ``zero_grad``, optimizer state) to
``result<rank>.json``. One launch per world size runs all scenarios, to pay start-up once.
"""

from __future__ import annotations

import json
import math
import re
import resource
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests folder, when run as a rank worker

import pytest  # noqa: E402
import torch  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from _dist_util import run_ranks  # noqa: E402
from lerobot_kit.core.config.flags import parse_train_config  # noqa: E402
from lerobot_kit.core.distributed.process_group import DistContext, init_distributed, shutdown  # noqa: E402
from lerobot_kit.core.model.policy import make_policy  # noqa: E402
from lerobot_kit.core.model.processor import make_processors  # noqa: E402
from lerobot_kit.core.parallel.dims import ParallelDims  # noqa: E402
from lerobot_kit.core.plan.memory_plan import plan_run  # noqa: E402
from lerobot_kit.core.parallel.parallelize import parallelize  # noqa: E402
from lerobot_kit.core.parallel.wrap_units import resolve_wrap_units  # noqa: E402
from lerobot_kit.core.data.build import build_dataset  # noqa: E402
from lerobot_kit.core.run.optim import build_optimizer  # noqa: E402

# A small ACT whose sizes do not divide by the shard degrees (padding), with the CVAE
# encoder kept unsharded and only encoder layers wrapped (the decoder stays in the root).
TINY = [
    "--policy.dim_model=18", "--policy.n_heads=3", "--policy.dim_feedforward=37", "--policy.n_encoder_layers=3",
    "--policy.n_decoder_layers=1", "--policy.latent_dim=5", "--policy.n_vae_encoder_layers=1",
    "--policy.chunk_size=5", "--policy.n_action_steps=5", "--dataset.num_episodes=2", "--dataset.episode_length=12",
    "--accelerator.fsdp.ignored_modules=vae_encoder", '--accelerator.fsdp.wrap_modules=["ACTEncoderLayer"]',
]


SCENARIOS: dict[int, dict[str, list[str]]] = {
    2: {
        "act_fsdp": ["--parallelism.dp_shard=2"],
        "tiny_fsdp": [*TINY, "--parallelism.dp_shard=2"],
        "tiny_ddp": TINY,
    },
    4: {
        "act_fsdp": ["--parallelism.dp_shard=4"],
        "tiny_fsdp": [*TINY, "--parallelism.dp_shard=4"],
        "tiny_hsdp": [*TINY, "--parallelism.dp_replicate=2", "--parallelism.dp_shard=2"],
    },
}


FIELDS = ("params_bytes", "grads_bytes", "optimizer_bytes")


def _local_bytes(tensor: torch.Tensor) -> int:
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.numel() * local.element_size()


def _measure(flags: list[str], ctx: DistContext) -> dict[str, Any]:
    """One optimizer step of the real run's pieces; bytes this rank held."""
    config = parse_train_config(flags)
    dims = ParallelDims.resolve(config.parallelism, ctx.world_size)
    dataset = build_dataset(config)
    torch.manual_seed(config.seed)
    policy = make_policy(config.policy, dataset.meta)
    preprocessor, _ = make_processors(config.policy, dataset.meta)
    wrap = resolve_wrap_units(policy, dims, config.accelerator, type(policy)._fsdp_wrap_modules)
    parallel = parallelize(policy, wrap, dims, config.accelerator, ctx.device, weights_from_main=False)
    trainable = [p for p in parallel.model.parameters() if p.requires_grad]
    # Sharded and plain (ignored) parameters apart: one foreach AdamW step cannot mix DTensors and tensors.
    sharded = [p for p in trainable if isinstance(p, DTensor)]
    plain = [p for p in trainable if not isinstance(p, DTensor)]
    optimizers = [build_optimizer(group, config.optimizer) for group in (sharded, plain) if group]
    batch = next(iter(DataLoader(dataset, batch_size=2)))
    loss, _ = parallel.module(preprocessor(batch))
    loss.backward()
    parallel.finish_grad_sync()
    params = list(parallel.model.parameters())
    grads_bytes = sum(_local_bytes(p.grad) for p in params if p.grad is not None)
    for optimizer in optimizers:
        optimizer.step()
    optimizer_bytes = sum(
        _local_bytes(value)
        for optimizer in optimizers
        for state in optimizer.state.values()
        for value in state.values()
        if torch.is_tensor(value)
    )
    return {
        "layout": dims.layout,
        "params_bytes": sum(_local_bytes(p) for p in params),
        "grads_bytes": grads_bytes,
        "optimizer_bytes": optimizer_bytes,
        "params_without_grad": sum(p.grad is None for p in params if p.requires_grad),
    }


def _worker(outdir: Path) -> None:
    ctx = init_distributed(timeout_s=60)
    try:
        result = {}
        for name, flags in SCENARIOS[ctx.world_size].items():
            start = time.monotonic()
            result[name] = _measure(flags, ctx)
            print(f"{name}: {time.monotonic() - start:.1f}s", flush=True)
    finally:
        shutdown(ctx)
    (outdir / f"result{ctx.rank}.json").write_text(json.dumps(result))


@pytest.mark.timeout(420)  # the ranks (their own 240 s watchdog), then each scenario planned (activations traced)
@pytest.mark.parametrize("world_size", [2, 4])
def test_plan_matches_real_fsdp_ranks(world_size: int, tmp_path: Path) -> None:
    ranks = run_ranks([__file__, str(tmp_path)], world_size, tmp_path, timeout=240)
    for name, flags in SCENARIOS[world_size].items():
        plan = _plan(flags, world_size)
        measured = [r[name] for r in ranks]
        assert {m["layout"] for m in measured} == {plan["layout"]}, name
        assert all(m["params_without_grad"] == 0 for m in measured), f"{name}: a parameter got no gradient"
        for field in FIELDS:
            held = [m[field] for m in measured]
            assert plan["per_rank"][field] == max(held), f"{name} {field}: plan {plan['per_rank']} vs ranks {held}"
            if plan["layout"] == "ddp":
                assert plan["ddp_per_rank"][field] == max(held)
        if plan["layout"] == "fsdp" and not plan["ignored_modules"]:
            # Shards partition the model: together the ranks hold exactly one copy.
            assert sum(m["params_bytes"] for m in measured) == plan["ddp_per_rank"]["params_bytes"], name


@pytest.mark.fast  # the console script alone: the inner loop runs it
def test_cli_plans_eight_ranks_in_one_process(cli) -> None:
    """In seconds of CPU time (the plan's own, as the wall clock of a shared machine
    measures its neighbours too), activations traced included."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = cli("plan", "--world_size=8", "--parallelism.dp_shard=8", timeout=300)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "layout fsdp | world 8 (dp_replicate 1 × dp_shard 8)" in out
    assert "ACTEncoderLayer × 4" in out and "ACTDecoderLayer × 1" in out
    assert re.search(r"fsdp holds 0\.12[5-9]× of DDP per rank", out), out
    assert "activations per rank at --batch_size=8, one forward and backward" in out
    assert "with activation checkpointing" in out and "counted: the batch on the device" in out
    assert cpu_s < 30, f"lerobot plan took {cpu_s:.1f}s of CPU time"


@pytest.mark.fast  # the console script alone: the inner loop runs it
def test_cli_json_is_the_plan(cli) -> None:
    flags = ["--parallelism.dp_replicate=2", "--parallelism.dp_shard=4", "--accelerator.mixed_precision=bf16"]
    result = cli("plan", "--json", *flags, "--world_size", "8", timeout=300)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data == _plan(flags, 8)
    assert (data["layout"], data["world_size"], data["dp_replicate"], data["dp_shard"]) == ("hsdp", 8, 2, 4)
    units = data["units"]
    assert [u["class"] for u in units] == ["ACTEncoderLayer"] * 4 + ["ACTDecoderLayer"]
    assert sum(u["params"] for u in units) + data["root_params"] == data["total_params"]
    per_rank, ddp = data["per_rank"], data["ddp_per_rank"]
    for totals in (per_rank, ddp):
        assert totals["total_bytes"] == totals["params_bytes"] + totals["grads_bytes"] + totals["optimizer_bytes"]
    shapes = param_shapes(flags)
    assert ddp["params_bytes"] == 4 * data["total_params"] == 4 * sum(math.prod(s) for s in shapes)
    assert ddp["optimizer_bytes"] == 2 * ddp["params_bytes"] + 4 * len(shapes)  # + a float32 step per tensor
    # Sharded over 4 (not 8): a quarter, plus at most one padding row per tensor.
    padding = sum(4 * math.prod(s[1:]) for s in shapes)
    assert ddp["params_bytes"] / 4 <= per_rank["params_bytes"] < ddp["params_bytes"] / 4 + padding
    assert data["gather_dtype"] == "bfloat16"
    largest = max(units, key=lambda u: u["params"])
    assert data["largest_gather_bytes"] == 2 * largest["params"] and data["largest_gather_unit"] == largest["path"]


def param_shapes(flags: list[str]) -> list[tuple[int, ...]]:
    """The policy's parameter shapes, built on the meta device like the plan does."""
    config = parse_train_config(flags)
    meta = build_dataset(config).meta
    with torch.device("meta"):
        return [tuple(p.shape) for p in make_policy(config.policy, meta).parameters()]


@pytest.mark.fast  # the console script alone: the inner loop runs it
def test_cli_error_is_one_line_exit_2(cli) -> None:
    result = cli("plan", "--world_size=8", "--parallelism.dp_shard=4", timeout=300)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.strip() == (
        "error: --parallelism.dp_replicate=1 × --parallelism.dp_shard=4 = 4 does not match the world size of 8 "
        "launched processes: make dp_replicate × dp_shard = 8 (e.g. --parallelism.dp_shard=-1 to shard over all "
        "of them), or launch 4 processes"
    )
    assert result.stdout == ""


@pytest.mark.fast  # the console script alone: the inner loop runs it
def test_help_names_plan_flags_and_train_flags(cli) -> None:
    result = cli("plan", "--help", timeout=300)
    assert result.returncode == 0
    assert "--world_size=N" in result.stdout and "--json" in result.stdout
    assert "--plan.device_memory_gb=G" in result.stdout
    assert "Every `lerobot train` flag applies" in result.stdout


def _plan(flags: list[str], world_size: int) -> dict[str, Any]:
    return plan_run(parse_train_config(flags), world_size).to_json()


if __name__ == "__main__":
    _worker(Path(sys.argv[1]))
