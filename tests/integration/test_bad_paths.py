"""``lerobot train`` with an output folder it cannot use, or a config file it cannot read:
one line naming the path and the fix, exit code 2, no traceback, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_cli, tmpfs
from lerobot_kit.core.errors import ConfigError
from lerobot_kit.core.run.output.writable import check_writable

pytestmark = pytest.mark.fast  # starts no training run: the inner loop (-m "not slow") runs it

RUN = ["--dataset.num_episodes=2", "--dataset.episode_length=20", "--steps=1"]


@pytest.fixture
def read_only_mount(tmp_path):
    """A real read-only file system (tests run as root, and root ignores chmod); unmounted afterwards."""
    with tmpfs(tmp_path / "ro", "size=1m,ro") as mount:
        yield mount


def refused(tmp_path: Path, *args: str) -> str:
    before = sorted(tmp_path.rglob("*"))
    result = run_cli("train", *RUN, *args, cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == "", result.stdout + result.stderr
    [line] = result.stderr.splitlines()
    assert sorted(tmp_path.rglob("*")) == before  # nothing written
    return line


def test_an_output_dir_that_is_a_file_or_under_one(tmp_path):
    existing = tmp_path / "notes.txt"
    existing.write_text("mine")
    assert refused(tmp_path, f"--output_dir={existing}") == (
        f"error: --output_dir={existing} is an existing file, not a folder: pass a folder path")
    assert existing.read_text() == "mine"
    with pytest.raises(ConfigError) as error:  # the same check, in process
        check_writable(existing / "run")
    assert str(error.value) == (
        f"--output_dir={existing}/run is under {existing}, a file, not a folder: pass a folder path")


def test_an_output_dir_on_a_read_only_mount(tmp_path, read_only_mount):
    assert refused(tmp_path, f"--output_dir={read_only_mount / 'run'}") == (
        f"error: --output_dir={read_only_mount / 'run'}: {read_only_mount} is not writable (a read-only mount, or no "
        "permission): pass an --output_dir on a writable file system")
