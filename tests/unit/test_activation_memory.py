"""The pieces of ``lerobot plan``'s activation figures: the storage timeline, the batch
shaped from metadata, the traced step's dtypes under FSDP2 mixed precision, and the
batch-size search. The figures against real CPU steps are in
``integration/test_plan_activations.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest
import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy

from lerobot_dataset_factory import write_lerobot_dataset
from lerobot_kit.core.config.flags import parse_train_config
from lerobot_kit.core.config.schema import TrainConfig
from lerobot_kit.core.data.build import build_dataset
from lerobot_kit.core.data.loader import batch_to_device, build_loader
from lerobot_kit.core.data.sampler import DataPosition
from lerobot_kit.core.plan.activation_memory import (
    FSDPCompute,
    StepTracer,
    TrainStep,
    UntraceableStep,
    item_shapes,
    policy_inputs,
)
from lerobot_kit.core.plan.batch_fit import largest_batch
from lerobot_kit.core.plan.live_bytes import StorageTimeline

KIB = 1024


def test_timeline_counts_new_storages_once_until_freed() -> None:
    timeline = StorageTimeline()
    with timeline:
        a = torch.zeros(KIB)  # 4 KiB
        view = a[: KIB // 2]  # aliases a: nothing new
        a.add_(1.0)  # in place: nothing new
        b = a * 2  # 4 KiB more: 8 KiB live
        del a, view, b  # all freed
        c = torch.zeros(KIB // 4)  # 1 KiB
        keep = torch.zeros(3 * KIB)  # 12 KiB: 13 KiB live, the peak
        del c
    assert timeline.peak_bytes() == 13 * KIB
    # Leaving out a storage still alive takes it out of the whole timeline.
    assert timeline.peak_bytes(excluding=[keep]) == 8 * KIB


def test_storages_of_inputs_are_never_counted() -> None:
    param = torch.zeros(4 * KIB)  # exists before: a parameter
    timeline = StorageTimeline()
    with timeline:
        param.mul_(2.0)
        rows = param.view(4, KIB).t()
    assert rows.untyped_storage().data_ptr() == param.untyped_storage().data_ptr()
    assert timeline.peak_bytes() == 0


def _trainer_batch(flags: list[str]) -> tuple[dict[str, torch.Tensor], TrainConfig]:
    """The first batch the trainer computes with (its ``epoch`` key included): the loader's,
    moved to the device as the trainer moves it (cameras float there), and the config."""
    config = parse_train_config([*flags, "--num_workers=0"])
    dataset = build_dataset(config)
    loader = build_loader(dataset, config, 1, 0, DataPosition(), torch.device("cpu"))
    return batch_to_device(next(iter(loader)), torch.device("cpu"), dataset.meta.image_keys()), config


def _shapes_of(batch: dict[str, torch.Tensor]) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The tensors' per-sample shapes; a LeRobot dataset's task text is no tensor, and a plan traces none."""
    return {key: (tuple(value.shape[1:]), value.dtype) for key, value in batch.items() if isinstance(value, torch.Tensor)}


@pytest.mark.parametrize(
    "flags",
    [
        ["--dataset.image=true"],  # ACT: an action chunk
        ["--dataset.image=true", "--policy.type=diffusion", "--policy.n_obs_steps=2"],  # state and camera history
    ],
    ids=["act", "diffusion"],
)
def test_item_shapes_are_those_of_a_loaded_batch(flags: list[str]) -> None:
    batch, config = _trainer_batch(["--dataset.num_episodes=2", "--dataset.episode_length=10", "--batch_size=3", *flags])
    shapes = item_shapes(build_dataset(config).meta, config.policy.delta_indices())
    assert shapes == _shapes_of(batch)


def test_item_shapes_of_a_lerobot_dataset_with_two_cameras(tmp_path: Path) -> None:
    write_lerobot_dataset(tmp_path, [6, 9], image=True, video=True)
    batch, config = _trainer_batch(["--dataset.repo_id=user/x", f"--dataset.root={tmp_path}", "--policy.type=diffusion",
                                    "--policy.n_obs_steps=2", "--batch_size=2"])
    shapes = item_shapes(build_dataset(config).meta, config.policy.delta_indices())
    assert sum(key.startswith("observation.images.") for key in shapes) == 4  # two cameras and their pad masks
    assert shapes == _shapes_of(batch)


class _Seen(nn.Module):
    """A layer that records the dtypes it computes with, in a class-level log (the tracer
    works on a deep copy of the model, which would copy a log held by the instance)."""

    log: ClassVar[list[tuple[str, torch.dtype, torch.dtype]]] = []

    def __init__(self, name: str) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.name = name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.log.append((self.name, x.dtype, self.linear.weight.dtype))
        return self.linear(x)


