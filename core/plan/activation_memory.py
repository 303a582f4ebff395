"""Per-rank peak memory and FLOPs of one training step, from a trace on fake tensors.

``lerobot plan`` cannot run the step for real: the model may not fit the machine that
plans it. So the policy (built on the meta device, as for the sharding plan) is given
``FakeTensorMode`` parameters — tensors with shapes, dtypes and storages but no data —
and one step runs on them exactly as the trainer runs it: a batch shaped like the
dataset's items, the preprocessor, the forward under the run's autocast, and the
backward. ``StorageTimeline`` follows every storage the step allocates and frees, so
the peak holds the batch on the device, the activations, the tensors autograd saves
for the backward and the temporaries alive at that moment, and nothing else:
parameters exist before the step, and the storages that end as parameter gradients are
taken out (the plan counts gradients at their sharded size). A second trace of the same
step counts its FLOPs with ``torch.utils.flop_counter``, which needs shapes only: the
figure a GPU run's model FLOP utilisation is computed from, known before any GPU runs it.

What the run changes is applied to the traced copy the way the run applies it:
activation checkpointing with the run's own ``apply_activation_checkpointing`` on the
wrap units, and, for sharded layouts, what FSDP2's ``MixedPrecisionPolicy`` does to
compute — parameters gathered in ``param_dtype`` (ignored modules keep theirs) and each
FSDP module's floating-point inputs cast to it (``cast_forward_inputs``), outputs to
``output_dtype``. Kernels are CPU kernels (fake CUDA tensors need a CUDA build), and
``--accelerator.compile`` is not traced: compiled units fuse some temporaries away.
"""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException, FakeTensorMode
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode, ShapeEnv
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.utils._pytree import tree_map
from torch.utils.flop_counter import FlopCounterMode

from lerobot_kit.core.data.dataset import EPOCH_KEY, INDEX_KEY, DatasetMeta, pad_key
from lerobot_kit.core.data.windows import expand_delta_indices
from lerobot_kit.core.errors import ConfigError
from lerobot_kit.core.parallel.activation_checkpointing import apply_activation_checkpointing
from lerobot_kit.core.parallel.activation_checkpointing import checkpoint_groups as checkpoint_groups_of
from lerobot_kit.core.parallel.unit_group import UnitGroup
from lerobot_kit.core.plan.live_bytes import StorageTimeline, UnboundedSize

ItemShapes = dict[str, tuple[tuple[int, ...], torch.dtype]]


class UntraceableStep(Exception):
    """The policy's step reads tensor values (``if x.any():``), which a shape-only trace has not."""


def item_shapes(meta: DatasetMeta, delta_indices: dict[str, list[int]]) -> ItemShapes:
    """Shape and dtype of every tensor of one dataset item, from the metadata alone (no frame
    is read), following ``PolicyDataset``'s item contract: images as float32, features the
    policy stacks over frame offsets as ``[offsets, *shape]`` with a bool ``_is_pad`` mask,
    the int64 ``episode_index`` / ``index`` scalars, and the ``epoch`` the training loader adds."""
    offsets = expand_delta_indices(delta_indices, {k: f.is_image for k, f in meta.features.items()})
    shapes: ItemShapes = {}
    for key, spec in meta.features.items():
        dtype = torch.float32 if spec.is_image else getattr(torch, spec.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise ConfigError(
                f"dataset feature {key!r} has dtype {spec.dtype!r}, which is no torch dtype: lerobot plan cannot "
                "shape a batch of it"
            )
        if key in offsets:
            steps = len(offsets[key])
            shapes[key] = ((steps, *spec.shape), dtype)
            shapes[pad_key(key)] = ((steps,), torch.bool)
        else:
            shapes[key] = (tuple(spec.shape), dtype)
    shapes["episode_index"] = shapes[INDEX_KEY] = shapes[EPOCH_KEY] = ((), torch.int64)
    return shapes


def policy_inputs(policy_config: Any) -> ItemShapes:
    """Batch entries the run's preprocessor makes from values a shape-only trace has not (a
    language policy's prompt tokens, from the task's text), as the policy config's
    ``plan_inputs()`` names them: entry -> (shape of one sample, dtype name); none when it
    has no such method. A plan then traces these entries instead of running that
    preprocessor, whose files (a tokenizer) it does not need."""
    declared = getattr(policy_config, "plan_inputs", None)
    if not callable(declared):
        return {}
    return {key: (tuple(shape), getattr(torch, dtype)) for key, (shape, dtype) in declared().items()}


@dataclass(frozen=True)
class FSDPCompute:
    """What FSDP2 changes in the forward of a sharded run: its precision policy, the paths
    of the FSDP modules (wrap units and the root ``""``) and of the ignored modules."""

    policy: MixedPrecisionPolicy
    fsdp_modules: tuple[str, ...]
    ignored_modules: tuple[str, ...]


@dataclass(frozen=True)
class TrainStep:
    """One micro-step of a run, as the trainer takes it, minus the data."""

    model: nn.Module  # on the meta device; copied, never changed
    preprocessor: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]
    item: ItemShapes
    autocast: torch.dtype | None  # --accelerator.mixed_precision
    fsdp: FSDPCompute | None  # sharded layouts with a precision policy


