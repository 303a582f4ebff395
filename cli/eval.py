"""``lerobot eval``: flags → a checkpoint evaluated in an environment → ``eval_info.json``, one summary line."""

from __future__ import annotations

import click

from lerobot_kit.cli.errors import command_errors

USAGE = [
    "Usage: lerobot eval --policy.path=CHECKPOINT [--env.type=reach] [--eval.n_episodes=N] [--eval.batch_size=B] "
    "[--seed=S] [--output_dir=DIR]",
    "",
    "Roll the policy out in the environment (through select_action), and the scripted expert on the same",
    "episode seeds; write eval_info.json, videos/ and rollouts.png, and print one summary line.",
    "",
]


def run_eval(args: list[str]) -> None:
    with command_errors():
        if "--help" in args or "-h" in args:
            from lerobot_kit.cli.help import render_help
            from lerobot_kit.core.eval.config import EvalRunConfig

            click.echo(render_help(USAGE, EvalRunConfig, args))
            return
        from lerobot_kit.core.eval.config import parse_eval_config

        config = parse_eval_config(args)
        from lerobot_kit.core.eval.from_checkpoint import evaluate_checkpoint
        from lerobot_kit.core.eval.metrics import summary

        info, output_dir = evaluate_checkpoint(config)
        click.echo(f"eval: {summary(info)} | {output_dir}")


@click.command(
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
    add_help_option=False,
    help="Evaluate a checkpoint in an environment. `lerobot eval --help` lists every flag.",
)
@click.pass_context
def command(ctx: click.Context) -> None:
    run_eval(list(ctx.args))
