"""``lerobot inspect-checkpoint PATH``: a thin shell over ``core.offline.inspect``.

Imports no torch, so it runs in a second on a CI box or a laptop without a GPU stack.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from lerobot_kit.cli.errors import command_errors
from lerobot_kit.core.errors import (
    DEBUG_ENV,
    EXIT_INTERNAL,
    EXIT_PROBLEMS,
    EXIT_USAGE,
    CheckpointError,
    ConfigError,
)
from lerobot_kit.core.layout.byte_size import byte_size
from lerobot_kit.core.layout.hub_snapshot import local_policy_path
from lerobot_kit.core.layout.paths import DamagedLastError
from lerobot_kit.core.offline.inspect import DEFAULT_VERIFY_MAX_BYTES, CheckpointReport, FileInfo, inspect_checkpoint

EXIT_OK = 0


@click.command(
    name="inspect-checkpoint",
    epilog=(
        "\b\nExit codes:\n"
        f"  {EXIT_OK}  the checkpoint is valid\n"
        f"  {EXIT_PROBLEMS}  problems found: a file is missing, truncated, unreadable, inconsistent,\n"
        "     differs from checksums.json, or holds weights of other shapes than config.json's model,\n"
        "     or the layout is old or unknown (each problem is one line naming the file), or the run's\n"
        "     checkpoints/last link loops, dangles or leads out of the run\n"
        f"  {EXIT_USAGE}  usage error: PATH does not exist or is not a checkpoint\n"
        f"  {EXIT_INTERNAL} internal error: a bug in lerobot-kit (set {DEBUG_ENV}=1 for the traceback)"
    ),
)
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (with \"ok\" and \"problems\") for CI.")
@click.option(
    "--verify/--no-verify", default=None,
    help="Compare every file with the checkpoint's checksums.json (reads all the tensor data), or never. "
    "Default: verify when the checkpoint is at most --verify-max-bytes.",
)
@click.option(
    "--verify-max-bytes", type=click.IntRange(min=0), default=DEFAULT_VERIFY_MAX_BYTES, show_default=True,
    help="The largest checkpoint whose checksums are verified without --verify.",
)
@click.pass_context
def command(ctx: click.Context, path: Path, as_json: bool, verify: bool | None, verify_max_bytes: int) -> None:
    """Show what a checkpoint holds and validate it, reading headers and metadata only.

    PATH is a step folder (checkpoints/005000), its pretrained_model/ or training_state/,
    a run folder (then checkpoints/last), or a policy folder that save_pretrained wrote on
    its own (a copied pretrained_model/, LeRobot's output, a Hub snapshot: checked for
    loading; it holds no training state to resume). A Hub id (user/model) that is no
    folder here is fetched into the Hub's cache as --policy.path fetches it (JSON and
    safetensors only; HF_HUB_OFFLINE=1 reads the cache) and its snapshot inspected.
    Nothing from the checkpoint is executed and torch is not imported. Weight shapes are
    checked against config.json without building the model; file contents against
    checksums.json (see --verify).
    """
    with command_errors(as_json=as_json):
        try:
            path = Path(local_policy_path(str(path), given_as="inspect-checkpoint "))
            report = inspect_checkpoint(path, verify=verify, verify_max_bytes=verify_max_bytes)
        except DamagedLastError:  # the run's own last link is broken: a problem found (exit 1)
            raise
        except CheckpointError as err:  # PATH is not a checkpoint at all: the usage is wrong
            raise ConfigError(str(err)) from err
        if as_json:
            click.echo(json.dumps(report.to_json(), indent=2))
        else:
            click.echo(render(report))
            for problem in report.problems:
                click.echo(f"error: {problem}", err=True)
    ctx.exit(EXIT_OK if report.ok else EXIT_PROBLEMS)


def render(report: CheckpointReport) -> str:
    """The human-readable report: header facts, every file's tensors, then the verdicts."""
    ts = report.training_step or {}
    if report.policy_folder:
        lines = [f"policy folder: {report.path} (saved by save_pretrained, with no training state)"]
    else:
        lines = [f"checkpoint: {report.path}"]
        version = "unknown" if report.layout_version is None else str(report.layout_version)
        made_by = f", written by lerobot-kit {ts['lerobot_kit_version']}" if "lerobot_kit_version" in ts else ""
        lines.append(f"step: {_or_unknown(report.step)}   layout version: {version}{made_by}")
    topo = ts.get("topology")
    if isinstance(topo, dict):
        lines.append(
            f"topology: {topo.get('layout', '?')}, world_size={topo.get('world_size', '?')} "
            f"(dp_replicate={topo.get('dp_replicate', '?')}, dp_shard={topo.get('dp_shard', '?')})"
        )
    fmt = f"{ts['checkpoint_format']}: " if "checkpoint_format" in ts else ""
    optimizer = "" if report.policy_folder else f", optimizer {_or_unknown(report.optimizer)}"
    peft = "yes" if report.peft else "no"
    lines.append(f"format: {fmt}weights {_or_unknown(report.weights)}{optimizer}   PEFT: {peft}")
    if all(k in ts for k in ("batch_size", "dp_world_size", "gradient_accumulation_steps")):
        lines.append(
            f"batch: {ts['batch_size']} per worker x {ts['dp_world_size']} workers x "
            f"{ts['gradient_accumulation_steps']} accumulation, mixed_precision={ts.get('mixed_precision', '?')}"
        )
    lines.extend(_render_dataset(report.dataset))
    sampler = ts.get("sampler")
    if isinstance(sampler, dict):
        lines.append(
            f"data position: epoch {sampler.get('epoch', '?')}, offset {sampler.get('offset', '?')}, "
            f"{sampler.get('samples_seen', '?')} samples seen"
        )
    if report.state:
        lines.append("training state: " + ", ".join(f"{p.name} ({', '.join(p.held_in)})" for p in report.state))
    previous_had_tensors = True
    for info in report.files:
        if info.tensors is not None or previous_had_tensors:
            lines.append("")
        lines.extend(_render_file(info))
        previous_had_tensors = info.tensors is not None
    lines.append("")
    lines.append(f"size on disk: {byte_size(report.size_on_disk)}")
    lines.append(f"checksums: {report.checksums.state} ({report.checksums.why})")
    lines.append(f"resumable: {_verdict(report.resumable.ok, report.resumable.why)}")
    lines.append(f"loadable with --policy.path: {_verdict(report.loadable.ok, report.loadable.why)}")
    n = len(report.problems)
    if report.ok:
        lines.append("valid: no problems found")
    else:
        lines.append(f"INVALID: {n} problem{'s' if n > 1 else ''} (listed on stderr)")
    return "\n".join(lines)