class _TwoUnits(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        _Seen.log.clear()
        self.unit = _Seen("unit")
        self.ignored = _Seen("ignored")

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        out = self.ignored(self.unit(batch["x"]))
        return out.float().square().mean(), {}


def _step(model: nn.Module, fsdp: FSDPCompute | None, autocast: torch.dtype | None = None) -> TrainStep:
    return TrainStep(model, lambda batch: batch, {"x": ((8,), torch.float32)}, autocast, fsdp)


def test_sharded_step_computes_in_fsdp_param_dtype() -> None:
    """As FSDP2 does: managed parameters gathered in param_dtype, each FSDP module's float
    inputs cast to it and outputs to output_dtype; ignored modules keep their parameters
    (the run's autocast lets them take low-precision inputs)."""
    with torch.device("meta"):
        model = _TwoUnits()
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, output_dtype=torch.float16)
    fsdp = FSDPCompute(policy, ("", "unit"), ("ignored",))
    StepTracer(_step(model, fsdp, autocast=torch.bfloat16), None).peak_bytes(4)
    bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
    # The unit's output leaves it as float16, which the ignored module (no FSDP module) takes as it is.
    assert _Seen.log == [("unit", bf16, bf16), ("ignored", fp16, fp32)]
    assert all(p.dtype == fp32 for p in model.parameters()), "the planned model itself is left as built"


def test_unsharded_step_computes_in_the_parameters_dtype() -> None:
    with torch.device("meta"):
        model = _TwoUnits()
    assert StepTracer(_step(model, None), None).peak_bytes(4) > 0
    assert _Seen.log == [("unit", torch.float32, torch.float32), ("ignored", torch.float32, torch.float32)]


class _ReadsValues(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 1)

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        out = self.linear(batch["x"]).mean()
        return (out if out > 0 else -out), {}


def test_a_step_that_reads_tensor_values_is_untraceable() -> None:
    with torch.device("meta"):
        model = _ReadsValues()
    with pytest.raises(UntraceableStep, match="depends on tensor values"):
        StepTracer(_step(model, None), None).peak_bytes(2)


class _SelectsByMask(nn.Module):
    """Boolean-mask indexing (``aten.nonzero``): how many rows it keeps depends on values."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 256)

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        hidden = self.linear(batch["x"])
        return hidden[batch["x"][:, :1].expand_as(hidden) > 0].sum(), {}


def test_a_size_that_depends_on_values_counts_at_its_largest() -> None:
    with torch.device("meta"):
        model = _SelectsByMask()
    peak = StepTracer(_step(model, None), None).peak_bytes(64)
    # The real step, every row kept (the largest selection): the traced peak is not below it.
    real = _SelectsByMask()
    timeline = StorageTimeline()
    with timeline:
        batch = {"x": torch.ones(64, 8)}
        loss, _ = real(batch)
        loss.backward()
    grads = [p.grad for p in real.parameters()]
    selected_bytes = 64 * 256 * 4
    assert peak >= timeline.peak_bytes(excluding=grads) > selected_bytes


def _convex(batch_size: int) -> int:
    """Linear, then steeper past 300: a peak that moves to another moment of the step."""
    return 5_000 + 1_000 * batch_size + 4_000 * max(0, batch_size - 300)


@pytest.mark.parametrize("budget", [6_999, 7_000, 7_999, 123_456, 305_000, 320_000, 10**7])
def test_largest_batch_is_traced_and_the_next_is_too(budget: int) -> None:
    fixed = 1_000
    fit = largest_batch(_convex, fixed, budget)
    fitting = [b for b in range(1, 10_000) if fixed + _convex(b) <= budget]
    expected = max(fitting) if fitting else None
    assert fit.largest == expected
    if expected is not None:
        assert fit.needs(expected) <= budget < fit.needs(expected + 1)
    assert all(fit.traced[b] == _convex(b) for b in fit.traced)
    assert len(fit.traced) <= 12, sorted(fit.traced)  # guided by the line, not a scan


def test_policy_inputs_are_what_a_policy_config_declares() -> None:
    """A language policy's prompt tokens join the traced batch, shaped as its config says;
    a config without ``plan_inputs`` adds nothing."""

    class Prompted:
        def plan_inputs(self) -> dict[str, tuple[list[int], str]]:
            return {"observation.language.tokens": ([48], "int64"), "observation.language.attention_mask": ([48], "bool")}

    assert policy_inputs(Prompted()) == {
        "observation.language.tokens": ((48,), torch.int64),
        "observation.language.attention_mask": ((48,), torch.bool),
    }
    assert policy_inputs(parse_train_config([]).policy) == {}
