"""``lerobot train``: flags → config → run."""

from __future__ import annotations

import sys

import click

from lerobot_kit.cli.errors import user_errors
from lerobot_kit.core.errors import LerobotError, first_line


def _print_help(args: list[str]) -> None:
    from lerobot_kit.cli.help import render_help
    from lerobot_kit.core.config.schema import TrainConfig

    usage = [
        "Usage: lerobot train [--section.field=VALUE ...] [--config_path=train_config.json]",
        "",
        "Train a policy. Flags override --config_path; values are JSON for lists/dicts.",
        "Under torchrun / accelerate launch the same flags apply; no --parallelism.* means DDP.",
    ]
    click.echo(render_help(usage, TrainConfig, args))


def run_train(args: list[str]) -> None:
    with user_errors():
        if "--help" in args or "-h" in args:
            _print_help(args)
            return
        from lerobot_kit.core.config.flags import parse_train_config

        config = parse_train_config(args)
        from lerobot_kit.core.run.prepare import train

        try:
            train(config)
        except Exception as exc:
            if _collective_failure(exc):
                raise LerobotError(
                    f"a collective operation failed, so another process died or hung ({first_line(exc)}); "
                    "see the first failing rank's log above. --parallelism.timeout_s bounds the wait"
                ) from exc
            raise


def _collective_failure(exc: BaseException) -> bool:
    """Errors a rank sees when a peer is gone: torch's DistError family or gloo/NCCL transport errors."""
    import torch.distributed as dist

    text = str(exc)
    return isinstance(exc, dist.DistError) or any(marker in text for marker in ("gloo", "NCCL", "Connection closed"))


@click.command(
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
    add_help_option=False,
    help="Train a policy. `lerobot train --help` lists every flag.",
)
@click.pass_context
def command(ctx: click.Context) -> None:
    run_train(list(ctx.args))
    sys.stdout.flush()
