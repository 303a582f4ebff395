"""Model FLOPs of one training sample, counted once before the first step, for MFU.

MFU divides the model's own work by what the devices could do, so the work is counted on
the policy as built, before ``parallelize``: forward and backward of one
micro-batch at ``--batch_size``, divided by it, with no activation checkpointing
recomputation, no compile fusion and no FSDP cast in it ("model FLOPs", not hardware
FLOPs). ``torch.utils.flop_counter`` counts matrix products, convolutions and attention,
the operations that dominate a policy's step; element-wise work is not counted.

The step is traced on a copy of the policy whose tensors are fake (shapes and dtypes, no
data), so the trace costs the same for any batch, allocates no memory for weights,
activations or gradients, and leaves the policy, its weights and every random number
generator as they were. The batch is the dataset's first item run through the run's
preprocessor, so every entry the policy reads (a language policy's tokens too) has the
shape training gives it; its entries are then widened to the micro-batch as fake tensors.
Where an entry's length depends on the data (a prompt padded to the longest of its batch),
the figure is that item's. The policy's ``forward`` does run once on the fake batch: a
policy that writes what it sees somewhere sees this call too.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeCopyMode, FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from lerobot_kit.core.data.dataset import EPOCH_KEY, PolicyDataset
from lerobot_kit.core.data.loader import collate
from lerobot_kit.core.errors import first_line

Batch = dict[str, Any]


@dataclass(frozen=True)
class SampleFlops:
    """Forward-and-backward FLOPs of one training sample, or why they were not counted."""

    per_sample: int | None
    not_counted: str | None = None


def count_sample_flops(
    model: nn.Module, dataset: PolicyDataset, preprocessor: Callable[[Batch], Batch], batch_size: int
) -> SampleFlops:
    """The model's FLOPs per sample at the run's micro-batch, for ``model`` before any
    parallelism. Any failure is returned, not raised: a policy the trace cannot follow
    trains as well as any other, it only goes without MFU."""
    try:
        item = dict(dataset[0])
        item[EPOCH_KEY] = torch.tensor(0, dtype=torch.int64)  # as the training loader adds it
        flops = training_flops_per_sample(model, preprocessor(collate([item])), batch_size)
    except Exception as exc:  # noqa: BLE001 - a measurement; the run must not depend on it
        return SampleFlops(None, f"{type(exc).__name__}: {first_line(exc)}")
    if not flops:
        return SampleFlops(None, "the step has no matrix product, convolution or attention to count")
    return SampleFlops(flops)


def training_flops_per_sample(model: nn.Module, sample: Batch, batch_size: int) -> int:
    """Forward-and-backward FLOPs of ``model`` on ``sample`` (one preprocessed sample, a
    leading dimension of 1 on each tensor) widened to ``batch_size``, divided by it.
    ``model(batch)`` returns ``(loss, logs)``, as a policy does. Counted at the micro-batch
    rather than at 1 because some layers refuse a batch of one in training (BatchNorm)."""
    # allow_non_fake_inputs: tensors the policy holds outside its parameters and buffers
    # (constants, a processor's stats) stay real. The shape environment gives an op whose
    # output size depends on values (boolean-mask indexing) a symbolic size instead of
    # failing; static_shapes keeps every other size concrete.
    mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv(), static_shapes=True)
    with FakeCopyMode(mode):
        traced = copy.deepcopy(model)
    traced.train()  # as the trainer runs it: training-only branches (ACT's VAE encoder) count
    counter = FlopCounterMode(display=False)
    with torch.random.fork_rng(devices=[]), mode, counter, _ScalarsReadAsZero():
        batch = {key: _widen(value, batch_size) for key, value in sample.items()}
        loss, _logs = traced(batch)
        loss.backward()
    return int(counter.get_total_flops()) // batch_size


class _ScalarsReadAsZero(TorchDispatchMode):
    """A value the policy reads from a tensor (``.item()``, ``if mask.any():``) is 0 (False):
    fake tensors have none. Without this a random crop (``torch.randint(...).item()`` as
    its offset, as torchvision's ``RandomCrop`` does) would stop the trace; with it the
    crop is taken at offset 0, which computes the same."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten._local_scalar_dense.default:
            dtype = args[0].dtype
            if dtype == torch.bool:
                return False
            return 0.0 if dtype.is_floating_point or dtype.is_complex else 0
        return func(*args, **(kwargs or {}))


def _widen(value: Any, batch_size: int) -> Any:
    """One sample's entry as the micro-batch's (a fake tensor: shape and dtype only)."""
    if isinstance(value, torch.Tensor):
        if value.dim() == 0 or value.shape[0] != 1:
            return value
        return torch.empty((batch_size, *value.shape[1:]), dtype=value.dtype)
    if isinstance(value, list) and len(value) == 1:  # text per sample (a frame's task)
        return value * batch_size
    return value
