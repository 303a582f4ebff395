"""``lerobot convert-dcp``: a thin shell over
``core.offline.convert`` and ``core.run.publishing``.

torch is imported only when the command runs, so ``convert-dcp --help`` stays fast.
Boolean flags take ``=true/false/1/0`` like the train flags, and a bare ``--delete_dcp``
means true.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from lerobot_kit.cli.errors import command_errors
from lerobot_kit.core.errors import ConfigError
from lerobot_kit.core.layout.byte_size import byte_size


def _bool_option(name: str, help_text: str):  # type: ignore[no-untyped-def]
    return click.option(
        f"--{name}", name, type=click.BOOL, default=False, is_flag=False, flag_value=True, show_default=True,
        help=help_text,
    )


class _TtyProgress:
    """One self-overwriting stderr line; ``end`` closes it so what follows starts clean."""

    def __init__(self) -> None:
        self.drawn = False

    def __call__(self, phase: str, done: int, total: int) -> None:
        click.echo(f"\r{phase}: {100 * done // max(total, 1):3d}% of {byte_size(total)}", nl=False, err=True)
        self.drawn = True

    def end(self) -> None:
        if self.drawn:
            click.echo(err=True)


@click.command(
    name="convert-dcp",
    help="Merge the DCP weight shards of a checkpoint (pretrained_model/pytorch_model_fsdp_0/) into "
    "model.safetensors, or adapter_model.safetensors for PEFT, offline, in one process, with no GPU. "
    "The file is verified against the shards before it replaces anything. "
    "Exit codes: 0 converted (and pushed), 1 checkpoint or push problem, 2 bad flags.",
)
@click.option(
    "--checkpoint_dir", "checkpoint_dir", required=True, type=click.Path(path_type=Path),
    help="A step folder (checkpoints/005000), its pretrained_model/, or a run folder (its last step).",
)
@_bool_option("delete_dcp", "Delete the shard folder after the merged file is written and verified.")
@_bool_option("overwrite", "Replace an existing model.safetensors / adapter_model.safetensors.")
@click.option("--push_to_hub", "push_to_hub", default=None, metavar="USER/REPO",
              help="Upload pretrained_model/ (without the shards) to this Hugging Face model repo.")
@_bool_option("private", "Create the --push_to_hub repo as private.")
def command(checkpoint_dir: Path, delete_dcp: bool, overwrite: bool, push_to_hub: str | None, private: bool) -> None:
    with command_errors():
        if private and not push_to_hub:
            raise ConfigError("--private=true needs --push_to_hub=user/repo")
        from lerobot_kit.core.offline.convert_input import check_convertible

        check_convertible(checkpoint_dir, overwrite)  # before torch is imported: a refusal takes a second
        from lerobot_kit.core.offline.convert import convert_dcp

        progress = _TtyProgress() if sys.stderr.isatty() else None
        try:
            result = convert_dcp(checkpoint_dir, overwrite=overwrite, delete_dcp=delete_dcp, progress=progress)
        finally:
            if progress:
                progress.end()
        click.echo(result.summary())
        if push_to_hub:
            from lerobot_kit.core.run.publishing import push_pretrained_dir

            url = push_pretrained_dir(result.output.parent, push_to_hub, private)
            click.echo(f"pushed {result.output.parent} to {push_to_hub}: {url}")
