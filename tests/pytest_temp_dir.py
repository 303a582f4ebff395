"""A session fixture both test suites (the main one and the LeRobot bridge's) use: the
temporary files of the tests and of every process they start go to pytest's own folder,
which pytest prunes. Each torchrun leaves a log folder in the temp dir and LeRobot's config
loading a JSON file, hundreds per suite run. torch.compile's cache (kernels, precompiled
headers: 150 MB) stays where it is, linked in, so compiled code is reused between runs and
not copied per test worker."""

from __future__ import annotations

import getpass
import os
import tempfile
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def temp_files_in_pytest_folder(tmp_path_factory: pytest.TempPathFactory) -> None:
    inductor_cache = Path(tempfile.gettempdir()) / f"torchinductor_{getpass.getuser()}"
    inductor_cache.mkdir(exist_ok=True)
    temp_dir = tmp_path_factory.mktemp("tmp")
    (temp_dir / inductor_cache.name).symlink_to(inductor_cache)
    os.environ["TMPDIR"] = str(temp_dir)
    tempfile.tempdir = None
