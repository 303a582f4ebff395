"""The LeRobot dataset reader asked to download while the Hub is offline: one clear error.

A fresh interpreter, because huggingface_hub reads HF_HUB_OFFLINE when it is first imported.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from _dist_util import clean_env

pytestmark = pytest.mark.fast  # starts no training run: the inner loop (-m "not slow") runs it


def test_allowed_download_offline_is_a_clear_error(tmp_path: Path) -> None:
    code = (
        "from lerobot_kit.plugins.datasets.lerobot.plugin import LeRobotDatasetConfig\n"
        "from lerobot_kit.plugins.datasets.lerobot.reader import make_lerobot_dataset\n"
        "from lerobot_kit.core.errors import LerobotError\n"
        "try:\n"
        "    make_lerobot_dataset(LeRobotDatasetConfig(repo_id='user/x', allow_download=True), {})\n"
        "except LerobotError as exc:\n"
        "    print(exc)\n"
    )
    env = {**clean_env(tmp_path), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "could not download dataset 'user/x' from the Hugging Face Hub" in result.stdout
    assert "--dataset.root=<dir>" in result.stdout
