"""Flags on resume (``core.run.resume.allowed_changes`` through ``resolve_run``): what may change, what is
refused in one line, and which step a resume picks, on run folders holding recorded configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from checkpoint_files import write_checkpoint

from lerobot_kit.core.config.flags import parse_train_config
from lerobot_kit.core.errors import CheckpointError, ConfigError
from lerobot_kit.core.run.spec import Restarts, resolve_run

RUN_FLAGS = ["--policy.dim_model=32", "--dataset.num_episodes=2", "--seed=3"]


def recorded_run(tmp_path: Path, *steps: int, last: bool = True) -> Path:
    """Step folders as a run leaves them, each with the train_config.json the run records."""
    run = tmp_path / "run"
    spec = resolve_run(parse_train_config([*RUN_FLAGS, f"--output_dir={run}"]), 1)
    for step in steps:
        step_dir = write_checkpoint(run, step=step, last=False)
        (step_dir / "pretrained_model" / "train_config.json").write_text(json.dumps(spec.recorded_config()))
    if last:
        (run / "checkpoints" / "last").symlink_to(f"{max(steps):06d}")
    return run


def config_of(run: Path, step: str = "last") -> str:
    return f"--config_path={run / 'checkpoints' / step / 'pretrained_model' / 'train_config.json'}"


def resolve(*flags: str, restarts: Restarts = Restarts()):
    return resolve_run(parse_train_config(list(flags)), 1, restarts)


def refusal(*flags: str, error: type[Exception] = ConfigError) -> str:
    with pytest.raises(error) as raised:
        resolve(*flags)
    return str(raised.value)


def test_settings_that_take_effect_may_change_on_resume(tmp_path):
    run = recorded_run(tmp_path, 2)
    spec = resolve("--resume=true", config_of(run), "--optimizer.lr=0.01", "--steps=50", "--batch_size=2",
                   "--scheduler.type=cosine", "--dataset.image_transforms.enable=true", "--policy.push_to_hub=false")
    assert spec.resume_from == run / "checkpoints" / "000002" and spec.recorded_config()["optimizer"]["lr"] == 0.01


def test_a_changed_policy_type_is_one_line_not_a_line_per_field_of_the_old_type(tmp_path):
    run = recorded_run(tmp_path, 2)
    assert refusal("--resume=true", config_of(run), "--policy.type=diffusion") == (
        "--policy.type=diffusion differs from the checkpoint's act; the policy type cannot change on resume "
        "(the checkpoint holds act weights): remove --policy.type, or start a new run in another --output_dir"
    )


@pytest.mark.parametrize("flags, expected", [
    (["--policy.dim_model=64", "--policy.n_heads=2"],
     "--policy.dim_model=64 (checkpoint: 32), --policy.n_heads=2 (checkpoint: 4) differ from the checkpoint "
     "being resumed; the policy cannot change on resume (the checkpoint's weights were trained as that model): "
     "remove the flag to resume, or start a new run in another --output_dir (--policy.path=<this step folder> "
     "starts it from these weights)"),
    (["--dataset.num_episodes=5"], "--dataset.num_episodes=5 (checkpoint: 2) differs from the checkpoint being "
     "resumed; the dataset cannot change on resume (the restored data position indexes that data)"),
    (["--seed=4"], "--seed=4 (checkpoint: 3) differs from the checkpoint being resumed; the seed cannot change"),
], ids=["policy", "dataset", "seed"])
def test_settings_the_restored_state_was_made_for_are_refused_by_name(tmp_path, flags, expected):
    run = recorded_run(tmp_path, 2)
    message = refusal("--resume=true", config_of(run), *flags)
    assert message.startswith(expected) and len(message.splitlines()) == 1, message


def test_a_refusal_without_config_path_says_how_to_resume_with_the_runs_own_settings(tmp_path):
    """``--resume=true --output_dir=<run>`` alone builds the run from defaults, which differ
    from what it was trained with; the refusal names them and the file that has the run's."""
    run = recorded_run(tmp_path, 2)
    lines = refusal("--resume=true", f"--output_dir={run}").splitlines()
    assert lines[0].startswith("--policy.dim_model=64 (checkpoint: 32) differs from the checkpoint being resumed")
    assert lines[-1] == (
        "(flags not given take their defaults, not the run's: to resume with the run's own settings, pass "
        f"--config_path={run / 'checkpoints' / '000002' / 'pretrained_model' / 'train_config.json'} and only the "
        "flags to change)"
    )
    assert resolve("--resume=true", config_of(run)).resume_from == run / "checkpoints" / "000002"


