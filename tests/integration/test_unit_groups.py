"""Unit groups on real processes (gloo, CPU): a model whose layers never run ``forward``
(a joint attention over two towers, ``joint_toy``) sharded by FSDP(2) with each pair of
layers as one unit run by its method, checkpointed or compiled through that method.

Run as a script, this file is the rank worker (``python test_unit_groups.py <dir>``);
each rank writes what it saw to ``result<rank>.json``, and the tests compare ranks with a
one-process run computed here, in the pytest process.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch._dynamo.utils import counters
from torch.distributed.tensor import DTensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests folder, when run as a rank worker
from _dist_util import run_ranks  # noqa: E402
from joint_toy import DA, DB, DEPTH, Joint, joint_batch, joint_loss, make_joint  # noqa: E402
from lerobot_kit.core.config.schema import AcceleratorConfig, FSDPConfig, ParallelismConfig  # noqa: E402
from lerobot_kit.core.distributed.process_group import DistContext, all_reduce_mean, init_distributed, shutdown  # noqa: E402
from lerobot_kit.core.parallel.activation_checkpointing import is_checkpointed  # noqa: E402
from lerobot_kit.core.parallel.dims import ParallelDims  # noqa: E402
from lerobot_kit.core.parallel.parallel_model import Parallelized  # noqa: E402
from lerobot_kit.core.parallel.parallelize import parallelize  # noqa: E402
from lerobot_kit.core.parallel.wrap_units import resolve_wrap_units  # noqa: E402

STEPS = 3
GLOBAL_BATCH = 4
COMPILE_TIMEOUT = 900  # one run compiles: ~20 s, minutes on a loaded 2-core runner


def train(p: Parallelized, ctx: DistContext, steps: int = STEPS, watch_gather: bool = True) -> dict[str, Any]:
    """Each rank takes its slice of the global batch; records what the first projection
    of the first pair held while the pair ran (gathered: unless ``watch_gather`` is off, as
    for a compiled pair, which the recording hook would recompile at every call) and after
    the step (sharded)."""
    opt = torch.optim.AdamW(p.model.parameters(), lr=1e-2)
    per_rank = GLOBAL_BATCH // ctx.world_size
    seen: list[list[Any]] = []
    q = p.model.get_submodule("tower_a.0.q")
    hook = q.register_forward_pre_hook(
        lambda module, _args: seen.append([type(module.weight).__name__, list(module.weight.shape)])
    ) if watch_gather else None
    losses = []
    x, y = joint_batch(0, GLOBAL_BATCH)  # one batch throughout: the loss must fall
    for _ in range(steps):
        rows = slice(ctx.rank * per_rank, (ctx.rank + 1) * per_rank)
        loss = joint_loss(p.module, x[rows], y[rows])
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(all_reduce_mean(ctx, {"loss": loss.item()})["loss"])
    if hook is not None:
        hook.remove()
    params = {}
    for name, param in p.model.named_parameters():
        full = param.full_tensor() if isinstance(param, DTensor) else param
        params[name] = full.detach().reshape(-1).tolist()
    local = sum(_local(t).numel() for t in p.model.parameters())
    return {
        "losses": losses,
        "params": params,
        "during_compute": seen[0] if seen else None,
        "after_step": [type(q.weight).__name__, list(_local(q.weight).shape)],
        "all_sharded": all(isinstance(t, DTensor) for t in p.model.parameters()),
        "local_params": local,
        "total_params": sum(t.numel() for t in p.model.parameters()),
        "groups": [g.name for g in p.wrap.groups],
        "checkpointed": is_checkpointed(p.model.get_submodule("tower_a.0"), "joint"),
    }


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def sharded_run(ctx: DistContext, accel: AcceleratorConfig) -> dict[str, Any]:
    dims = ParallelDims.resolve(ParallelismConfig(dp_shard=ctx.world_size), ctx.world_size)
    model = make_joint()
    wrap = resolve_wrap_units(model, dims, accel, None)
    graphs_before = counters["stats"]["unique_graphs"]
    run = train(parallelize(model, wrap, dims, accel, ctx.device, weights_from_main=False), ctx,
                watch_gather=not accel.compile)
    run["graphs"] = counters["stats"]["unique_graphs"] - graphs_before
    return run


def meta_built_rank(ctx: DistContext) -> dict[str, Any]:
    """Rank 0 builds the model, rank 1 only its shapes (meta); the main process's weights and
    non-persistent buffer reach rank 1 through the initial broadcast."""
    dims = ParallelDims.resolve(ParallelismConfig(dp_shard=ctx.world_size), ctx.world_size)
    if ctx.rank == 0:
        model = make_joint()
    else:
        with torch.device("meta"):
            model = Joint()
    accel = AcceleratorConfig()
    p = parallelize(model, resolve_wrap_units(model, dims, accel, None), dims, accel, ctx.device, weights_from_main=True)
    run = train(p, ctx)
    run["scale"] = p.model.scale.tolist()
    return run


def layers_as_plain_units(ctx: DistContext) -> str:
    """The layers sharded as ordinary units by class, no groups: their hooks never fire."""
    dims = ParallelDims.resolve(ParallelismConfig(dp_shard=ctx.world_size), ctx.world_size)
    model = make_joint()
    model.fsdp_unit_groups = list  # type: ignore[method-assign]  # declares none
    accel = AcceleratorConfig(fsdp=FSDPConfig(wrap_modules=["Layer"]))
    p = parallelize(model, resolve_wrap_units(model, dims, accel, None), dims, accel, ctx.device, weights_from_main=False)
    x, y = joint_batch(0, GLOBAL_BATCH)
    try:
        joint_loss(p.module, x, y).backward()
    except Exception as exc:  # noqa: BLE001 - which error it is is what the test reads
        return f"{type(exc).__name__}: {exc}"
    return "ran"


def job(ctx: DistContext) -> dict[str, Any]:
    return {
        "fsdp": sharded_run(ctx, AcceleratorConfig()),
        "fsdp_ac": sharded_run(ctx, AcceleratorConfig(activation_checkpointing=True)),
        "fsdp_compile": sharded_run(ctx, AcceleratorConfig(compile=True)),
        "meta_built": meta_built_rank(ctx),
        "plain_units": layers_as_plain_units(ctx),
    }


# ----------------------------------------------------------------------------- pytest side


def reference_scale() -> list[float]:
    return torch.linspace(0.5, 1.5, DB).tolist()


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    """The same global batch in one process, no wrapper, no units."""
    ctx = DistContext(0, 0, 1, torch.device("cpu"), "single", None)
    dims = ParallelDims.resolve(ParallelismConfig(), 1)
    model = make_joint()
    return train(parallelize(model, resolve_wrap_units(model, dims, AcceleratorConfig(), None), dims,
                             AcceleratorConfig(), ctx.device, weights_from_main=False), ctx)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    workdir = tmp_path_factory.mktemp("unit_groups")
    return run_ranks([__file__, str(workdir)], 2, workdir, timeout=COMPILE_TIMEOUT)


@pytest.mark.timeout(COMPILE_TIMEOUT + 60)
@pytest.mark.parametrize("key", ["fsdp", "fsdp_ac", "fsdp_compile", "meta_built"])
def test_pairs_run_by_a_method_shard_and_train_like_one_process(key: str, ranks: list[dict], reference: dict):
    for rank in ranks:
        run = rank[key]
        assert run["groups"] == [f"tower_a.{i}+tower_b.{i}" for i in range(DEPTH)]
        assert run["checkpointed"] == (key == "fsdp_ac")
        if key == "meta_built":
            assert run["scale"] == reference_scale()
        else:  # compiled, one graph serves every pair (the method guards on no layer)
            assert run["graphs"] == (1 if key == "fsdp_compile" else 0), run["graphs"]
        # Gathered in full while the pair ran, a shard of half the rows after the step.
        assert run["during_compute"] == (None if key == "fsdp_compile" else ["Parameter", [8, DA]])
        assert run["after_step"] == ["DTensor", [4, DA]]
        assert run["all_sharded"]
        assert run["local_params"] <= run["total_params"] / 2 + 64  # a row of padding per odd tensor at most
        assert run["losses"] == pytest.approx(reference["losses"], rel=1e-5)
        assert run["losses"][-1] < run["losses"][0]
        # Compiled kernels round differently, and AdamW's first steps (each about lr x the
        # gradient's sign, 1e-2) carry that into the weights: 1e-3 still catches a wrong gradient.
        atol = 1e-3 if key == "fsdp_compile" else 1e-5
        for name, values in reference["params"].items():
            assert torch.allclose(torch.tensor(run["params"][name]), torch.tensor(values), atol=atol), name
    assert ranks[0]["fsdp"]["params"] == ranks[1]["fsdp"]["params"]


@pytest.mark.timeout(COMPILE_TIMEOUT + 60)
def test_the_same_layers_as_plain_units_cannot_run(ranks: list[dict]):
    """Without the groups the layers' hooks never fire and the projections meet their shards:
    the failure the groups exist for."""
    for rank in ranks:
        assert "DTensor" in rank["plain_units"], rank["plain_units"]


def test_reference_is_one_process_without_units(reference: dict):
    assert reference["groups"] == [] and not reference["all_sharded"]
    assert reference["during_compute"] == ["Parameter", [8, DA]]


if __name__ == "__main__":
    outdir = Path(sys.argv[1])
    context = init_distributed(timeout_s=60)
    result = job(context)
    (outdir / f"result{context.rank}.json").write_text(json.dumps(result))
    shutdown(context)
