"""``training_step.json`` for hand-made step folders, so tests can say what a checkpoint records."""

from __future__ import annotations

import json
from pathlib import Path

from lerobot_kit.core.layout import paths
from lerobot_kit.core.layout.training_step import SamplerPosition, Topology, TrainingStep


def write_record(step_dir: Path, weights: str, checkpoint_format: str = "safetensors_dcp", peft: bool = False) -> Path:
    """The record of an FSDP(2) step that wrote ``weights`` with ``checkpoint_format``; returns its path."""
    record = TrainingStep(
        step=int(step_dir.name) if step_dir.name.isdigit() else 0, lerobot_kit_version="0.1.0", dp_world_size=2,
        batch_size=8, gradient_accumulation_steps=1, mixed_precision="no",
        topology=Topology(world_size=2, dp_replicate=1, dp_shard=2, layout="fsdp"),
        checkpoint_format=checkpoint_format, weights=weights, optimizer="dcp", peft=peft,
        sampler=SamplerPosition(epoch=0, offset=0, samples_seen=96),
    )
    path = step_dir / paths.TRAINING_STATE_DIR / paths.TRAINING_STEP
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record.to_json()))
    return path


def write_resumable_step(step_dir: Path) -> Path:
    """A one-process step folder whose record and files pass the resume's checks (the layout
    table's required files, as empty stand-ins), for tests of what a resume decides, not of
    what it loads. Files already there are kept."""
    from lerobot_kit.core.layout import files

    record = TrainingStep(
        step=int(step_dir.name), lerobot_kit_version="0.1.0", dp_world_size=1, batch_size=8,
        gradient_accumulation_steps=1, mixed_precision="no",
        topology=Topology(world_size=1, dp_replicate=1, dp_shard=1, layout="single"),
        checkpoint_format="safetensors", weights="gathered", optimizer="safetensors", peft=False,
        sampler=SamplerPosition(epoch=0, offset=0, samples_seen=0),
    )
    record_file = step_dir / paths.TRAINING_STATE_DIR / paths.TRAINING_STEP
    record_file.parent.mkdir(parents=True, exist_ok=True)
    record_file.write_text(json.dumps(record.to_json()))
    for file in files.required(files.CheckpointKind.of(record)):
        path = step_dir / file.path
        path.parent.mkdir(parents=True, exist_ok=True)
        if file.folder:
            path.mkdir(exist_ok=True)
        elif not path.exists():
            path.write_text("{}")
    return step_dir
