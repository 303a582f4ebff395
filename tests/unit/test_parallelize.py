"""``parallelize`` in one process: the single-process path, mixed-precision rules, the loss
scaler, wrap-unit resolution and the refusals that come before any collective."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from toy_model import Block, D, batch_for, make_model

from lerobot_kit.core.config.schema import AcceleratorConfig, FSDPConfig, MixedPrecisionPolicyConfig, ParallelismConfig
from lerobot_kit.core.distributed.process_group import DistContext
from lerobot_kit.core.errors import ConfigError
from lerobot_kit.core.parallel.dims import ParallelDims
from lerobot_kit.core.parallel.parallelize import parallelize
from lerobot_kit.core.parallel.precision import autocast_dtype, build_grad_scaler, build_mp_policy
from lerobot_kit.core.parallel.wrap_units import WrapUnits, check_tied_weights, resolve_wrap_units


def single_ctx() -> DistContext:
    return DistContext(0, 0, 1, torch.device("cpu"), "single", None)


def test_single_process_accumulates_and_clips_like_torch() -> None:
    """In one process ``no_sync`` and ``finish_grad_sync`` leave gradients to accumulate as
    in plain torch: two micro-batches, one of them under ``no_sync``, then the clip."""
    dims = ParallelDims.resolve(ParallelismConfig(), 1)
    ours, theirs = make_model(), make_model()
    p = parallelize(ours, WrapUnits(), dims, AcceleratorConfig(), torch.device("cpu"), weights_from_main=True)
    assert p.module is ours
    x, y = batch_for(0, 8)
    with p.no_sync():
        F.mse_loss(ours(x[:4]), y[:4]).backward()
    F.mse_loss(ours(x[4:]), y[4:]).backward()
    p.finish_grad_sync()
    for rows in (slice(0, 4), slice(4, 8)):
        F.mse_loss(theirs(x[rows]), y[rows]).backward()
    norm = p.clip_grad_norm(0.1)
    expected = torch.nn.utils.clip_grad_norm_(theirs.parameters(), 0.1).item()
    assert expected > 0.1  # the clip really scaled the gradients
    assert norm == pytest.approx(expected, rel=1e-6)
    for a, b in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(a.grad, b.grad)


def test_mixed_precision_policy_rules() -> None:
    assert autocast_dtype(AcceleratorConfig()) is None and build_mp_policy(AcceleratorConfig()) is None
    for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        accel = AcceleratorConfig(mixed_precision=name)
        assert autocast_dtype(accel) is dtype
        policy = build_mp_policy(accel)
        assert (policy.param_dtype, policy.reduce_dtype, policy.output_dtype) == (dtype, torch.float32, None)
    # Explicit fields replace the derived policy entirely, even under mixed_precision=no.
    fields = MixedPrecisionPolicyConfig(param_dtype="bfloat16", output_dtype="float32", cast_forward_inputs=False)
    policy = build_mp_policy(AcceleratorConfig(fsdp=FSDPConfig(mixed_precision_policy=fields)))
    assert (policy.param_dtype, policy.reduce_dtype, policy.output_dtype, policy.cast_forward_inputs) == (
        torch.bfloat16, None, torch.float32, False,
    )


@pytest.mark.parametrize(
    ("mixed_precision", "fields", "match"),
    [
        ("bf16", {"reduce_dtype": "float32"}, r"mixed_precision_policy.param_dtype is not"),
        ("no", {"cast_forward_inputs": True}, r"set --accelerator.fsdp.mixed_precision_policy.param_dtype too"),
        ("bf16", {"param_dtype": "float16"}, r"param_dtype=float16 needs --accelerator.mixed_precision=fp16 \(got 'bf16'\)"),
        ("no", {"param_dtype": "bfloat16", "reduce_dtype": "float16"}, r"reduce_dtype=float16 needs"),
        ("bf16", {"param_dtype": "bfloat16", "output_dtype": "float16"}, r"output_dtype=float16 needs"),
    ],
)
def test_mixed_precision_policy_errors(mixed_precision: str, fields: dict, match: str) -> None:
    accel = AcceleratorConfig(
        mixed_precision=mixed_precision, fsdp=FSDPConfig(mixed_precision_policy=MixedPrecisionPolicyConfig(**fields))
    )
    with pytest.raises(ConfigError, match=match):
        build_mp_policy(accel)


def test_fp16_float16_policy_is_accepted() -> None:
    fields = MixedPrecisionPolicyConfig(param_dtype="float16")
    policy = build_mp_policy(AcceleratorConfig(mixed_precision="fp16", fsdp=FSDPConfig(mixed_precision_policy=fields)))
    assert policy.param_dtype is torch.float16


def test_loss_scaler_dynamics_and_state() -> None:
    dims = ParallelDims.resolve(ParallelismConfig(), 1)
    assert build_grad_scaler(AcceleratorConfig(mixed_precision="bf16"), dims, single_ctx()) is None
    scaler = build_grad_scaler(AcceleratorConfig(mixed_precision="fp16"), dims, single_ctx())
    scaler.load_state_dict({**scaler.state_dict(), "growth_interval": 2, "scale": 8.0})
    weight = nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([weight], lr=1.0)
    history = []
    for grad in ([8.0, 8.0, 8.0], [math.inf, 0.0, 0.0], [4.0, 4.0, 4.0], [4.0, 4.0, 4.0]):
        weight.grad = torch.tensor(grad)
        before = weight.detach().clone()
        stepped = scaler.step(opt)
        scaler.update()
        history.append((stepped, scaler.get_scale(), (before - weight.detach()).tolist()))
    assert history == [
        (True, 8.0, [1.0, 1.0, 1.0]),  # unscaled by 8 before the step
        (False, 4.0, [0.0, 0.0, 0.0]),  # overflow: skipped, backed off
        (True, 4.0, [1.0, 1.0, 1.0]),
        (True, 8.0, [1.0, 1.0, 1.0]),  # two good steps since the backoff: grown
    ]
    assert json.loads(json.dumps(scaler.state_dict())) == {
        "scale": 8.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2, "growth_tracker": 0,
    }
    assert scaler.scale(torch.tensor(2.0)).item() == 16.0
    with pytest.raises(RuntimeError, match="without unscale_"):
        scaler.update()


FSDP = FSDPConfig()


def _sharded_dims() -> ParallelDims:
    return ParallelDims.resolve(ParallelismConfig(dp_shard=2), 2)


def _units(model: nn.Module, fsdp: FSDPConfig, declared: list[str] | None, **flags: bool) -> WrapUnits:
    """Units of a sharded run, or of a one-process run with ``flags`` (activation_checkpointing, compile)."""
    dims = ParallelDims.resolve(ParallelismConfig(), 1) if flags else _sharded_dims()
    return resolve_wrap_units(model, dims, AcceleratorConfig(fsdp=fsdp, **flags), declared)


def test_wrap_units_precedence_and_size_rule() -> None:
    model = make_model()
    assert _units(model, FSDPConfig(wrap_modules=["Linear"]), ["Block"]) == WrapUnits(
        ("inp", "blocks.0.fc1", "blocks.0.fc2", "blocks.1.fc1", "blocks.1.fc2", "head"), "flag"
    )
    assert _units(model, FSDPConfig(min_num_params=1), ["Block"]) == WrapUnits(("blocks.0", "blocks.1"), "policy")
    # Bottom-up: each fc2 (528) is a unit; fc1 (544) too; a Block then has nothing left.
    assert _units(model, FSDPConfig(min_num_params=500), None).paths == (
        "blocks.0.fc1", "blocks.0.fc2", "blocks.1.fc1", "blocks.1.fc2",
    )
    # 1000: a Block (1072) qualifies; its linears alone do not; the ModuleList never does.
    assert _units(model, FSDPConfig(min_num_params=1000), None) == WrapUnits(("blocks.0", "blocks.1"), "min_num_params")


def test_units_are_resolved_only_where_something_works_per_unit() -> None:
    """One process without AC or compile needs none; with either it needs them, in the same order."""
    model = make_model()
    single = ParallelDims.resolve(ParallelismConfig(), 1)
    assert resolve_wrap_units(model, single, AcceleratorConfig(), ["Block"]) == WrapUnits()
    for flag in ("activation_checkpointing", "compile"):
        assert _units(model, FSDP, ["Block"], **{flag: True}) == WrapUnits(("blocks.0", "blocks.1"), "policy")


@pytest.mark.parametrize(
    ("flags", "who"),
    [
        ({}, "a sharded run needs FSDP wrap units"),
        ({"activation_checkpointing": True}, "--accelerator.activation_checkpointing=true needs FSDP wrap units"),
        ({"compile": True}, "--accelerator.compile=true needs FSDP wrap units"),
    ],
)
def test_missing_wrap_units_names_all_three_options(flags: dict[str, bool], who: str) -> None:
    with pytest.raises(ConfigError) as err:
        _units(make_model(), FSDP, None, **flags)
    message = str(err.value)
    assert message.startswith(who) and "\n" not in message
    assert "_fsdp_wrap_modules" in message
    assert "--accelerator.fsdp.wrap_modules" in message and "--accelerator.fsdp.min_num_params" in message


def test_unknown_wrap_class_lists_the_model_classes() -> None:
    with pytest.raises(ConfigError) as err:
        _units(make_model(), FSDPConfig(wrap_modules=["Blok"]), None)
    assert "names 'Blok', which is not a module class of this model" in str(err.value)
    assert "its module classes are: Block, Linear, ModuleList, Tiny" in str(err.value)
    with pytest.raises(ConfigError, match=r"_fsdp_wrap_modules \(Tiny\) names 'Layer'"):
        _units(make_model(), FSDP, ["Layer"])
    with pytest.raises(ConfigError, match="container has no forward"):
        _units(make_model(), FSDPConfig(wrap_modules=["ModuleList"]), None)
    with pytest.raises(ConfigError, match="selects no submodule.*'blocks'.*2144"):
        _units(make_model(), FSDPConfig(min_num_params=10**6), None)


class TiedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, D)
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Linear(D, 10, bias=False)
        self.head.weight = self.embed.weight


def test_tied_weights_across_units_are_refused() -> None:
    model = TiedLM()
    check_tied_weights(model, WrapUnits(("blocks.0", "blocks.1")))  # both ends in the root: fine
    with pytest.raises(ConfigError) as err:
        check_tied_weights(model, WrapUnits(("embed", "blocks.0", "blocks.1")))
    assert str(err.value).startswith(
        "tied weights cannot be split across FSDP units: parameter 'embed.weight' of module 'embed' "
        "(in FSDP unit 'embed') is the same tensor as 'head.weight' of module 'head' (in the root, outside "
        "every wrap unit)"
    )
    model.blocks[1].fc2.weight = model.blocks[0].fc2.weight
    with pytest.raises(ConfigError, match="'blocks.0.fc2.weight' of module 'blocks.0.fc2' \\(in FSDP unit 'blocks.0'\\)"
                       ".*'blocks.1.fc2.weight' of module 'blocks.1.fc2' \\(in FSDP unit 'blocks.1'\\)"):
        check_tied_weights(model, WrapUnits(("blocks.0", "blocks.1")))


@pytest.mark.parametrize(
    ("fsdp", "match"),
    [
        (FSDPConfig(ignored_modules="hea"), "matches no module path .*'inp', 'blocks'"),
        (FSDPConfig(ignored_modules="(head"), "not a valid regex"),
        (FSDPConfig(ignored_modules="blocks.*"), "every FSDP wrap unit lies inside"),
        (FSDPConfig(wrap_modules=["Embedding", "Block"]), "tied weights cannot be split"),
    ],
)
def test_sharded_units_refuse_before_any_collective(fsdp: FSDPConfig, match: str) -> None:
    """Resolved when the model is built, before the mesh exists, so no process group is needed."""
    model = TiedLM() if fsdp.wrap_modules else make_model()
    with pytest.raises(ConfigError, match=match):
        _units(model, fsdp, ["Block"])


def test_parallelize_refuses_flags_whose_units_were_not_resolved() -> None:
    single = ParallelDims.resolve(ParallelismConfig(), 1)
    with pytest.raises(ValueError, match="no wrap units"):
        parallelize(make_model(), WrapUnits(), single, AcceleratorConfig(activation_checkpointing=True),
                    torch.device("cpu"), weights_from_main=True)