SHOWN_MEMBERS = 10  # a mixture of hundreds lists its first members; --json lists all


def _render_dataset(dataset: dict | None) -> list[str]:
    """What the checkpoint was trained on: a dataset id, or a mixture's members and shares."""
    if dataset is None:
        return []
    members = dataset.get("mixture")
    if not isinstance(members, list):
        named = f" {dataset['repo_id']}" if dataset.get("repo_id") else ""
        return [f"trained on: {dataset.get('type')}{named}"]
    weighted = any(isinstance(m.get("weight"), (int, float)) for m in members)
    alpha = dataset.get("mixture_alpha")
    rule = "weights" if weighted else "frames" if alpha in (1, None) else f"frames**{alpha}"
    lines = [f"trained on: a mixture of {len(members)} datasets, shares by {rule}"]
    for member in members[:SHOWN_MEMBERS]:
        weight = f" weight {member['weight']:g}" if isinstance(member.get("weight"), (int, float)) else ""
        renames = member.get("rename_map") if isinstance(member.get("rename_map"), dict) else {}
        renamed = f" renames {', '.join(f'{a} -> {b}' for a, b in renames.items())}" if renames else ""
        lines.append(f"  {member.get('repo_id')}{weight}{renamed}")
    if len(members) > SHOWN_MEMBERS:
        lines.append(f"  ... and {len(members) - SHOWN_MEMBERS} more (--json lists every member)")
    return lines


def _render_file(info: FileInfo) -> list[str]:
    head = f"{info.path}{'/' if info.kind == 'dcp' else ''}  ({byte_size(info.size)})"
    if info.tensors is None:
        return [head]
    lines = [head]
    width = max((len(t.name) for t in info.tensors), default=0)
    for t in info.tensors:
        chunks = "" if t.chunks is None else f"  {t.chunks} chunk{'s' if t.chunks != 1 else ''}"
        lines.append(f"  {t.name:<{width}}  {t.dtype:<9} {t.shape}{chunks}")
    params = sum(t.numel for t in info.tensors)
    data = sum(t.nbytes for t in info.tensors)
    count = len(info.tensors)
    lines.append(f"  {count} tensor{'s' if count != 1 else ''}, {params:,} params, {byte_size(data)}")
    return lines


def _verdict(ok: bool | None, why: str) -> str:
    return f"{'unchecked' if ok is None else 'yes' if ok else 'no'} ({why})"


def _or_unknown(value: object) -> str:
    return "unknown" if value is None else str(value)