def test_an_output_dir_other_than_the_resumed_runs_is_refused(tmp_path):
    run = recorded_run(tmp_path, 2)
    assert refusal("--resume=true", config_of(run), f"--output_dir={tmp_path / 'elsewhere'}").startswith(
        f"--output_dir={tmp_path / 'elsewhere'} differs from the folder of the run being resumed ({run}); a resumed "
        "run continues in its own folder")


def test_an_older_step_than_the_newest_needs_resume_from(tmp_path):
    run = recorded_run(tmp_path, 2, 4, 6)
    newest = run / "checkpoints" / "000006" / "pretrained_model" / "train_config.json"
    assert refusal("--resume=true", config_of(run, "000002")) == (
        f"--config_path is step 2, but {run} has later checkpoints (000004, 000006) that resuming from it would "
        f"overwrite: pass --resume_from=2 to continue from step 2 and remove them, or resume the newest with "
        f"--config_path={newest}"
    )
    spec = resolve("--resume=true", config_of(run, "000002"), "--resume_from=2")
    assert spec.resume_from == run / "checkpoints/000002"
    assert spec.discarded == (run / "checkpoints/000004", run / "checkpoints/000006")
    by_folder = resolve("--resume=true", *RUN_FLAGS, f"--output_dir={run}", "--resume_from=4")
    assert by_folder.resume_from == run / "checkpoints/000004" and by_folder.discarded == (run / "checkpoints/000006",)
    assert resolve("--resume=true", config_of(run, "000006")).discarded == ()


def test_resume_from_names_a_step_the_run_has_and_goes_with_resume_true(tmp_path):
    run = recorded_run(tmp_path, 2, 4)
    assert refusal("--resume=true", config_of(run), "--resume_from=3", error=CheckpointError) == (
        f"--resume_from=3: {run} has no complete step folder 000003 (resumable steps: 2, 4); pass one of those")
    assert refusal("--resume=auto", f"--output_dir={run}", "--resume_from=2").startswith(
        "--resume_from=2 picks the step a --resume=true run continues from; --resume=auto continues from last: "
        "pass --resume=true, or remove --resume_from")
    assert "--resume=False starts a new run" in refusal(f"--output_dir={tmp_path / 'new'}", "--resume_from=2")


def test_without_last_a_resume_continues_from_the_newest_complete_step_folder(tmp_path):
    run = recorded_run(tmp_path, 2, 4, last=False)
    (run / "checkpoints" / "000006.tmp" / "pretrained_model").mkdir(parents=True)  # a save that died
    for resume in ("--resume=true", "--resume=auto"):
        spec = resolve(resume, *RUN_FLAGS, f"--output_dir={run}")
        assert spec.resume_from == run / "checkpoints/000004"
        assert spec.resume_note.endswith(
            "(step 4); checkpoints/last is missing, so the newest complete step folder 000004 is used")
    restarted = resolve(*RUN_FLAGS, f"--output_dir={run}", restarts=Restarts(count=1))
    assert restarted.resume_from == run / "checkpoints/000004"


def _with_retired_settings(run: Path, **parallelism: object) -> None:
    """The run's recorded config as a version that had ``--parallelism.tp/cp`` and ``--optimizer.type`` wrote it."""
    file = run / "checkpoints" / "last" / "pretrained_model" / "train_config.json"
    recorded = json.loads(file.read_text())
    recorded["parallelism"].update({"tp": 1, "cp": 1, **parallelism})
    recorded["optimizer"]["type"] = "adamw"
    file.write_text(json.dumps(recorded))


def test_a_config_recording_the_retired_single_value_settings_still_resumes(tmp_path):
    run = recorded_run(tmp_path, 2)
    _with_retired_settings(run)
    spec = resolve("--resume=true", config_of(run))
    assert spec.resume_from == run / "checkpoints" / "000002"
    recorded = spec.recorded_config()
    assert "tp" not in recorded["parallelism"] and "cp" not in recorded["parallelism"]
    assert "type" not in recorded["optimizer"]


def test_a_retired_setting_with_another_value_is_refused_as_unknown(tmp_path):
    run = recorded_run(tmp_path, 2)
    _with_retired_settings(run, tp=2)
    assert "parallelism.tp" in refusal("--resume=true", config_of(run))
    assert "parallelism.tp" in refusal("--parallelism.tp=1")
