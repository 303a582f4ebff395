"""Layouts on real processes (gloo, CPU): DDP(2), FSDP(2), FSDP(4), HSDP(2×2).

Run as a script, this file is the rank worker (``python test_parallelize_ranks.py <job> <dir>``);
one job per world size runs every scenario in sequence, to pay process start-up once.
Each rank writes what it saw to ``result<rank>.json``; the tests compare ranks with each
other and with a one-process reference computed here, in the pytest process.
"""

from __future__ import annotations

import json
import math
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests folder, when run as a rank worker
from _dist_util import run_ranks  # noqa: E402
from lerobot_kit.core.config.schema import (  # noqa: E402
    AcceleratorConfig,
    FSDPConfig,
    MixedPrecisionPolicyConfig,
    ParallelismConfig,
)
from lerobot_kit.core.distributed.process_group import DistContext, all_reduce_mean, init_distributed, shutdown  # noqa: E402
from lerobot_kit.core.parallel.dims import ParallelDims  # noqa: E402
from lerobot_kit.core.parallel.activation_checkpointing import is_checkpointed  # noqa: E402
from lerobot_kit.core.parallel.parallel_model import Parallelized  # noqa: E402
from lerobot_kit.core.parallel.parallelize import parallelize  # noqa: E402
from lerobot_kit.core.parallel.wrap_units import resolve_wrap_units  # noqa: E402
from lerobot_kit.core.parallel.precision import build_grad_scaler  # noqa: E402
from toy_model import D, OUT, SEED, Tiny, batch_for, make_model  # noqa: E402

STEPS = 3
GLOBAL_BATCH = 8
MAX_NORM = 0.5  # small enough that every step clips, so clipping is part of the parity


def train(
    p: Parallelized,
    ctx: DistContext,
    *,
    batch: int,
    accum: int = 1,
    steps: int = STEPS,
    scaler: Any = None,
    fixed_data: bool = False,
    on_grads: Callable[[int], None] | None = None,
    masked: str | None = None,
) -> dict[str, list]:
    """The trainer's loop in miniature: each rank takes its slice of the global batch.

    ``masked``: the loss is a mean over the rows not masked out, a different number on each
    rank — ``"balanced"`` weights ranks by their valid rows (``Parallelized.balance_loss``,
    as the trainer does for a policy's ``loss_weight``), ``"plain"`` does not."""
    opt = torch.optim.AdamW(p.model.parameters(), lr=1e-2)
    per_rank = batch * accum
    losses, norms, stepped, scales = [], [], [], []
    unsynced: dict[str, float] = {}
    for step in range(steps):
        x, y = batch_for(0 if fixed_data else step, per_rank * ctx.world_size)
        x, y = x[ctx.rank * per_rank : (ctx.rank + 1) * per_rank], y[ctx.rank * per_rank : (ctx.rank + 1) * per_rank]
        total = 0.0
        for micro in range(accum):
            rows = slice(micro * batch, (micro + 1) * batch)
            with nullcontext() if micro == accum - 1 else p.no_sync():
                if masked is None:
                    loss = F.mse_loss(p.module(x[rows]).float(), y[rows]) / accum
                else:
                    valid = valid_rows(step, per_rank * ctx.world_size)[ctx.rank * per_rank : (ctx.rank + 1) * per_rank]
                    error = (p.module(x[rows]).float() - y[rows]).pow(2) * valid.unsqueeze(-1)
                    loss = error.sum() / (valid.sum() * OUT)
                    if masked == "balanced":
                        loss = p.balance_loss(loss, valid.sum())
                (scaler.scale(loss) if scaler else loss).backward()
            total += loss.item()
            if step == 0 and micro == 0 and accum > 1:  # what a no_sync micro-step leaves behind
                grads = [q.grad for q in p.model.parameters()]
                unsynced["sharded_without_grad"] = sum(
                    isinstance(q, DTensor) and q.grad is None for q in p.model.parameters()
                )
                unsynced["plain_grad_sum"] = sum(
                    float(g.sum()) for g in grads if g is not None and not isinstance(g, DTensor)
                )
        if on_grads:
            on_grads(step)
        p.finish_grad_sync()
        if scaler:
            scaler.unscale_(opt)
        norms.append(p.clip_grad_norm(MAX_NORM))
        if scaler:
            stepped.append(scaler.step(opt))
            scaler.update()
            scales.append(scaler.get_scale())
        else:
            opt.step()
        opt.zero_grad()
        losses.append(all_reduce_mean(ctx, {"loss": total})["loss"])
    return {"losses": losses, "norms": norms, "stepped": stepped, "scales": scales, "unsynced": unsynced}


