"""Unit groups (``wrap_units.UnitGroup``): how a policy's groups are resolved, refused,
checkpointed, compiled and planned; their sharding on real processes is tests/integration/test_unit_groups.py."""

from __future__ import annotations

import functools
import inspect
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from joint_toy import DEPTH, joint_batch, joint_loss, make_joint  # noqa: E402
from lerobot_kit.core.config.schema import AcceleratorConfig, FSDPConfig, ParallelismConfig  # noqa: E402
from lerobot_kit.core.errors import ConfigError, PluginError  # noqa: E402
from lerobot_kit.core.parallel.activation_checkpointing import checkpoint_groups, is_checkpointed  # noqa: E402
from lerobot_kit.core.parallel.compile import apply_compile  # noqa: E402
from lerobot_kit.core.parallel.dims import ParallelDims  # noqa: E402
from lerobot_kit.core.parallel.wrap_units import UnitGroup, WrapUnits, resolve_wrap_units  # noqa: E402
from lerobot_kit.core.plan.memory_plan import plan_model  # noqa: E402

SHARDED = ParallelDims.resolve(ParallelismConfig(dp_shard=2), 2)
PAIRS = tuple(UnitGroup((f"tower_a.{i}", f"tower_b.{i}"), "joint") for i in range(DEPTH))


def test_groups_are_units_of_a_sharded_run_without_any_class() -> None:
    wrap = resolve_wrap_units(make_joint(), SHARDED, AcceleratorConfig(), None)
    assert wrap == WrapUnits((), "", (), PAIRS)
    assert wrap.any and wrap.count == DEPTH
    assert wrap.unit_of("tower_b.1.mlp.weight") == "tower_a.1+tower_b.1"
    assert wrap.unit_of("head.weight") == ""


def test_single_module_groups_are_plain_units_in_model_order() -> None:
    model = make_joint()
    model.fsdp_unit_groups = lambda: [UnitGroup(("head",)), *PAIRS, UnitGroup(("inp_b",))]  # type: ignore[method-assign]
    wrap = resolve_wrap_units(model, SHARDED, AcceleratorConfig(), None)
    assert wrap == WrapUnits(("inp_b", "head"), "policy", (), PAIRS)


def test_a_class_unit_inside_a_group_is_refused() -> None:
    accel = AcceleratorConfig(fsdp=FSDPConfig(wrap_modules=["Layer"]))
    with pytest.raises(ConfigError) as err:
        resolve_wrap_units(make_joint(), SHARDED, accel, None)
    assert str(err.value) == (
        "wrap unit 'tower_a.0' (Layer) overlaps module 'tower_a.0' of the policy's unit group "
        "'tower_a.0+tower_b.0', which runs through joint: name other classes in --accelerator.fsdp.wrap_modules"
    )


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ([UnitGroup(("tower_a.0", "tower_z.0"), "joint")],
         "Joint.fsdp_unit_groups() names 'tower_z.0', which is not a submodule of Joint"),
        ([UnitGroup(("tower_a.0", "tower_b.0"), "joint"), UnitGroup(("tower_b.0.q",))],
         "Joint.fsdp_unit_groups(): module 'tower_b.0.q' (unit 'tower_b.0.q') overlaps 'tower_b.0' "
         "(unit 'tower_a.0+tower_b.0'); a module belongs to one unit"),
        ([UnitGroup(("tower_b.0", "tower_a.0"), "joint")],
         "Joint.fsdp_unit_groups(): unit 'tower_b.0+tower_a.0' is run by 'joint', which module 'tower_b.0' "
         "(Layer) does not have"),
        ([UnitGroup(())], "Joint.fsdp_unit_groups() declares a group of no modules"),
    ],
)
def test_wrong_declarations_fail_at_start_up(groups: list[UnitGroup], message: str) -> None:
    model = make_joint()
    model.fsdp_unit_groups = lambda: groups  # type: ignore[method-assign]
    with pytest.raises(PluginError) as err:
        resolve_wrap_units(model, SHARDED, AcceleratorConfig(), None)
    assert str(err.value) == message


def test_groups_are_found_through_a_wrapper_with_their_prefix() -> None:
    wrapper = torch.nn.Module()
    wrapper.inner = make_joint()
    wrap = resolve_wrap_units(wrapper, SHARDED, AcceleratorConfig(), None)
    assert wrap.groups[0] == UnitGroup(("inner.tower_a.0", "inner.tower_b.0"), "joint")


def test_checkpointing_a_group_wraps_its_method_and_keeps_the_numbers() -> None:
    x, y = joint_batch(0, 3)
    plain = make_joint()
    joint_loss(plain, x, y).backward()
    checkpointed = make_joint()
    checkpoint_groups(checkpointed, PAIRS)
    assert all(is_checkpointed(checkpointed.tower_a[i], "joint") for i in range(DEPTH))
    assert not is_checkpointed(checkpointed.tower_a[0])  # forward untouched
    joint_loss(checkpointed, x, y).backward()
    for (name, a), (_, b) in zip(plain.named_parameters(), checkpointed.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-6, atol=1e-7, msg=name)
    with pytest.raises(ValueError, match="unit 'tower_a.0\\+tower_b.0' is already activation-checkpointed"):
        checkpoint_groups(checkpointed, PAIRS[:1])


def test_compiling_a_group_compiles_its_method_in_place() -> None:
    """The method that runs a group is what compiles (its modules' forwards never run), also
    under its checkpoint; the real compiled runs are in tests/integration/test_unit_groups.py."""
    model = make_joint()
    checkpoint_groups(model, PAIRS)
    methods = [model.tower_a[i].joint for i in range(DEPTH)]
    apply_compile(model, WrapUnits((), "", (), PAIRS))
    for i, method in enumerate(methods):
        compiled = model.tower_a[i].joint
        assert compiled is not method and hasattr(compiled, "_torchdynamo_orig_callable")
        assert inspect.unwrap(compiled, stop=lambda f: isinstance(f, functools.partial)) is method
        assert is_checkpointed(model.tower_a[i], "joint")
        assert "forward" not in vars(model.tower_a[i])  # the layer's own forward is left alone


def test_the_plan_counts_a_group_as_one_unit() -> None:
    model = make_joint()
    wrap = resolve_wrap_units(model, SHARDED, AcceleratorConfig(), None)
    plan = plan_model(model, SHARDED, AcceleratorConfig(), wrap)
    pair = sum(p.numel() for p in model.tower_a[0].parameters()) + sum(p.numel() for p in model.tower_b[0].parameters())
    assert [(u.path, u.class_name, u.params) for u in plan.units] == [
        (f"tower_a.{i}+tower_b.{i}", "Layer+Layer", pair) for i in range(DEPTH)
    ]
    assert plan.root_params == plan.total_params - DEPTH * pair
    assert plan.largest_gather_unit == "tower_a.0+tower_b.0" and plan.largest_gather_bytes == 4 * pair
