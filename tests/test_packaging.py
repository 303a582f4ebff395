"""The wheel holds every module of core/, plugins/ and cli/ under lerobot_kit.*."""

from __future__ import annotations

import subprocess
import sys
import zipfile

from conftest import REPO


def test_wheel_contains_every_module(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path), str(REPO)],
        check=True, capture_output=True, timeout=300,
    )
    wheel = next(tmp_path.glob("lerobot_kit-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = set()
    for top in ("core", "plugins", "cli"):
        for source in (REPO / top).rglob("*.py"):
            expected.add("lerobot_kit/" + source.relative_to(REPO).as_posix())
    missing = sorted(expected - names)
    assert not missing, f"modules missing from the wheel (add their packages to pyproject.toml): {missing}"
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    for script in ("lerobot =", "lerobot-train =", "lerobot-convert-dcp =", "lerobot-inspect-checkpoint ="):
        assert script in text
