"""``lerobot train``: flags → config → run."""

from __future__ import annotations

import sys

import click

from lerobot_kit.cli.errors import command_errors
from lerobot_kit.cli.process_exit import exit_without_teardown
from lerobot_kit.core.distributed.started import started_a_process_group
from lerobot_kit.core.errors import LerobotError, first_line

# gloo's messages when the other end of a connection died (its transport names itself in the path).
GLOO_PEER_GONE = ("gloo/transport", "Connection closed by peer", "Connection reset by peer")


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
    with command_errors():
        if "--help" in args or "-h" in args:
            _print_help(args)
            return
        from lerobot_kit.core.config.flags import parse_train_config

        config = parse_train_config(args)
        from lerobot_kit.core.run.prepare import train

        try:
            train(config)
        except RuntimeError as exc:  # torch's distributed and compiler errors are RuntimeErrors
            if _collective_failure(exc):
                raise LerobotError(
                    f"a collective operation failed, so another process died or hung ({first_line(exc)}); "
                    "see the first failing rank's log above. --parallelism.timeout_s bounds the wait"
                ) from exc
            compile_error = _compile_failure(exc)
            if compile_error is not None:
                raise LerobotError(
                    f"torch.compile failed while compiling the model ({compile_error}); the error is inside torch "
                    "or its compiler toolchain, not in the run's settings: train without "
                    "--accelerator.compile=true, or with another torch version (TORCHDYNAMO_VERBOSE=1 prints "
                    "torch's full report)"
                ) from exc
            raise
    if started_a_process_group():  # a rank of a launched run: done, and its output written
        exit_without_teardown(0, run_exit_handlers=True)


def _compile_failure(exc: BaseException) -> str | None:
    """The inner error of a failure inside torch.compile's tracer or compiler backend, else None.

    torch wraps these in its own exception types whose first line says only which backend
    raised; the error that explains it is the wrapped one.
    """
    from torch._dynamo.exc import TorchDynamoException

    if not isinstance(exc, TorchDynamoException):
        return None
    inner = getattr(exc, "inner_exception", None) or exc
    return f"{type(inner).__name__}: {first_line(inner)}"


def _collective_failure(exc: BaseException) -> bool:
    """What a rank sees when a peer is gone: torch's DistError family (NCCL, the store), or
    gloo's transport error, a plain RuntimeError naming the closed connection."""
    import torch.distributed as dist

    if isinstance(exc, dist.DistError):
        return True
    return isinstance(exc, RuntimeError) and any(marker in str(exc) for marker in GLOO_PEER_GONE)


@click.command(
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
    add_help_option=False,
    help="Train a policy. `lerobot train --help` lists every flag.",
)
@click.pass_context
def command(ctx: click.Context) -> None:
    run_train(list(ctx.args))
    sys.stdout.flush()