class StepTracer:
    """Peak activation bytes and FLOPs of ``step`` at any batch size, with or without checkpointing.

    The fake model is made once and reused by every trace (gradients cleared between
    them), because giving a large policy fake parameters costs as much as a trace.
    """

    def __init__(
        self, step: TrainStep, checkpoint_units: Sequence[str] | None, checkpoint_groups: Sequence[UnitGroup] = ()
    ) -> None:
        self._step = step
        # allow_non_fake_inputs: the processor's stats are real tensors. The shape environment
        # gives an op whose output size depends on values (boolean-mask indexing, as SmolVLM's
        # vision embeddings do) a symbolic size, counted at its largest; static_shapes keeps
        # every other size concrete.
        self._mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv(), static_shapes=True)
        self._model = copy.deepcopy(step.model)
        if checkpoint_units:
            apply_activation_checkpointing(self._model, list(checkpoint_units))
        if checkpoint_groups:  # unit groups: through the method that runs each, as the run does
            checkpoint_groups_of(self._model, list(checkpoint_groups))
        with self._mode:
            self._model.to_empty(device="cpu")
            if step.fsdp is not None:
                _compute_like_fsdp(self._model, step.fsdp)

    def peak_bytes(self, batch_size: int) -> int:
        timeline = StorageTimeline()
        grads = self._run(batch_size, timeline)
        return timeline.peak_bytes(excluding=grads)

    def flops(self, batch_size: int) -> int:
        """Matrix products, convolutions and attention, forward and backward (recomputation
        included), counted in a trace of their own: the counter decomposes ops it has no
        formula for and tracks modules, which would change the storages a memory trace sees."""
        counter = FlopCounterMode(display=False)
        self._run(batch_size, counter)
        return int(counter.get_total_flops())

    def _run(self, batch_size: int, watcher: contextlib.AbstractContextManager[Any]) -> list[torch.Tensor]:
        """One step at ``batch_size`` under ``watcher``; the gradients it left (then cleared)."""
        step, model = self._step, self._model
        autocast = (
            torch.autocast(device_type="cpu", dtype=step.autocast) if step.autocast else contextlib.nullcontext()
        )
        try:
            with self._mode, watcher:
                batch = {k: torch.empty((batch_size, *shape), dtype=dtype) for k, (shape, dtype) in step.item.items()}
                batch = step.preprocessor(batch)
                with autocast:
                    loss, _logs = model(batch)
                loss.backward()
        except (DataDependentOutputException, DynamicOutputShapeException, GuardOnDataDependentSymNode,
                UnboundedSize) as exc:
            raise UntraceableStep(f"the policy's step depends on tensor values ({_first_line(exc)})") from exc
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        model.zero_grad(set_to_none=True)
        return grads


def _first_line(exc: Exception) -> str:
    """An exception's first line: torch's data-dependent errors explain themselves for pages."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _cast_floats(dtype: torch.dtype, tree: Any) -> Any:
    """FSDP2's cast: floating-point tensors to ``dtype``, anything else as it is."""
    return tree_map(lambda x: x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x, tree)


def _compute_like_fsdp(model: nn.Module, fsdp: FSDPCompute) -> None:
    """Give ``model`` (fake) the dtypes FSDP2 computes in: managed floating-point
    parameters in ``param_dtype``, and each FSDP module's inputs and outputs cast as
    its policy says. Hooks sit on the modules themselves, outside any checkpointed
    forward, where ``fully_shard`` puts its own."""
    policy = fsdp.policy
    kept = {id(p) for path in fsdp.ignored_modules for p in model.get_submodule(path).parameters()}
    if policy.param_dtype is not None:
        for param in model.parameters():
            if id(param) not in kept and param.is_floating_point():
                param.data = torch.empty_like(param, dtype=policy.param_dtype)
    for path in fsdp.fsdp_modules:
        module = model.get_submodule(path)
        if policy.cast_forward_inputs and policy.param_dtype is not None:
            cast_in = functools.partial(_cast_floats, policy.param_dtype)
            module.register_forward_pre_hook(lambda _m, args, kwargs, f=cast_in: f((args, kwargs)), with_kwargs=True)
        if policy.output_dtype is not None:
            cast_out = functools.partial(_cast_floats, policy.output_dtype)
            module.register_forward_hook(lambda _m, _args, output, f=cast_out: f(output))
