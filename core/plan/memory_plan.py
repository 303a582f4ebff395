"""The sharding plan of a run, computed in one process without training (``lerobot plan``).

The model is built on the meta device (shapes, no storage), then wrap units, ignored
modules and tied-weight checks are resolved once by ``wrap_units.resolve_wrap_units``, as for the run,
so a plan fails exactly where the run would, before anyone books 64 GPUs.

Per-rank bytes follow FSDP2: each managed parameter is split on dim 0 with
``torch.chunk`` over the ``dp_shard`` ranks, so rank 0 holds ``ceil(rows / S)`` rows and
the others at most that; the plan reports rank 0, the maximum. Gradients have the
shard's shape and the parameter's dtype (FSDP2 casts reduced gradients back to it);
AdamW keeps ``exp_avg`` and ``exp_avg_sq`` of the shard's shape plus a 0-dim float32
``step`` per parameter tensor. Ignored modules and every DDP/single rank hold everything
in full. HSDP shards over ``dp_shard`` only; replicas repeat the shards.

Activations are planned beside the sharding (``activation_plan``): one step of the
policy traced on fake tensors at ``--batch_size``, with and without activation
checkpointing, and on request the largest batch a device of a given size holds.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from lerobot_kit.core.config.schema import AcceleratorConfig, TrainConfig
from lerobot_kit.core.parallel.dims import ParallelDims
from lerobot_kit.core.parallel.precision import build_mp_policy
from lerobot_kit.core.parallel.wrap_units import WrapUnits

if TYPE_CHECKING:
    from lerobot_kit.core.plan.activation_plan import ActivationPlan

# torch.optim.AdamW (not fused, not capturable) keeps ``step`` as a float32 0-dim tensor per parameter.
_STEP_BYTES = torch.tensor(0.0, dtype=torch.float32).element_size()
_ADAM_MOMENTS = 2  # exp_avg, exp_avg_sq


@dataclass(frozen=True)
class UnitPlan:
    """One FSDP unit and the parameters it gathers: its own, not a nested unit's nor ignored ones. A unit
    group is one unit whose path is its modules' paths joined by "+" (classes likewise)."""

    path: str
    class_name: str
    params: int


@dataclass(frozen=True)
class RankBytes:
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes

    def to_json(self) -> dict[str, int]:
        return {**asdict(self), "total_bytes": self.total_bytes}


@dataclass(frozen=True)
class ShardingPlan:
    dims: ParallelDims
    policy_class: str
    total_params: int
    trainable_params: int
    wrap_source: str  # "flag" | "policy" | "min_num_params" | "" (not sharded)
    units: list[UnitPlan]
    root_params: int  # managed by the root unit (outside every wrap unit); 0 when not sharded
    ignored_modules: list[str]
    ignored_params: int
    per_rank: RankBytes  # the chosen layout, the most any rank holds
    ddp_per_rank: RankBytes  # the same run as DDP: everything on every rank
    gather_dtype: str | None  # dtype(s) of all-gathered parameters (param_dtype, else their own); None unsharded
    largest_gather_bytes: int | None  # the largest unit (root included) gathered in full, in gather_dtype
    largest_gather_unit: str | None  # its path; "" is the root
    cpu_offload: bool
    device_bytes: int  # parameters, gradients and AdamW state on the device: per_rank, less what cpu_offload moves

    def to_json(self) -> dict[str, Any]:
        return {
            "layout": self.dims.layout,
            "world_size": self.dims.world_size,
            "dp_replicate": self.dims.dp_replicate,
            "dp_shard": self.dims.dp_shard,
            "policy": self.policy_class,
            "total_params": self.total_params,
            "trainable_params": self.trainable_params,
            "wrap_source": self.wrap_source,
            "units": [{"path": u.path, "class": u.class_name, "params": u.params} for u in self.units],
            "root_params": self.root_params,
            "ignored_modules": list(self.ignored_modules),
            "ignored_params": self.ignored_params,
            "gather_dtype": self.gather_dtype,
            "largest_gather_bytes": self.largest_gather_bytes,
            "largest_gather_unit": self.largest_gather_unit,
            "cpu_offload": self.cpu_offload,
            "device_bytes": self.device_bytes,
            "per_rank": self.per_rank.to_json(),
            "ddp_per_rank": self.ddp_per_rank.to_json(),
        }


def shard_numel(shape: torch.Size, shards: int) -> int:
    """Elements of rank 0's FSDP2 shard (``torch.chunk`` on dim 0): the largest of any rank."""
    if not shape:
        return 1
    return math.ceil(shape[0] / shards) * math.prod(shape[1:])


def _rank_bytes(params: list[nn.Parameter], shards_of: dict[int, int]) -> RankBytes:
    """Bytes of one rank; ``shards_of[id(p)]`` is how many ranks share parameter ``p``."""
    params_bytes = grads_bytes = optimizer_bytes = 0
    for param in params:
        local = shard_numel(param.shape, shards_of.get(id(param), 1)) * param.element_size()
        params_bytes += local
        if param.requires_grad:
            grads_bytes += local
            optimizer_bytes += _ADAM_MOMENTS * local + _STEP_BYTES
    return RankBytes(params_bytes, grads_bytes, optimizer_bytes)


