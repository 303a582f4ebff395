"""``TrainingStep``: the one type of ``training_step.json`` that the writer, resume and inspect share."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lerobot_kit.core.layout import paths
from lerobot_kit.core.layout.training_step import (
    SamplerPosition,
    Topology,
    TrainingStep,
    problems,
    read_training_step,
    recorded_training_step,
    rewrite_weights_kind,
)
from lerobot_kit.core.errors import CheckpointError

RECORD = TrainingStep(
    step=40,
    lerobot_kit_version="0.1.0",
    dp_world_size=4,
    batch_size=8,
    gradient_accumulation_steps=2,
    mixed_precision="bf16",
    topology=Topology(world_size=4, dp_replicate=2, dp_shard=2, layout="hsdp"),
    checkpoint_format="safetensors_dcp",
    weights="gathered+dcp",
    optimizer="dcp",
    peft=True,
    sampler=SamplerPosition(epoch=1, offset=16, samples_seen=656),
)


def _step_dir(root: Path, raw: Any) -> Path:
    step_dir = root / "checkpoints" / "000040"
    (step_dir / paths.TRAINING_STATE_DIR).mkdir(parents=True)
    (step_dir / paths.PRETRAINED_DIR).mkdir()
    (step_dir / paths.TRAINING_STATE_DIR / paths.TRAINING_STEP).write_text(json.dumps(raw))
    return step_dir


def test_the_written_json_reads_back_as_the_same_record(tmp_path: Path) -> None:
    raw = RECORD.to_json()
    assert list(raw)[0] == "layout_version" and raw["layout_version"] == paths.LAYOUT_VERSION
    assert raw["topology"] == {"world_size": 4, "dp_replicate": 2, "dp_shard": 2, "layout": "hsdp"}
    assert raw["sampler"] == {"epoch": 1, "offset": 16, "samples_seen": 656}
    assert read_training_step(_step_dir(tmp_path, raw)) == RECORD
    assert RECORD.sharded


@pytest.mark.parametrize(
    ("change", "line"),
    [
        ({"step": "40"}, "step must be an integer, not a string"),
        ({"peft": 1}, "peft must be true or false, not an integer"),
        ({"topology": [2, 2]}, "topology must be an object, not a list"),
        ({"sampler": {"epoch": 1, "offset": 16}}, "missing key 'sampler.samples_seen'"),
        ({"weights": "sharded"}, "weights is 'sharded', expected one of gathered, dcp, gathered+dcp"),
        ({"batch_size": 0}, "batch_size is 0, which is out of range"),
        ({"dp_world_size": 2}, "dp_world_size is 2, but topology has dp_replicate × dp_shard = 2 × 2 = 4"),
        ({"layout_version": "1"}, "layout_version must be an integer, not a string"),
    ],
)
def test_a_damaged_record_is_refused_with_its_problem(tmp_path: Path, change: dict[str, Any], line: str) -> None:
    raw = {**RECORD.to_json(), **change}
    assert problems(raw) == [line]
    step_dir = _step_dir(tmp_path, raw)
    with pytest.raises(CheckpointError) as err:
        read_training_step(step_dir)
    assert str(err.value) == f"{step_dir / paths.TRAINING_STATE_DIR / paths.TRAINING_STEP}: {line}"
    assert recorded_training_step(step_dir) is None  # loading weights falls back to the folder's own rules


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ({"step": 40}, "has no layout_version: an older layout (such as LeRobot 0.6's)"),
        ({**RECORD.to_json(), "layout_version": 99},
         "layout version 99 is a newer, unknown layout (this lerobot-kit reads 1)"),
        ({**RECORD.to_json(), "layout_version": 0}, "layout version 0 is an older layout (this lerobot-kit reads 1)"),
    ],
)
def test_other_layouts_are_refused_for_resume(tmp_path: Path, raw: dict[str, Any], why: str) -> None:
    step_dir = _step_dir(tmp_path, raw)
    with pytest.raises(CheckpointError) as err:
        read_training_step(step_dir)
    assert str(err.value) == (
        f"{step_dir / paths.TRAINING_STATE_DIR / paths.TRAINING_STEP}: {why}; it cannot be resumed, but its weights "
        "can still be loaded with --policy.path"
    )


def test_missing_and_unparsable_records(tmp_path: Path) -> None:
    step_dir = _step_dir(tmp_path, RECORD.to_json())
    record = step_dir / paths.TRAINING_STATE_DIR / paths.TRAINING_STEP
    record.write_text('{"step": ')
    with pytest.raises(CheckpointError, match=r"training_step.json: not valid JSON \(.*; the file is corrupt"):
        read_training_step(step_dir)
    record.unlink()
    with pytest.raises(CheckpointError, match="training_step.json: missing; the checkpoint is incomplete"):
        read_training_step(step_dir)
    assert recorded_training_step(step_dir) is None


def test_rewriting_the_weights_kind_keeps_every_other_key(tmp_path: Path) -> None:
    raw = {**RECORD.to_json(), "written_by_a_later_version": [1, 2]}
    step_dir = _step_dir(tmp_path, raw)
    rewrite_weights_kind(step_dir / paths.PRETRAINED_DIR, "gathered")
    record = step_dir / paths.TRAINING_STATE_DIR / paths.TRAINING_STEP
    assert json.loads(record.read_text()) == {**raw, "weights": "gathered"}
    assert [p.name for p in record.parent.iterdir()] == [paths.TRAINING_STEP]  # no temporary file left

    other = _step_dir(tmp_path / "old", {"step": 40})  # another layout is never rewritten
    rewrite_weights_kind(other / paths.PRETRAINED_DIR, "gathered")
    assert json.loads((other / paths.TRAINING_STATE_DIR / paths.TRAINING_STEP).read_text()) == {"step": 40}


def test_importing_the_record_imports_no_torch() -> None:
    code = "import sys, lerobot_kit.core.layout.training_step, lerobot_kit.core.layout.stored_weights; " \
           "print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
