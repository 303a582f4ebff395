"""``lerobot plan``: the sharding plan and per-rank memory of a run, without launching it.

Takes every ``train`` flag plus ``--world_size=N`` (the processes you would launch) and
``--json``; nothing is trained or written. Torch is imported only when a plan is computed.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from typing import TYPE_CHECKING

import click

from lerobot_kit.cli.errors import user_errors
from lerobot_kit.core.errors import ConfigError

if TYPE_CHECKING:
    from lerobot_kit.core.parallel.memory_plan import RankBytes, ShardingPlan

USAGE = """\
Usage: lerobot plan --world_size=N [--json] [TRAIN FLAGS...]

  Print the sharding plan of a run on N processes: the FSDP wrap units and their
  parameter counts, and the parameter, gradient and AdamW-state bytes each rank holds
  in the chosen layout beside DDP. Runs in one process on any machine (the model is
  built on torch's meta device); nothing is trained or written.

Options:
  --world_size=N  Processes the run would launch (dp_replicate × dp_shard must equal N).
  --json          One JSON object instead of the table, for scripts.

Every `lerobot train` flag applies and is validated as train validates it
(`lerobot train --help` lists them), e.g.:

  lerobot plan --world_size=64 --parallelism.dp_shard=8 --parallelism.dp_replicate=8 \\
    --policy.dim_model=512 --accelerator.mixed_precision=bf16
"""

WORLD_SIZE_FLAG = "world_size"
JSON_FLAG = "json"


def split_plan_flags(args: list[str]) -> tuple[int | None, bool, list[str]]:
    """Take ``--world_size`` and ``--json`` out of ``args``; the rest are train flags.

    Done before the train parser sees them: ``--json`` has no value, which the dotted
    flag syntax would reject.
    """
    world_size: str | None = None
    as_json = False
    rest: list[str] = []
    i = 0
    while i < len(args):
        key, eq, value = args[i].partition("=")
        if key == f"--{WORLD_SIZE_FLAG}":
            if not eq:
                if i + 1 >= len(args) or args[i + 1].startswith("--"):
                    raise ConfigError(f"--{WORLD_SIZE_FLAG} has no value: write --{WORLD_SIZE_FLAG}=N")
                value = args[i + 1]
                i += 1
            world_size = value
        elif key == f"--{JSON_FLAG}":
            if eq and value.lower() not in ("true", "false"):
                raise ConfigError(f"--{JSON_FLAG}={value}: expected true or false (or plain --{JSON_FLAG})")
            as_json = not eq or value.lower() == "true"
        else:
            rest.append(args[i])
        i += 1
    if world_size is None:
        return None, as_json, rest
    if not world_size.isdigit() or int(world_size) < 1:
        raise ConfigError(f"--{WORLD_SIZE_FLAG}={world_size}: expected a positive number of processes")
    return int(world_size), as_json, rest


def human_bytes(n: int) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def human_count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(n)


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
        rows.append((label, *(human_bytes(getattr(bytes_, field)) for _, bytes_ in columns)))
    lines = ["  " + f"{row[0]:<12}" + "".join(f" {cell:>12}" for cell in row[1:]) for row in rows]
    if plan.dims.sharded and plan.ddp_per_rank.total_bytes:
        ratio = plan.per_rank.total_bytes / plan.ddp_per_rank.total_bytes
        lines.append(f"  {layout} holds {ratio:.3f}× of DDP per rank")
    return lines


def format_plan(plan: ShardingPlan) -> list[str]:
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
            f"largest all-gather: {human_bytes(plan.largest_gather_bytes)} ({where} in full, {plan.gather_dtype}), "
            "held transiently while that unit computes"
        )
    if plan.cpu_offload:
        kept = " (ignored modules stay on the device)" if plan.ignored_modules else ""
        lines.append(f"cpu_offload: the sharded parameters, gradients and AdamW state live in CPU memory{kept}")
    lines.append("not counted: buffers, activations, DDP/FSDP communication buffers")
    return lines


def run_plan(args: list[str]) -> None:
    with user_errors():
        if "--help" in args or "-h" in args:
            click.echo(USAGE, nl=False)
            return
        world_size, as_json, train_args = split_plan_flags(args)
        if world_size is None:
            raise ConfigError(
                f"lerobot plan needs --{WORLD_SIZE_FLAG}=N, the number of processes the run would launch"
            )
        from lerobot_kit.core.config.flags import parse_train_config
        from lerobot_kit.core.parallel.memory_plan import plan_run

        plan = plan_run(parse_train_config(train_args), world_size)
        if as_json:
            click.echo(json.dumps(plan.to_json(), indent=2))
        else:
            click.echo("\n".join(format_plan(plan)))


@click.command(
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
    add_help_option=False,
    help="Print the sharding plan and per-rank memory for a world size, without training.",
)
@click.pass_context
def command(ctx: click.Context) -> None:
    run_plan(list(ctx.args))
    sys.stdout.flush()
