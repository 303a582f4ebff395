"""``lerobot plan``: the sharding plan and per-rank memory of a run, without launching it.

Takes every ``train`` flag plus ``--world_size=N`` (the processes you would launch),
``--plan.device_memory_gb=N`` and ``--json``; nothing is trained or written. Torch is
imported only when a plan is computed.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import click

from lerobot_kit.cli.errors import command_errors
from lerobot_kit.core.errors import ConfigError
from lerobot_kit.core.layout.byte_size import byte_size
from lerobot_kit.core.run.reporting.banner import human_count, human_flops

if TYPE_CHECKING:
    from lerobot_kit.core.plan.activation_plan import ActivationPlan
    from lerobot_kit.core.plan.memory_plan import RankBytes, RunPlan, ShardingPlan

USAGE = """\
Usage: lerobot plan --world_size=N [--plan.device_memory_gb=G] [--json] [TRAIN FLAGS...]

  Print the sharding plan of a run on N processes: the FSDP wrap units and their
  parameter counts, the parameter, gradient and AdamW-state bytes each rank holds in
  the chosen layout beside DDP, the peak activation memory of one step at --batch_size
  with and without activation checkpointing, and the step's FLOPs. Runs in one process
  on any machine (the model is built on torch's meta device, the step traced on fake
  tensors); nothing is trained or written.

Options:
  --world_size=N             Processes the run would launch (dp_replicate × dp_shard must equal N).
  --plan.device_memory_gb=G  Also print the largest --batch_size whose step fits G GiB per rank
                             (parameters, gradients, AdamW state and activations; checkpointed
                             when --accelerator.activation_checkpointing=true).
  --json                     One JSON object instead of the table, for scripts.

Every `lerobot train` flag applies and is validated as train validates it
(`lerobot train --help` lists them), e.g.:

  lerobot plan --world_size=64 --parallelism.dp_shard=8 --parallelism.dp_replicate=8 \\
    --policy.dim_model=512 --accelerator.mixed_precision=bf16
"""

WORLD_SIZE_FLAG = "world_size"
DEVICE_MEMORY_FLAG = "plan.device_memory_gb"
JSON_FLAG = "json"
_VALUE_FLAGS = (WORLD_SIZE_FLAG, DEVICE_MEMORY_FLAG)


@dataclass(frozen=True)
class PlanFlags:
    world_size: int | None
    as_json: bool
    device_memory_gb: float | None
    train_args: list[str]


def split_plan_flags(args: list[str]) -> PlanFlags:
    """Take the plan's own flags out of ``args``; the rest are train flags.

    Done before the train parser sees them: ``--json`` has no value, which the dotted
    flag syntax would reject, and ``--plan.*`` is no section of the train config.
    """
    values: dict[str, str] = {}
    as_json = False
    rest: list[str] = []
    i = 0
    while i < len(args):
        key, eq, value = args[i].partition("=")
        name = key.removeprefix("--")
        if key.startswith("--") and name in _VALUE_FLAGS:
            if not eq:
                if i + 1 >= len(args) or args[i + 1].startswith("--"):
                    raise ConfigError(f"--{name} has no value: write --{name}=N")
                value = args[i + 1]
                i += 1
            values[name] = value
        elif key == f"--{JSON_FLAG}":
            if eq and value.lower() not in ("true", "false"):
                raise ConfigError(f"--{JSON_FLAG}={value}: expected true or false (or plain --{JSON_FLAG})")
            as_json = not eq or value.lower() == "true"
        else:
            rest.append(args[i])
        i += 1
    return PlanFlags(
        _world_size(values.get(WORLD_SIZE_FLAG)), as_json, _device_memory_gb(values.get(DEVICE_MEMORY_FLAG)), rest
    )


MAX_WORLD_SIZE = 2**31 - 1  # torch.distributed counts ranks in int32
MAX_DEVICE_MEMORY_GB = 2.0**20  # 1 PiB: past any device, and the batch search would trace absurd sizes


def _world_size(value: str | None) -> int | None:
    if value is None:
        return None
    digits = value.isascii() and value.isdigit() and len(value) <= len(str(MAX_WORLD_SIZE))
    if not (digits and 1 <= int(value) <= MAX_WORLD_SIZE):
        raise ConfigError(
            f"--{WORLD_SIZE_FLAG}={_cut(value)}: expected a positive number of processes, at most {MAX_WORLD_SIZE}"
        )
    return int(value)


def _device_memory_gb(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        gib = float(value)
    except ValueError:
        gib = math.nan
    if not 0 < gib <= MAX_DEVICE_MEMORY_GB:  # also false for nan
        raise ConfigError(
            f"--{DEVICE_MEMORY_FLAG}={_cut(value)}: expected a positive number of GiB per rank, at most "
            f"{MAX_DEVICE_MEMORY_GB:.0f}, e.g. 80"
        )
    return gib


def _cut(value: str, limit: int = 40) -> str:
    """A flag's value as typed, cut short: it is echoed in an error line."""
    return value if len(value) <= limit else f"{value[:limit]}... ({len(value)} characters)"


