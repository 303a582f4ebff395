"""The CLI's light paths never import torch, so they stay fast in shells and CI."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import run_cli

NO_TORCH = """
import sys
from lerobot_kit.cli.main import cli
try:
    cli({args!r}, standalone_mode=False)
except SystemExit:
    pass
assert "torch" not in sys.modules, "torch was imported"
print("NO-TORCH-OK")
"""


@pytest.mark.parametrize("args", [["--help"], ["train", "--help"], ["plugins"]])
def test_light_commands_do_not_import_torch(args):
    result = subprocess.run([sys.executable, "-c", NO_TORCH.format(args=args)], capture_output=True, text=True,
                            timeout=60)
    assert "NO-TORCH-OK" in result.stdout, result.stdout + result.stderr


def test_group_help_lists_every_subcommand():
    result = run_cli("--help")
    for name in ("train", "convert-dcp", "inspect-checkpoint", "plugins"):
        assert name in result.stdout


def test_config_side_modules_do_not_import_torch() -> None:
    """`lerobot --help`, `plan` and the launcher registry must stay torch-free."""
    code = (
        "import sys\n"
        "import lerobot_kit.core.parallel.dims, lerobot_kit.core.distributed.accelerate_guard, lerobot_kit.plugins.launchers.builtin\n"
        "from lerobot_kit.core.registry.registry import get_registry\n"
        "get_registry().launchers()\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
