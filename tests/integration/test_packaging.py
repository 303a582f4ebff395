"""The wheel holds every module of api/, core/, plugins/ and cli/ under lerobot_kit.*."""

from __future__ import annotations

import subprocess
import sys
import zipfile

import pytest
from conftest import REPO

pytestmark = pytest.mark.fast  # starts no training run: the inner loop (-m "not slow") runs it


def test_wheel_contains_every_module(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path), str(REPO)],
        check=True, capture_output=True, timeout=300,
    )
    wheel = next(tmp_path.glob("lerobot_kit-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = set()
    for top in ("api", "core", "plugins", "cli"):
        for source in (REPO / top).rglob("*.py"):
            expected.add("lerobot_kit/" + source.relative_to(REPO).as_posix())
    missing = sorted(expected - names)
    assert not missing, f"modules missing from the wheel (add their packages to pyproject.toml): {missing}"
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    ours = _console_scripts(zipfile.ZipFile(wheel).read(entry_points).decode())
    assert ours == {"lerobot"}
    # LeRobot 0.6.1's console scripts, read from its wheel's entry_points.txt: installing
    # both packages in one environment must not overwrite (or later delete) any of them.
    lerobots = set((REPO / "tests" / "data" / "lerobot_0.6.1_console_scripts.txt").read_text().split())
    assert "lerobot-train" in lerobots and not ours & lerobots


def _console_scripts(entry_points_txt: str) -> set[str]:
    section, names = "", set()
    for line in entry_points_txt.splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[console_scripts]" and "=" in line:
            names.add(line.split("=")[0].strip())
    return names