_BYTE_ROWS = (
    ("parameters", "params_bytes"),
    ("gradients", "grads_bytes"),
    ("AdamW state", "optimizer_bytes"),
    ("total", "total_bytes"),
)
_SHOWN_IGNORED = 6  # module paths listed before "+N more" (a PEFT regex can match hundreds)
_WRAP_SOURCES = {
    "flag": "--accelerator.fsdp.wrap_modules",
    "policy": "the policy's _fsdp_wrap_modules",
    "min_num_params": "--accelerator.fsdp.min_num_params",
}


def _unit_lines(plan: ShardingPlan) -> list[str]:
    by_class: dict[str, list[int]] = defaultdict(list)
    for unit in plan.units:
        by_class[unit.class_name].append(unit.params)
    lines = [f"wrap units: {len(plan.units)} from {_WRAP_SOURCES[plan.wrap_source]}, each gathered on its own"]
    rows = []
    for name, counts in by_class.items():
        low, high = human_count(min(counts)), human_count(max(counts))
        each = low if low == high else f"{low}–{high}"
        rows.append((f"{name} × {len(counts)}", human_count(sum(counts)), f"{each} each"))
    rows.append((f"root ({plan.policy_class})", human_count(plan.root_params), "parameters outside every unit"))
    if plan.ignored_modules:
        shown = plan.ignored_modules[:_SHOWN_IGNORED]
        more = len(plan.ignored_modules) - len(shown)
        paths = ", ".join(shown) + (f", +{more} more" if more else "")
        rows.append(("ignored (not sharded)", human_count(plan.ignored_params), paths))
    width = max(len(r[0]) for r in rows)
    lines += [f"  {a:<{width}}  {b:>8} params  ({c})" for a, b, c in rows]
    return lines


def _memory_lines(plan: ShardingPlan) -> list[str]:
    """Bytes per rank; sharded layouts get a DDP column and the ratio beside their own."""
    layout = plan.dims.layout
    columns: list[tuple[str, RankBytes]] = [(layout, plan.per_rank)]
    if plan.dims.sharded:
        columns.append(("ddp", plan.ddp_per_rank))
    rows = [("per rank", *(name for name, _ in columns))]
    for label, field in _BYTE_ROWS:
        rows.append((label, *(byte_size(getattr(bytes_, field)) for _, bytes_ in columns)))
    lines = ["  " + f"{row[0]:<12}" + "".join(f" {cell:>12}" for cell in row[1:]) for row in rows]
    if plan.dims.sharded and plan.ddp_per_rank.total_bytes:
        ratio = plan.per_rank.total_bytes / plan.ddp_per_rank.total_bytes
        lines.append(f"  {layout} holds {ratio:.3f}× of DDP per rank")
    return lines


def _batch_text(acts: ActivationPlan) -> str:
    def shape(dims: tuple[int, ...]) -> str:
        return "[" + ", ".join(str(d) for d in (acts.batch_size, *dims)) + "]"

    return ", ".join(f"{key} {shape(dims)} {str(dtype).removeprefix('torch.')}" for key, (dims, dtype) in acts.item.items())


def _activation_lines(acts: ActivationPlan, device_bytes: int, gib: float | None) -> list[str]:
    """The traced peak at --batch_size with and without checkpointing, and the batch fit."""
    from lerobot_kit.core.plan.activation_plan import COUNTED

    lines = [f"activations per rank at --batch_size={acts.batch_size}, one forward and backward on a batch like "
             f"the dataset's: {_batch_text(acts)}"]
    if acts.not_traced is not None:
        lines.append(f"  not traced: {acts.not_traced}")
    else:
        rows = [("without activation checkpointing", acts.peak_bytes, "", not acts.checkpointing)]
        if acts.checkpointed_peak_bytes is not None:
            rows.append(("with activation checkpointing", acts.checkpointed_peak_bytes,
                         f", {acts.checkpoint_units} wrap units checkpointed", acts.checkpointing))
        for label, peak, units, chosen in rows:
            assert peak is not None  # traced
            flags = "  ← as the flags set" if chosen else ""
            lines.append(f"  {label:<33} {byte_size(peak):>12}  (with the rows above "
                         f"{byte_size(device_bytes + peak)}{units}){flags}")
        if acts.no_checkpointing is not None:
            lines.append(f"  with activation checkpointing: {acts.no_checkpointing}")
    lines.append(f"  counted: {COUNTED}; traced on fake tensors with CPU kernels, without torch.compile")
    if acts.step_flops is not None:
        lines.append(f"FLOPs per step per rank at --batch_size={acts.batch_size}: {human_flops(acts.step_flops)} "
                     f"({human_flops(acts.step_flops // acts.batch_size)} per sample), forward and backward: "
                     "matrix products, convolutions and attention, without checkpointing's recomputation")
    if gib is not None:
        lines.append(_fit_line(acts, gib))
    return lines


