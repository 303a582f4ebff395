"""One table of a checkpoint's files: ``inspect-checkpoint`` and the resume agree, file for file.

For each kind of checkpoint (full or PEFT weights; gathered, sharded or both; one
optimizer file or shards; fp16 with its loss scaler) and each file the table requires of
it, a step folder without that file is refused by the resume's decision and reported by
``inspect-checkpoint``, both naming the file and why it is required. The console scripts
run the scheduler-state case end to end.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from checkpoint_files import write_checkpoint
from conftest import run_cli

from lerobot_kit.core.config.flags import parse_train_config
from lerobot_kit.core.errors import CheckpointError
from lerobot_kit.core.layout import files
from lerobot_kit.core.layout import paths as L
from lerobot_kit.core.layout.training_step import read_training_step
from lerobot_kit.core.offline.inspect import inspect_checkpoint
from lerobot_kit.core.run.spec import resolve_run

pytestmark = pytest.mark.fast  # starts no training run: the inner loop (-m "not slow") runs it

KINDS = {
    "full, gathered, one optimizer file": {},
    "full, DCP shards, fp16": {"weights": "dcp", "optimizer": "dcp", "dp_shard": 2, "mixed_precision": "fp16"},
    "full, gathered and shards": {"weights": "gathered+dcp", "optimizer": "dcp", "dp_shard": 2},
    "PEFT adapter, gathered": {"peft": True},
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("kinds")
    return {name: write_checkpoint(root / f"run{i}", **options) for i, (name, options) in enumerate(KINDS.items())}


def _cases() -> list[tuple[str, str]]:
    """(kind, required file) for every kind, from the table itself."""
    import tempfile

    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, options) in enumerate(KINDS.items()):
            step_dir = write_checkpoint(Path(tmp) / f"run{i}", **options)
            kind = files.CheckpointKind.of(read_training_step(step_dir))
            cases += [(name, file.path) for file in files.required(kind)]
    return cases


CASES = _cases()


def test_every_file_of_the_table_is_covered() -> None:
    assert {path for _, path in CASES} == {file.path for file in files.layout_files()}


@pytest.mark.parametrize(("kind", "required"), CASES)
def test_inspect_and_the_resume_refuse_a_checkpoint_without_a_required_file(
    checkpoints: dict[str, Path], tmp_path: Path, kind: str, required: str
) -> None:
    run = tmp_path / "run"
    shutil.copytree(checkpoints[kind].parent.parent, run, symlinks=True)
    step_dir = run / L.CHECKPOINTS_DIR / checkpoints[kind].name
    target = step_dir / required
    shutil.rmtree(target) if target.is_dir() else target.unlink()

    report = inspect_checkpoint(step_dir, verify=False)
    said = [line for line in report.problems if line.startswith(f"{required}: missing (")]
    assert said and report.resumable.ok is False, report.problems

    with pytest.raises(CheckpointError) as refused:
        resolve_run(parse_train_config(["--resume=true", f"--output_dir={run}"]), 1)
    assert f"{step_dir}/{said[0]}" in str(refused.value)
    assert "the checkpoint is incomplete" in str(refused.value)


def test_the_console_scripts_agree_on_a_missing_scheduler_state(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(checkpoints["full, gathered, one optimizer file"].parent.parent, run, symlinks=True)
    step_dir = L.last_checkpoint(run)
    assert step_dir is not None
    (step_dir / L.TRAINING_STATE_DIR / L.SCHEDULER_STATE).unlink()
    line = f"{L.TRAINING_STATE_DIR}/{L.SCHEDULER_STATE}: missing (every checkpoint holds it)"

    inspected = run_cli("inspect-checkpoint", str(step_dir))
    assert inspected.returncode == 1
    assert f"error: {line}" in inspected.stderr.splitlines()
    assert "resumable: no" in inspected.stdout

    resumed = run_cli("train", "--resume=true", f"--output_dir={run}", "--steps=10")
    assert resumed.returncode == 1, resumed.stderr
    assert resumed.stderr.splitlines() == [
        f"error: {step_dir}/{line}; the checkpoint is incomplete: {run} has no earlier step folder to resume from: "
        "start a new run in another --output_dir"
    ]
