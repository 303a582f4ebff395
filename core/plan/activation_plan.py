"""The activation figures of ``lerobot plan``: one traced step at ``--batch_size`` with and
without activation checkpointing, its FLOPs, and on request the largest batch a device holds.

Both figures are always given, whatever ``--accelerator.activation_checkpointing`` says,
because the plan is where one decides whether to turn it on. The checkpointed figure
uses the units the run would checkpoint: the run's wrap units when it has them, else
the ones ``resolve_wrap_units`` picks once checkpointing is on — the same call the run
makes, so a plan and a run cannot disagree on them. The FLOPs are the step's without
checkpointing's recomputation: the model's work, which model FLOP utilisation divides by.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lerobot_kit.core.data.dataset import DatasetMeta
from lerobot_kit.core.errors import ConfigError
from lerobot_kit.core.model.processor import PolicyProcessor
from lerobot_kit.core.parallel.precision import autocast_dtype, build_mp_policy
from lerobot_kit.core.parallel.wrap_units import WrapUnits, outermost, resolve_wrap_units
from lerobot_kit.core.plan.activation_memory import (
    FSDPCompute,
    ItemShapes,
    StepTracer,
    TrainStep,
    UntraceableStep,
    item_shapes,
    policy_inputs,
)
from lerobot_kit.core.plan.batch_fit import BatchFit, largest_batch
from lerobot_kit.core.run.assemble import BuiltModel, declared_wrap_modules
from lerobot_kit.core.run.spec import RunSpec

GIB = 2**30
# What the figures hold, said in the plan's text and JSON.
COUNTED = (
    "the batch on the device, activations, tensors autograd saves for the backward and temporaries, "
    "at their highest point in one forward and backward; parameters, gradients and optimizer state are not in it"
)


@dataclass(frozen=True)
class ActivationPlan:
    batch_size: int  # --batch_size, the micro-batch of each data-parallel rank
    item: ItemShapes  # one dataset item's tensors, as the traced batch stacks them
    peak_bytes: int | None  # without activation checkpointing; None when not traced
    checkpointed_peak_bytes: int | None  # with it; None when not traced or no unit to checkpoint
    step_flops: int | None  # forward and backward at batch_size, without recomputation; None when not traced
    checkpoint_units: int  # how many modules checkpointing wraps (the outermost units)
    checkpointing: bool  # the run's flags turn it on
    not_traced: str | None  # why there are no figures at all
    no_checkpointing: str | None  # why there is no checkpointed figure
    fit: BatchFit | None  # --plan.device_memory_gb given and traced

    def to_json(self) -> dict[str, Any]:
        fit = self.fit
        return {
            "batch_size": self.batch_size,
            "batch": {
                key: {"shape": [self.batch_size, *shape], "dtype": str(dtype).removeprefix("torch.")}
                for key, (shape, dtype) in self.item.items()
            },
            "counted": COUNTED,
            "peak_bytes": self.peak_bytes,
            "checkpointed_peak_bytes": self.checkpointed_peak_bytes,
            "step_flops": self.step_flops,
            "checkpoint_units": self.checkpoint_units,
            "activation_checkpointing": self.checkpointing,
            "not_traced": self.not_traced,
            "no_checkpointing": self.no_checkpointing,
            "batch_fit": None if fit is None else {
                "budget_bytes": fit.budget_bytes,
                "fixed_bytes": fit.fixed_bytes,
                "activation_checkpointing": self.checkpointing,
                "largest_batch_size": fit.largest,
                "traced_activation_bytes": {str(b): a for b, a in sorted(fit.traced.items())},
            },
        }


def plan_activations(
    built: BuiltModel,
    spec: RunSpec,
    meta: DatasetMeta,
    preprocessor: PolicyProcessor,
    device_bytes: int,
    device_memory_gb: float | None,
) -> ActivationPlan:
    """The figures for ``spec``'s run; ``device_bytes`` is what its device holds besides
    activations (for the fit against ``device_memory_gb``)."""
    config = spec.config
    accel = config.accelerator
    item = {**item_shapes(meta, config.policy.delta_indices()), **policy_inputs(config.policy)}
    mp_policy = build_mp_policy(accel) if spec.dims.sharded else None
    fsdp = FSDPCompute(mp_policy, ("", *built.wrap.paths), built.wrap.ignored_modules) if mp_policy else None
    step = TrainStep(built.model, preprocessor, item, autocast_dtype(accel), fsdp)
    units, no_checkpointing = _checkpoint_units(built, spec)
    figures: dict[str, Any] = dict(
        batch_size=config.batch_size, item=item, checkpoint_units=len(outermost(units.paths)) + len(units.groups),
        checkpointing=accel.activation_checkpointing,
    )
    try:
        plain = _Traces(StepTracer(step, None))
        checkpointed = _Traces(StepTracer(step, units.paths, units.groups)) if units.any else None
        fit = None
        if device_memory_gb is not None:
            run = checkpointed if accel.activation_checkpointing else plain
            assert run is not None  # the run checkpoints only with units, or resolve_run refused it
            fit = largest_batch(run.peak_bytes, device_bytes, int(device_memory_gb * GIB))
        return ActivationPlan(
            **figures,
            peak_bytes=plain.peak_bytes(config.batch_size),
            checkpointed_peak_bytes=checkpointed.peak_bytes(config.batch_size) if checkpointed else None,
            step_flops=plain.flops(config.batch_size),
            not_traced=None,
            no_checkpointing=no_checkpointing,
            fit=fit,
        )
    except UntraceableStep as exc:
        return ActivationPlan(
            **figures, peak_bytes=None, checkpointed_peak_bytes=None, step_flops=None, not_traced=str(exc),
            no_checkpointing=no_checkpointing, fit=None,
        )


class _Traces:
    """A tracer's figures by batch size, each traced once (the fit revisits ``--batch_size``)."""

    def __init__(self, tracer: StepTracer) -> None:
        self._tracer = tracer
        self._bytes: dict[int, int] = {}

    def peak_bytes(self, batch_size: int) -> int:
        if batch_size not in self._bytes:
            self._bytes[batch_size] = self._tracer.peak_bytes(batch_size)
        return self._bytes[batch_size]

    def flops(self, batch_size: int) -> int:
        return self._tracer.flops(batch_size)


def _checkpoint_units(built: BuiltModel, spec: RunSpec) -> tuple[WrapUnits, str | None]:
    """The units checkpointing wraps in this run (or would, once turned on), else why none."""
    if built.wrap.any:
        return built.wrap, None
    accel = spec.config.accelerator.model_copy(update={"activation_checkpointing": True})
    try:
        return resolve_wrap_units(built.model, spec.dims, accel, declared_wrap_modules(built.model)), None
    except ConfigError:
        return WrapUnits(), (
            "no wrap units to checkpoint: the policy declares none; name them with "
            "--accelerator.fsdp.wrap_modules or --accelerator.fsdp.min_num_params"
        )