def _fit_line(acts: ActivationPlan, gib: float) -> str:
    fit = acts.fit
    how = f"{'with' if acts.checkpointing else 'without'} activation checkpointing, as the flags set"
    if fit is None:
        return f"largest --batch_size in {gib:g} GiB per rank: unknown, the step was not traced"
    if fit.largest is None:
        return (f"does not fit in {gib:g} GiB per rank: --batch_size=1 needs {byte_size(fit.needs(1))} "
                f"(parameters, gradients and AdamW state {byte_size(fit.fixed_bytes)} + activations "
                f"{byte_size(fit.traced[1])}, {how})")
    following = fit.largest + 1
    return (f"largest --batch_size in {gib:g} GiB per rank ({how}): {fit.largest}, needing "
            f"{byte_size(fit.needs(fit.largest))}; {following} needs {byte_size(fit.needs(following))} "
            "(both traced)")


def format_plan(run_plan: RunPlan, device_memory_gb: float | None = None) -> list[str]:
    plan = run_plan.sharding
    dims = plan.dims
    lines = [
        f"plan: {plan.policy_class} | layout {dims.layout} | world {dims.world_size} "
        f"(dp_replicate {dims.dp_replicate} × dp_shard {dims.dp_shard})",
        f"parameters: {human_count(plan.total_params)} total, {human_count(plan.trainable_params)} trainable",
    ]
    if dims.sharded:
        lines += _unit_lines(plan)
    else:
        lines.append("wrap units: none (not sharded: every rank holds the whole model)")
    lines += _memory_lines(plan)
    if plan.largest_gather_bytes is not None:
        where = repr(plan.largest_gather_unit) if plan.largest_gather_unit else "the root"
        lines.append(
            f"largest all-gather: {byte_size(plan.largest_gather_bytes)} ({where} in full, {plan.gather_dtype}), "
            "held transiently while that unit computes"
        )
    if plan.cpu_offload:
        kept = " (ignored modules stay on the device)" if plan.ignored_modules else ""
        lines.append(f"cpu_offload: the sharded parameters, gradients and AdamW state live in CPU memory{kept}")
    lines += _activation_lines(run_plan.activations, plan.device_bytes, device_memory_gb)
    lines.append(
        "not counted: buffers, DDP/FSDP communication buffers and gathered units, the CUDA context and the "
        "allocator's cache: leave headroom"
    )
    return lines


def run_plan(args: list[str]) -> None:
    # Known before the flags are parsed, so that a script asking for JSON gets JSON even when they are wrong.
    as_json = any(arg == f"--{JSON_FLAG}" or arg.lower() == f"--{JSON_FLAG}=true" for arg in args)
    with command_errors(as_json=as_json):
        if "--help" in args or "-h" in args:
            click.echo(USAGE, nl=False)
            return
        flags = split_plan_flags(args)
        if flags.world_size is None:
            raise ConfigError(
                f"lerobot plan needs --{WORLD_SIZE_FLAG}=N, the number of processes the run would launch"
            )
        from lerobot_kit.core.config.flags import parse_train_config

        config = parse_train_config(flags.train_args)  # before torch is imported: bad flags answer at once
        from lerobot_kit.core.plan.memory_plan import plan_run

        # With --json, stdout is one JSON object: what a plugin's code prints while the model is
        # built and traced (LeRobot's SmolVLA announces its layer count) goes to stderr.
        printed = contextlib.redirect_stdout(sys.stderr) if flags.as_json else contextlib.nullcontext()
        with printed:
            plan = plan_run(config, flags.world_size, flags.device_memory_gb)
        if flags.as_json:
            click.echo(json.dumps(plan.to_json(), indent=2))
        else:
            click.echo("\n".join(format_plan(plan, flags.device_memory_gb)))


@click.command(
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
    add_help_option=False,
    help="Print the sharding plan and per-rank memory for a world size, without training.",
)
@click.pass_context
def command(ctx: click.Context) -> None:
    run_plan(list(ctx.args))
    sys.stdout.flush()
