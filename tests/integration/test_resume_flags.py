"""Flags on resume through the console script take effect (the refusals are checked in
process by tests/unit/test_resume_rules.py). One tiny run (checkpoints at steps 2 and 4)
is trained once; each case resumes a copy of it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import TINY_ACT, built_once, launch_env, pool_train, read_metrics, run_cli

SMALL = [*TINY_ACT, "--dataset.num_episodes=2", "--dataset.episode_length=20", "--batch_size=4", "--log_freq=1",
         "--save_freq=2", "--num_workers=0"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, rank_pools) -> Path:
    """In a rank pool (``tests/rank_pool.py``): the resumes are what runs the console script."""

    def build(root: Path) -> None:
        pool_train(rank_pools, 1, f"--output_dir={root / 'run'}", *SMALL, "--steps=4", workdir=root)

    return built_once(tmp_path_factory, "resume_flags_trained", build) / "run"


def copy_of(run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run, copy, symlinks=True)
    return copy


def config_of(run: Path, step: str) -> Path:
    return run / "checkpoints" / step / "pretrained_model" / "train_config.json"


def resume(run: Path, *args: str):
    return run_cli("train", "--resume=true", *args, env=launch_env(run.parent))


def test_resume_from_an_older_step_with_a_new_learning_rate(trained, tmp_path):
    """--resume_from removes the later step folders; a new LR really drives the resumed steps and is recorded."""
    run = copy_of(trained, tmp_path)
    result = resume(run, f"--config_path={config_of(run, '000002')}", "--resume_from=2", "--steps=3",
                    "--save_freq=3", "--optimizer.lr=0.01")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "--resume_from=2: removed the later step folders 000004; the run continues from step 2" in result.stderr
    assert "resume: --optimizer.lr=0.01 replaces the checkpoint's 0.0001" in result.stderr
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["000002", "000003", "last"]
    assert (run / "checkpoints" / "last").resolve().name == "000003"
    resumed = read_metrics(run)[-1]  # rows are appended: the abandoned steps 3 and 4 logged 1e-4 before it
    assert (resumed["step"], resumed["lr"]) == (3, 0.01)
    assert json.loads(config_of(run, "000003").read_text())["optimizer"]["lr"] == 0.01
