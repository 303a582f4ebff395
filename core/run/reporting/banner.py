"""The start-up banner: what will run, stated before the first step.

The effective-batch factorisation is printed because it is the most common source
of confusion when moving from one to many processes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lerobot_kit.core.version import package_version

if TYPE_CHECKING:
    from lerobot_kit.core.config.schema import TrainConfig
    from lerobot_kit.core.run.components import RunComponents
    from lerobot_kit.core.run.reporting.mfu import Utilization


def human_count(n: int) -> str:
    """A parameter count as the banner and ``lerobot plan`` both write it (``1.23M``), so the
    two can be compared at a glance."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(n)


def human_flops(count: int) -> str:
    """A FLOP count as the banner's MFU line and ``lerobot plan`` both write it (``11.8 MFLOP``),
    three significant digits: the count is an estimate, more digits would overstate it."""
    for unit, size in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("KFLOP", 1e3)):
        if count >= size:
            return f"{count / size:.3g} {unit}"
    return f"{count} FLOP"


def local_numel(tensor: object) -> int:
    """Elements this rank holds: a DTensor's local shard, or the whole tensor."""
    local = getattr(tensor, "to_local", None)
    return local().numel() if callable(local) else tensor.numel()  # type: ignore[attr-defined]


def unit_class_name(module: object) -> str:
    """The policy's own class name, not FSDP2's generated ``FSDP<Name>`` subclass."""
    from torch.distributed.fsdp import FSDPModule

    return next(c.__name__ for c in type(module).__mro__ if not issubclass(c, FSDPModule))


def format_banner(
    run: "RunComponents", dataset_len: int, start_step: int, utilization: "Utilization | None" = None
) -> list[str]:
    config, dims, ctx = run.config, run.dims, run.ctx
    accumulation = config.accelerator.gradient_accumulation.steps
    effective = config.batch_size * dims.dp_world_size * accumulation
    params = list(run.parallel.model.parameters())
    total = sum(p.numel() for p in params)
    trainable = sum(p.numel() for p in params if p.requires_grad)
    per_rank = sum(local_numel(p) for p in params)
    wrap = run.parallel.wrap
    units = wrap.paths
    classes = sorted({unit_class_name(run.parallel.model.get_submodule(path)) for path in units})
    accel = config.accelerator
    applied = "".join(f", {what}" for what, on in (("checkpointed", accel.activation_checkpointing),
                                                  ("compiled", accel.compile)) if on)
    parts = [f"{len(units)} from {wrap.source} ({', '.join(classes)})"] if units else []
    if wrap.groups:  # the policy's unit groups: several modules per unit, run by a method
        methods = sorted({g.method or "forward" for g in wrap.groups})
        parts.append(f"{len(wrap.groups)} unit groups of the policy (run by {', '.join(methods)})")
    unit_text = " + ".join(parts) + applied if parts else "none (not sharded)"
    lines = [
        f"lerobot-kit {package_version()} | layout {dims.layout} | world {ctx.world_size} "
        f"(dp_replicate {dims.dp_replicate} × dp_shard {dims.dp_shard}) | launcher {ctx.launcher} | "
        f"device {ctx.device.type}{'/' + ctx.backend if ctx.backend else ''}",
        f"effective batch {effective} = batch_size {config.batch_size} × dp_world_size {dims.dp_world_size} "
        f"× gradient_accumulation {accumulation}",
        f"precision {config.accelerator.mixed_precision} | wrap units: {unit_text}",
        f"parameters {human_count(total)} total, {human_count(trainable)} trainable, {human_count(per_rank)} on this rank",
        f"policy {config.policy.type} | dataset {config.dataset.type}{_mixture_text(config)} ({dataset_len} samples) "
        f"| steps "
        f"{start_step}→{config.steps} | output {run.output_dir}",
        _checkpoint_text(run),
    ]
    if utilization is not None:  # the model's FLOPs per sample and the peak MFU divides by, or why not
        lines.append(utilization.describe())
    return lines


def _checkpoint_text(run: "RunComponents") -> str:
    """When checkpoints are written, how the weights are stored, and whether saves block training."""
    config, sharded = run.config, run.dims.sharded
    if not config.save_checkpoint:
        return "checkpoints off"
    weights = config.checkpoint_format if sharded else "safetensors (not sharded)"
    mode = "written in the background" if config.async_checkpoint and sharded else "synchronous"
    return f"checkpoints every {config.save_freq} steps and at the end | weights {weights} | {mode}"


def _mixture_text(config: TrainConfig) -> str:
    """How many datasets a mixture joins; each one's samples and loss are in the metrics log."""
    members = getattr(config.dataset, "mixture", None)
    return f" mixture of {len(members)} members" if isinstance(members, list) else ""
