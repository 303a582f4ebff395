"""``python -m lerobot_kit.cli``: the ``lerobot`` command without its console script, for
launchers that start a module (``torchrun -m lerobot_kit.cli train ...``) and for
environments whose scripts folder is not on PATH."""

from lerobot_kit.cli.main import cli

cli(prog_name="lerobot")
