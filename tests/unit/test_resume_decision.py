"""Where a run writes and what it resumes from (``core.run.spec.resolve_run``) when a
launcher restarts it, under ``--resume=auto`` and ``--resume=true``, on real folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from records import write_resumable_step

from lerobot_kit.core.config.flags import parse_train_config
from lerobot_kit.core.errors import CheckpointError, ConfigError
from lerobot_kit.core.run.spec import Restarts, resolve_run


def run_with_checkpoints(root: Path, *steps: int) -> Path:
    """A run folder as the trainer leaves it: step folders and ``last`` on the newest."""
    checkpoints = root / "run" / "checkpoints"
    for step in steps:
        write_resumable_step(checkpoints / f"{step:06d}")
    (checkpoints / "last").symlink_to(f"{max(steps):06d}")
    return root / "run"


def resolve(*flags: str, restarts: Restarts = Restarts()):
    return resolve_run(parse_train_config(list(flags)), 1, restarts)


def test_a_restart_continues_from_last_without_any_flag(tmp_path):
    run = run_with_checkpoints(tmp_path, 10, 20)
    spec = resolve(f"--output_dir={run}", restarts=Restarts(count=1, allowed=1))
    assert spec.resume_from == run / "checkpoints/000020" and spec.output_dir == run
    assert spec.resume_note == f"restart 1 of this run: continuing from {run / 'checkpoints/000020'} (step 20)"


def test_a_restart_before_the_first_checkpoint_starts_again_in_the_same_folder(tmp_path):
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)  # the failed attempt logged, then died before saving
    spec = resolve(f"--output_dir={run}", restarts=Restarts(count=2))
    assert spec.resume_from is None and spec.output_dir == run
    assert spec.resume_note == f"restart 2 of this run: no checkpoint in {run} yet, starting from step 0"


def test_a_restart_of_a_resumed_run_continues_from_last_not_from_the_checkpoint_first_given(tmp_path):
    run = run_with_checkpoints(tmp_path, 10, 20, 30)
    first = run / "checkpoints/000010/pretrained_model/train_config.json"
    first.write_text(json.dumps({"output_dir": str(run), "resume": True}))  # as a checkpoint records it
    command = ("--resume=true", f"--config_path={first}", "--resume_from=10")
    spec = resolve(*command)
    assert spec.resume_from == run / "checkpoints/000010"
    assert spec.discarded == (run / "checkpoints/000020", run / "checkpoints/000030")
    (run / "checkpoints/last").unlink()
    (run / "checkpoints/last").symlink_to("000030")  # the resumed run saved step 30 again
    restarted = resolve(*command, restarts=Restarts(count=1))
    assert restarted.resume_from == run / "checkpoints/000030" and restarted.discarded == ()


def test_resume_auto_resumes_when_a_checkpoint_exists_else_starts(tmp_path):
    run = run_with_checkpoints(tmp_path, 4)
    assert resolve("--resume=auto", f"--output_dir={run}").resume_from == run / "checkpoints/000004"
    fresh = resolve("--resume=auto", f"--output_dir={tmp_path / 'new'}")
    assert fresh.resume_from is None and fresh.output_dir == tmp_path / "new"
    assert not fresh.recorded_config()["resume"]


def test_restarts_and_auto_need_an_output_dir(tmp_path):
    with pytest.raises(ConfigError, match=r"restart 1 of this run continues the run in its --output_dir, and none"):
        resolve(restarts=Restarts(count=1))
    with pytest.raises(ConfigError, match=r"--resume=auto continues the run in its --output_dir"):
        resolve("--resume=auto")


def test_torchrun_max_restarts_without_output_dir_is_refused_at_the_first_start():
    with pytest.raises(ConfigError, match=r"torchrun --max-restarts=2 restarts this run in its output folder"):
        resolve(restarts=Restarts(count=0, allowed=2))


def test_without_a_restart_an_existing_run_is_still_protected(tmp_path):
    run = run_with_checkpoints(tmp_path, 4)
    with pytest.raises(ConfigError, match=r"already exists and is not empty; pass --resume=true .*--resume=auto"):
        resolve(f"--output_dir={run}")
    with pytest.raises(CheckpointError, match=r"has no checkpoint to resume"):
        resolve("--resume=true", f"--output_dir={tmp_path / 'empty'}")


def test_resume_accepts_true_false_auto_and_names_a_bad_value_once():
    assert parse_train_config(["--resume=Auto"]).resume == "auto"
    assert parse_train_config(["--resume=true"]).resume is True
    with pytest.raises(ConfigError) as error:
        parse_train_config(["--resume=maybe"])
    assert str(error.value) == "--resume: Value error, expected true, false or auto (got 'maybe')"
