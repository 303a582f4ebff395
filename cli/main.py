"""The ``lerobot`` click group: the only console script, so LeRobot's own ``lerobot-*`` scripts stay untouched.

Subcommand modules are imported only when their command runs, so ``lerobot --help``
and ``inspect-checkpoint`` never import torch.
"""

from __future__ import annotations

import difflib
import importlib

import click

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "train": ("lerobot_kit.cli.train", "Train a policy (one process, torchrun or accelerate launch)."),
    "eval": ("lerobot_kit.cli.eval", "Evaluate a checkpoint in an environment, next to the scripted expert."),
    "convert-dcp": ("lerobot_kit.cli.convert_dcp", "Merge DCP weight shards into model.safetensors, offline."),
    "inspect-checkpoint": ("lerobot_kit.cli.inspect_checkpoint", "Show and validate what a checkpoint holds."),
    "plugins": ("lerobot_kit.cli.plugins", "List installed plugins and what each registered."),
    "plan": ("lerobot_kit.cli.plan", "Print the sharding plan and per-rank memory for a world size, without training."),
}


class LazyGroup(click.Group):
    """A group whose subcommands live in modules imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in SUBCOMMANDS:
            return None
        return importlib.import_module(SUBCOMMANDS[name][0]).command

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """A mistyped command names the one it is closest to, as a mistyped flag does."""
        name = args[0] if args else ""
        close = difflib.get_close_matches(name, list(SUBCOMMANDS), n=1) if name not in SUBCOMMANDS else []
        if close and not name.startswith("-"):
            ctx.fail(f"no such command {name!r}; did you mean {close[0]!r}?")
        return super().resolve_command(ctx, args)

    def invoke(self, ctx: click.Context) -> object:
        """Every subcommand words its own errors; this catches what escapes one (its module
        failing to import, say), so that no command ends in a raw traceback. A flag that
        click's options refuse is one ``error:`` line, exit code 2, like train's flags."""
        from lerobot_kit.cli.errors import command_errors
        from lerobot_kit.core.errors import ConfigError

        with command_errors():
            try:
                return super().invoke(ctx)
            except click.UsageError as exc:
                command = " ".join(filter(None, [ctx.command_path, ctx.invoked_subcommand]))
                listed = "flags" if ctx.invoked_subcommand else "commands"
                message = " ".join(exc.format_message().split())
                raise ConfigError(f"{message} (`{command} --help` lists the {listed})") from exc

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, help_text) for name, (_, help_text) in SUBCOMMANDS.items()])


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="lerobot-kit")
def cli() -> None:
    """lerobot-kit: train robot-learning policies on one process or hundreds."""
