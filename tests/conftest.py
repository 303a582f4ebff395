"""Shared test helpers: run the installed console scripts as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parent.parent


def script(name: str) -> str:
    path = BIN / name
    assert path.exists(), f"console script {name} is not installed next to {sys.executable}"
    return str(path)


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120, cwd: Path | None = None,
            command: str = "lerobot") -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [script(command), *args], capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd
    )


@pytest.fixture
def cli():
    return run_cli
