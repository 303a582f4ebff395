"""The CLI's light paths never import torch, so they stay fast in shells and CI.

The installed console script runs with ``PYTHONPROFILEIMPORTTIME=1``: Python itself then
logs every module the process imports, so "torch was not imported" is read from the
interpreter, not from a check the command could skip.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from conftest import REPO, run_cli

pytestmark = pytest.mark.fast  # starts no training run: the inner loop (-m "not slow") runs it

LIGHT = [["--help"], ["train", "--help"], ["eval", "--help"], ["plan", "--help"], ["convert-dcp", "--help"],
         ["inspect-checkpoint", "--help"], ["plugins"]]


def imported_modules(stderr: str) -> set[str]:
    """Module names from ``-X importtime`` lines: ``import time: self | cumulative | name``."""
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


@pytest.mark.parametrize("args", LIGHT, ids=" ".join)
def test_light_commands_do_not_import_torch(args: list[str]) -> None:
    result = run_cli(*args, env={"PYTHONPROFILEIMPORTTIME": "1"}, timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip(), "the command printed nothing"
    modules = imported_modules(result.stderr)
    assert "lerobot_kit.cli.main" in modules  # the log covers the command's own imports
    assert sorted(m for m in modules if m.split(".")[0] == "torch") == []


def test_group_help_lists_every_documented_command() -> None:
    documented = re.findall(r"^\| `lerobot ([a-z-]+)`", (REPO / "README.md").read_text(), re.MULTILINE)
    assert sorted(documented) == ["convert-dcp", "eval", "inspect-checkpoint", "plan", "plugins", "train"]
    result = run_cli("--help", timeout=60)
    assert result.returncode == 0, result.stderr
    listed = re.findall(r"^  ([a-z-]+)\s", result.stdout.split("Commands:", 1)[1], re.MULTILINE)
    assert sorted(listed) == sorted(documented)


def test_config_side_modules_do_not_import_torch() -> None:
    """The config, topology, Accelerate guard and launcher registry stay torch-free, so
    `lerobot --help` and `plan`'s argument checks can use them."""
    code = (
        "import sys\n"
        "import lerobot_kit.core.parallel.dims, lerobot_kit.core.distributed.accelerate_guard, "
        "lerobot_kit.plugins.launchers.builtin\n"
        "from lerobot_kit.core.registry.registry import get_registry\n"
        "launchers = get_registry().launchers()\n"
        "assert len(launchers) >= 4, launchers\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_python_dash_m_runs_the_same_command() -> None:
    """``python -m lerobot_kit.cli`` (what ``torchrun -m`` starts) is ``lerobot`` itself:
    the same help under the same name, and the same one-line usage errors."""
    module = [sys.executable, "-m", "lerobot_kit.cli"]
    as_module = subprocess.run([*module, "--help"], capture_output=True, text=True, timeout=60)
    assert as_module.returncode == 0 and as_module.stdout == run_cli("--help", timeout=60).stdout
    wrong = subprocess.run([*module, "trian"], capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 2 and "Traceback" not in wrong.stderr
    assert wrong.stderr.strip().splitlines() == [
        "error: no such command 'trian'; did you mean 'train'? (`lerobot --help` lists the commands)"
    ], wrong.stderr