def _class_name(model: nn.Module) -> str:
    from lerobot_kit.core.model.peft import is_peft_model

    return f"PeftModel({type(model.get_base_model()).__name__})" if is_peft_model(model) else type(model).__name__


def plan_model(model: nn.Module, dims: ParallelDims, accel: AcceleratorConfig, wrap: WrapUnits) -> ShardingPlan:
    """The plan for an already built (usually meta-device) model and its resolved wrap units."""
    params = list(model.parameters())  # unique: a tied parameter counts once, as FSDP stores it once
    full = {id(p): 1 for p in params}
    ddp = _rank_bytes(params, full)
    plan_kw: dict[str, Any] = dict(
        dims=dims,
        policy_class=_class_name(model),
        total_params=sum(p.numel() for p in params),
        trainable_params=sum(p.numel() for p in params if p.requires_grad),
        ddp_per_rank=ddp,
        cpu_offload=accel.fsdp.cpu_offload and dims.sharded,
    )
    if not dims.sharded:
        return ShardingPlan(
            **plan_kw, wrap_source="", units=[], root_params=0, ignored_modules=[], ignored_params=0,
            per_rank=ddp, gather_dtype=None, largest_gather_bytes=None, largest_gather_unit=None,
            device_bytes=ddp.total_bytes,
        )
    source, ignored_paths = wrap.source, list(wrap.ignored_modules)
    # A unit group is planned as one unit named by its paths joined with "+", as unit_of names it.
    classes = {path: type(model.get_submodule(path)).__name__ for path in wrap.paths}
    classes.update({g.name: "+".join(type(model.get_submodule(p)).__name__ for p in g.paths) for g in wrap.groups})
    units = list(classes)
    ignored = set(wrap.ignored_params(model))
    mp_policy = build_mp_policy(accel)
    cast = mp_policy.param_dtype if mp_policy is not None else None
    managed: dict[str, int] = {path: 0 for path in ["", *units]}
    gathered: dict[str, int] = dict(managed)
    for name, param in model.named_parameters():
        if param not in ignored:
            unit = wrap.unit_of(name)
            managed[unit] += param.numel()
            gathered[unit] += param.numel() * (cast or param.dtype).itemsize
    largest = max(gathered, key=lambda path: gathered[path])
    gather_dtypes = {cast} if cast is not None else {p.dtype for p in params if p not in ignored}
    shards_of = {id(p): dims.dp_shard for p in params if p not in ignored}
    per_rank = _rank_bytes(params, shards_of)
    # cpu_offload keeps the shards, their gradients and AdamW state in CPU memory; ignored modules stay.
    on_device = _rank_bytes(list(ignored), {}) if plan_kw["cpu_offload"] else per_rank
    return ShardingPlan(
        **plan_kw,
        wrap_source=source,
        units=[UnitPlan(u, classes[u], managed[u]) for u in units],
        root_params=managed[""],
        ignored_modules=ignored_paths,
        ignored_params=sum(p.numel() for p in ignored),
        per_rank=per_rank,
        gather_dtype="/".join(sorted(str(d).removeprefix("torch.") for d in gather_dtypes)),
        largest_gather_bytes=gathered[largest],
        largest_gather_unit=largest,
        device_bytes=on_device.total_bytes,
    )


@dataclass(frozen=True)
class RunPlan:
    sharding: ShardingPlan
    activations: ActivationPlan

    def to_json(self) -> dict[str, Any]:
        return {**self.sharding.to_json(), "activations": self.activations.to_json()}


def plan_run(config: TrainConfig, world_size: int, device_memory_gb: float | None = None) -> RunPlan:
    """The plan of the run ``lerobot train`` would start on ``world_size`` processes: the
    same spec, the same model assembly (PEFT adapters included) on the meta device and
    the same preprocessor; with ``device_memory_gb``, the largest ``--batch_size`` whose
    step fits a device of that many GiB."""
    from lerobot_kit.core.data.build import build_dataset
    from lerobot_kit.core.model.policy import make_policy_processors
    from lerobot_kit.core.model.processor import make_processors
    from lerobot_kit.core.plan.activation_memory import policy_inputs
    from lerobot_kit.core.plan.activation_plan import plan_activations
    from lerobot_kit.core.run.assemble import build_model
    from lerobot_kit.core.run.spec import resolve_run

    spec = resolve_run(config, world_size)
    dataset = build_dataset(config)
    built = build_model(spec, dataset.meta, torch.device("meta"))
    sharding = plan_model(built.model, spec.dims, config.accelerator, built.wrap)
    if policy_inputs(config.policy):
        # The policy's preprocessor makes entries from values a shape-only trace has not (a
        # task's text, tokenized from files the plan need not have): the trace is given those
        # entries by shape (``plan_inputs``) and the batch is only normalised.
        preprocessor, _ = make_processors(config.policy, dataset.meta)
    else:
        preprocessor, _ = make_policy_processors(config.policy, dataset.meta)
    activations = plan_activations(built, spec, dataset.meta, preprocessor, sharding.device_bytes, device_memory_gb)
    return RunPlan(sharding, activations)