def valid_rows(step: int, n: int) -> torch.Tensor:
    """Rows a masked loss keeps: every third one out, so two ranks' halves keep 2 vs 3 of 4."""
    return ((torch.arange(n) + step) % 3 != 0).float()


def parallel_toy(
    model: nn.Module, dims: ParallelDims, accel: AcceleratorConfig, device: torch.device,
    declared: list[str] | None = Tiny._fsdp_wrap_modules,
) -> Parallelized:
    """Every rank built the same toy model from the same seed, so no initial-weights broadcast."""
    wrap = resolve_wrap_units(model, dims, accel, declared)
    return parallelize(model, wrap, dims, accel, device, weights_from_main=False)


def full_params(model: nn.Module) -> dict[str, list[float]]:
    """Every parameter in full (a collective for sharded ones: every rank must call it)."""
    out = {}
    for name, param in model.named_parameters():
        full = param.full_tensor() if isinstance(param, DTensor) else param
        out[name] = full.detach().float().reshape(-1).tolist()
    return out


def shard_report(p: Parallelized) -> dict[str, Any]:
    total, local = p.param_counts()
    ignored = {id(q) for q in p.ignored_params}
    sharded_total = sum(q.numel() for q in p.model.parameters() if id(q) not in ignored)
    # A shard is at most one dim-0 row (FSDP's padding) away from an exact 1/N split, per parameter.
    slack = sum(q.numel() // q.shape[0] for q in p.model.parameters() if id(q) not in ignored)
    sharded_local = local - (total - sharded_total)
    return {
        "total": total,
        "sharded_total": sharded_total,
        "sharded_local": sharded_local,
        "slack": slack,
        "units": list(p.wrap.paths),
        "source": p.wrap.source,
        "all_dtensor": all(isinstance(q, DTensor) for q in p.model.parameters() if id(q) not in ignored),
        "ignored_plain": all(not isinstance(q, DTensor) for q in p.ignored_params),
    }


def layout_run(ctx: DistContext, parallelism: ParallelismConfig, accel: AcceleratorConfig, **train_kw: Any) -> dict:
    dims = ParallelDims.resolve(parallelism, ctx.world_size)
    model = make_model()
    p = parallel_toy(model, dims, accel, ctx.device)
    run = train(p, ctx, **train_kw)
    run["params"] = full_params(p.model)
    run["layout"] = dims.layout
    run["checkpointed"] = [is_checkpointed(p.model.get_submodule(u)) for u in ("blocks.0", "blocks.1")]
    run["dp_rank"] = dims.dp_rank(ctx.rank)
    if p.mesh is not None:  # the mesh's own coordinates of this rank, per named axis
        run["mesh_coords"] = {axis: p.mesh.get_local_rank(axis) for axis in p.mesh.mesh_dim_names or ()}
    if dims.sharded:
        run["shards"] = shard_report(p)
    return run


def meta_run(ctx: DistContext, parallelism: ParallelismConfig, accel: AcceleratorConfig, via_method: bool) -> dict:
    """Build on meta, parallelize, then the caller's to_empty + init_weights; one step."""
    dims = ParallelDims.resolve(parallelism, ctx.world_size)
    with torch.device("meta"):
        model = Tiny()
    p = parallel_toy(model, dims, accel, ctx.device)
    if via_method:
        p.to_empty()
    else:
        model.to_empty(device=ctx.device)
    torch.manual_seed(SEED)
    model.init_weights()
    initial = full_params(model)
    train(p, ctx, batch=2, steps=1)
    return {"initial": initial, "params": full_params(model), "meta_left": any(q.is_meta for q in model.parameters())}


def reduce_dtype_run(ctx: DistContext, reduce_dtype: str | None) -> dict:
    """One backward under param_dtype=bfloat16: are the reduced gradients bf16 values?"""
    dims = ParallelDims.resolve(ParallelismConfig(dp_shard=ctx.world_size), ctx.world_size)
    policy = MixedPrecisionPolicyConfig(param_dtype="bfloat16", reduce_dtype=reduce_dtype)
    accel = AcceleratorConfig(mixed_precision="bf16", fsdp=FSDPConfig(mixed_precision_policy=policy))
    p = parallel_toy(make_model(), dims, accel, ctx.device)
    x, y = batch_for(ctx.rank, 16)
    F.mse_loss(p.module(x).float(), y).backward()
    grads = [q.grad.to_local() for q in p.model.parameters()]
    representable = all(bool((g == g.to(torch.bfloat16).float()).all()) for g in grads)
    return {"bf16_representable": representable, "grad_dtypes": sorted({str(g.dtype) for g in grads})}


def fp16_run(ctx: DistContext) -> dict:
    """FSDP + fp16 + loss scaler; at step 1 only rank 1 sees an overflow in its shard."""
    dims = ParallelDims.resolve(ParallelismConfig(dp_shard=ctx.world_size), ctx.world_size)
    accel = AcceleratorConfig(mixed_precision="fp16")
    p = parallel_toy(make_model(), dims, accel, ctx.device)
    scaler = build_grad_scaler(accel, dims, ctx)
    snapshots: dict[int, dict] = {}

    def poke(step: int) -> None:
        if step == 1 and ctx.rank == 1:
            next(q for q in p.model.parameters() if isinstance(q.grad, DTensor)).grad.to_local().view(-1)[0] = math.inf
        if step in (1, 2):
            snapshots[step] = {n: t.clone() for n, t in p.model.state_dict().items()}

    with torch.autocast("cpu", dtype=torch.float16):
        run = train(p, ctx, batch=4, steps=8, scaler=scaler, fixed_data=True, on_grads=poke)
    after_skip = snapshots[2]
    run["skip_kept_params"] = all(
        torch.equal(after_skip[n].to_local(), snapshots[1][n].to_local()) for n in after_skip
    )
    run["state"] = json.loads(json.dumps(scaler.state_dict()))
    restored = build_grad_scaler(accel, dims, ctx)
    restored.load_state_dict(run["state"])
    run["state_roundtrip"] = restored.state_dict() == scaler.state_dict()
    run["sharded"] = isinstance(next(iter(p.model.parameters())), DTensor)
    run["params"] = full_params(p.model)
    return run


IGNORE_HEAD = AcceleratorConfig(fsdp=FSDPConfig(ignored_modules="head"))
OFFLOAD_NO_RESHARD = AcceleratorConfig(fsdp=FSDPConfig(cpu_offload=True, reshard_after_forward=False))
AC = AcceleratorConfig(activation_checkpointing=True)
IGNORE_HEAD_AC = AcceleratorConfig(activation_checkpointing=True, fsdp=FSDPConfig(ignored_modules="head"))


def job_w2(ctx: DistContext) -> dict:
    fsdp = ParallelismConfig(dp_shard=2)
    return {
        "ddp": layout_run(ctx, ParallelismConfig(), AcceleratorConfig(), batch=4),
        "ddp_accum": layout_run(ctx, ParallelismConfig(), AcceleratorConfig(), batch=2, accum=2),
        "ddp_ac": layout_run(ctx, ParallelismConfig(), AC, batch=4),
        "fsdp": layout_run(ctx, fsdp, IGNORE_HEAD, batch=4),
        "fsdp_accum": layout_run(ctx, fsdp, IGNORE_HEAD, batch=2, accum=2),
        "fsdp_ac": layout_run(ctx, fsdp, IGNORE_HEAD_AC, batch=4),
        "fsdp_offload": layout_run(ctx, fsdp, OFFLOAD_NO_RESHARD, batch=4),
        "fsdp_bf16": layout_run(ctx, fsdp, AcceleratorConfig(mixed_precision="bf16"), batch=4),
        "ddp_masked": layout_run(ctx, ParallelismConfig(), AcceleratorConfig(), batch=4, masked="balanced"),
        "fsdp_masked": layout_run(ctx, fsdp, IGNORE_HEAD, batch=4, masked="balanced"),
        "fsdp_masked_plain": layout_run(ctx, fsdp, IGNORE_HEAD, batch=4, masked="plain"),
        "meta_fsdp": meta_run(ctx, fsdp, IGNORE_HEAD, via_method=False),
        "meta_ddp": meta_run(ctx, ParallelismConfig(), AcceleratorConfig(), via_method=True),
        "reduce_unset": reduce_dtype_run(ctx, None),
        "reduce_fp32": reduce_dtype_run(ctx, "float32"),
        "fp16": fp16_run(ctx),
    }


def job_w4(ctx: DistContext) -> dict:
    hsdp = ParallelismConfig(dp_replicate=2, dp_shard=2)
    return {
        "hsdp": layout_run(ctx, hsdp, IGNORE_HEAD, batch=2),
        "hsdp_accum": layout_run(ctx, hsdp, IGNORE_HEAD, batch=1, accum=2),
        "hsdp_ac": layout_run(ctx, hsdp, IGNORE_HEAD_AC, batch=2),
        "hsdp_masked": layout_run(ctx, hsdp, IGNORE_HEAD, batch=2, masked="balanced"),
        "fsdp4": layout_run(ctx, ParallelismConfig(dp_shard=-1), AcceleratorConfig(), batch=2),
    }


JOBS = {"w2": job_w2, "w4": job_w4}


# ----------------------------------------------------------------------------- pytest side


def single_ctx() -> DistContext:
    return DistContext(0, 0, 1, torch.device("cpu"), "single", None)


@pytest.fixture(scope="module")
def reference() -> dict:
    """The same global batch in one process, no wrapper."""
    dims = ParallelDims.resolve(ParallelismConfig(), 1)
    p = parallel_toy(make_model(), dims, AcceleratorConfig(), torch.device("cpu"), declared=None)
    assert p.module is p.model and p.dims.layout == "single"
    run = train(p, single_ctx(), batch=GLOBAL_BATCH)
    run["params"] = full_params(p.model)
    return run


@pytest.fixture(scope="module")
def masked_reference() -> dict:
    """One process, one masked mean over the valid rows of the whole global batch."""
    dims = ParallelDims.resolve(ParallelismConfig(), 1)
    p = parallel_toy(make_model(), dims, AcceleratorConfig(), torch.device("cpu"), declared=None)
    return train(p, single_ctx(), batch=GLOBAL_BATCH, masked="balanced")


def _job(name: str, world: int, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    workdir = tmp_path_factory.mktemp(name)
    return run_ranks([__file__, name, str(workdir)], world, workdir, timeout=300)


@pytest.fixture(scope="module")
def w2(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return _job("w2", 2, tmp_path_factory)


@pytest.fixture(scope="module")
def w4(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return _job("w4", 4, tmp_path_factory)


def assert_rel(actual: list[float], expected: list[float], rel: float = 1e-4) -> None:
    assert actual == pytest.approx(expected, rel=rel), f"{actual} != {expected}"


def assert_params_close(actual: dict, expected: dict, atol: float = 1e-5) -> None:
    assert actual.keys() == expected.keys()
    for name in expected:
        diff = (torch.tensor(actual[name]) - torch.tensor(expected[name])).abs().max().item()
        assert diff <= atol, f"{name}: max abs diff {diff}"


def assert_replicas_identical(ranks: list[dict], key: str) -> None:
    for other in ranks[1:]:
        assert other[key]["params"] == ranks[0][key]["params"], f"{key}: ranks hold different parameters"


@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    ("job", "key"), [("w2", "ddp"), ("w2", "fsdp"), ("w2", "fsdp_offload"), ("w4", "hsdp"), ("w4", "fsdp4")]
)
def test_loss_and_norm_parity_with_one_process(job: str, key: str, reference: dict, request: pytest.FixtureRequest):
    ranks = request.getfixturevalue(job)
    run = ranks[0][key]
    assert_rel(run["losses"], reference["losses"])
    assert_rel(run["norms"], reference["norms"])
    assert all(n > MAX_NORM for n in reference["norms"]), "clipping must be active for the parity to cover it"
    assert_params_close(run["params"], reference["params"])
    for other in ranks[1:]:  # the clip decision and the logged loss are the same everywhere
        assert other[key]["norms"] == run["norms"] and other[key]["losses"] == run["losses"]
    assert_replicas_identical(ranks, key)


@pytest.mark.timeout(200)
@pytest.mark.parametrize(("job", "key"), [("w2", "ddp_masked"), ("w2", "fsdp_masked"), ("w4", "hsdp_masked")])
def test_a_masked_loss_weighted_by_valid_rows_equals_one_process(
    job: str, key: str, masked_reference: dict, w2: list[dict], request: pytest.FixtureRequest
):
    """Ranks whose slices keep different numbers of rows: balanced, their losses and
    gradients are one process's masked mean over the global batch; a plain mean of the
    ranks' own masked means is another objective (the check that the weighting matters)."""
    ranks = request.getfixturevalue(job)
    assert_rel(ranks[0][key]["losses"], masked_reference["losses"], rel=1e-5)
    assert_rel(ranks[0][key]["norms"], masked_reference["norms"], rel=1e-5)
    for other in ranks[1:]:
        assert other[key]["losses"] == ranks[0][key]["losses"]
    plain = w2[0]["fsdp_masked_plain"]["losses"]
    assert abs(plain[0] - masked_reference["losses"][0]) > 1e-3 * abs(masked_reference["losses"][0]), plain


@pytest.mark.timeout(200)
@pytest.mark.parametrize(("job", "key", "layout"), [("w2", "ddp", "ddp"), ("w2", "fsdp", "fsdp"), ("w4", "hsdp", "hsdp")])
def test_accumulation_matches_bigger_batch(job: str, key: str, layout: str, request: pytest.FixtureRequest):
    ranks = request.getfixturevalue(job)
    big, accumulated = ranks[0][key], ranks[0][f"{key}_accum"]
    assert big["layout"] == accumulated["layout"] == layout
    assert_rel(accumulated["losses"], big["losses"])
    assert_params_close(accumulated["params"], big["params"])
    assert_replicas_identical(ranks, f"{key}_accum")
    # After a no_sync micro-step nothing was communicated: plain gradients (DDP's, the ignored
    # head's) are still each rank's own, and FSDP has not reduce-scattered into sharded grads.
    unsynced = [r[f"{key}_accum"]["unsynced"] for r in ranks]
    assert len({u["plain_grad_sum"] for u in unsynced}) == len(ranks)
    expected_pending = 0 if layout == "ddp" else 10  # inp + two Blocks: 10 sharded parameters
    assert all(u["sharded_without_grad"] == expected_pending for u in unsynced)


@pytest.mark.timeout(200)
@pytest.mark.parametrize(("job", "key", "shards"), [("w2", "fsdp", 2), ("w4", "hsdp", 2), ("w4", "fsdp4", 4)])
def test_each_rank_holds_its_share(job: str, key: str, shards: int, request: pytest.FixtureRequest):
    ranks = request.getfixturevalue(job)
    reports = [r[key]["shards"] for r in ranks]
    for report in reports:
        assert report["units"] == ["blocks.0", "blocks.1"] and report["source"] == "policy"
        assert report["all_dtensor"] and report["ignored_plain"]
        assert abs(report["sharded_local"] - report["sharded_total"] / shards) <= report["slack"]
        assert report["sharded_total"] / shards + report["slack"] < report["sharded_total"]  # the bound means something
    # The shards of one replica add up to the whole model, once.
    assert sum(r["sharded_local"] for r in reports[:shards]) == reports[0]["sharded_total"]


@pytest.mark.timeout(200)
@pytest.mark.parametrize(("job", "key"), [("w2", "fsdp"), ("w2", "fsdp_accum"), ("w4", "hsdp"), ("w4", "hsdp_accum")])
def test_ignored_module_stays_identical_and_trained(job: str, key: str, reference: dict, request: pytest.FixtureRequest):
    ranks = request.getfixturevalue(job)
    heads = [r[key]["params"]["head.weight"] for r in ranks]
    assert all(h == heads[0] for h in heads), "the unsharded head drifted apart across ranks"
    initial = full_params(make_model())["head.weight"]
    assert heads[0] != initial
    assert ranks[0][key]["shards"]["total"] - ranks[0][key]["shards"]["sharded_total"] == D * OUT + OUT


@pytest.mark.timeout(200)
@pytest.mark.parametrize(("job", "key"), [("w2", "ddp"), ("w2", "fsdp"), ("w4", "hsdp")])
def test_activation_checkpointing_leaves_the_numbers_unchanged(job: str, key: str, request: pytest.FixtureRequest):
    """Each Block recomputed in backward (really checkpointed), yet losses, norms and
    trained weights equal the run without it, on every rank."""
    for rank in request.getfixturevalue(job):
        plain, checkpointed = rank[key], rank[f"{key}_ac"]
        assert checkpointed["checkpointed"] == [True, True] and plain["checkpointed"] == [False, False]
        assert_rel(checkpointed["losses"], plain["losses"], rel=1e-6)
        assert_rel(checkpointed["norms"], plain["norms"], rel=1e-6)
        assert_params_close(checkpointed["params"], plain["params"], atol=1e-6)


@pytest.mark.timeout(200)
def test_data_parallel_rank_is_the_meshs_coordinate(w2: list[dict], w4: list[dict]):
    """``ParallelDims.dp_rank`` and the named mesh agree on where each rank sits."""
    for rank, run in enumerate(w4):
        coords = run["hsdp"]["mesh_coords"]
        assert coords == {"dp_replicate": rank // 2, "dp_shard": rank % 2}
        assert run["hsdp"]["dp_rank"] == coords["dp_replicate"] * 2 + coords["dp_shard"] == rank
    for rank, run in enumerate(w2):
        assert run["fsdp"]["mesh_coords"] == {"dp_shard": rank} and run["fsdp"]["dp_rank"] == rank
        assert "mesh_coords" not in run["ddp"] and run["ddp"]["dp_rank"] == rank  # DDP: the default group


@pytest.mark.timeout(200)
@pytest.mark.parametrize("key", ["meta_fsdp", "meta_ddp"])
def test_meta_init_gives_identical_full_weights(key: str, w2: list[dict]):
    runs = [r[key] for r in w2]
    assert not runs[0]["meta_left"]
    assert runs[1]["initial"] == runs[0]["initial"]
    assert runs[1]["params"] == runs[0]["params"]
    weights = torch.tensor(runs[0]["initial"]["blocks.0.fc1.weight"])
    assert torch.isfinite(weights).all() and 0.2 < weights.std().item() < 0.4  # init_weights ran (std 0.3)
    assert torch.tensor(runs[0]["initial"]["blocks.0.fc1.bias"]).eq(0).all()


@pytest.mark.timeout(200)
def test_bf16_fsdp_tracks_the_fp32_run(w2: list[dict], reference: dict) -> None:
    run = w2[0]["fsdp_bf16"]
    assert run["losses"] == pytest.approx(reference["losses"], rel=3e-2)
    assert run["losses"] != pytest.approx(reference["losses"], rel=1e-6)  # bf16 compute really happened
    assert w2[1]["fsdp_bf16"]["params"] == run["params"]


@pytest.mark.timeout(200)
def test_unset_reduce_dtype_reduces_in_param_dtype_on_this_torch(w2: list[dict]):
    """On torch < 2.15 an unset reduce_dtype follows param_dtype (bf16 sums)."""
    assert tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 15), (
        "torch >= 2.15 reduces an unset reduce_dtype in the parameters' dtype: update core/parallel/precision.py, "
        "docs/parallelism.md and this test"
    )
    for rank in w2:
        assert rank["reduce_unset"]["bf16_representable"] is True
        assert rank["reduce_fp32"]["bf16_representable"] is False
        assert rank["reduce_unset"]["grad_dtypes"] == rank["reduce_fp32"]["grad_dtypes"] == ["torch.float32"]


@pytest.mark.timeout(200)
def test_fp16_scaler_skips_together_and_trains(w2: list[dict]):
    runs = [r["fp16"] for r in w2]
    assert runs[0]["sharded"]
    assert runs[0]["stepped"] == runs[1]["stepped"]
    assert runs[0]["stepped"][1] is False, "rank 1's overflow must make every rank skip step 1"
    assert all(run["skip_kept_params"] for run in runs)
    assert runs[0]["scales"] == runs[1]["scales"] and runs[0]["scales"][1] == runs[0]["scales"][0] / 2
    assert runs[0]["stepped"][2:].count(True) >= 4
    assert runs[0]["params"] == runs[1]["params"]
    assert runs[0]["losses"][-1] < 0.8 * runs[0]["losses"][0]
    assert runs[0]["state_roundtrip"] and runs[0]["state"]["scale"] == runs[0]["scales"][-1]


if __name__ == "__main__":
    job, outdir = sys.argv[1], Path(sys.argv[2])
    context = init_distributed(timeout_s=60)
    result = JOBS[job](context)
    (outdir / f"result{context.rank}.json").write_text(json.dumps(result))
    shutdown(context)
