"""``training_step.json``: what a checkpoint holds and where its run stood, as one type.

The checkpoint writer, resume, the run's sample-exactness check, the weight loaders and
``inspect-checkpoint`` all go through ``TrainingStep``, so a field is named, typed and
validated in one place: adding one here changes what is written, read and checked alike.

Torch-free: ``inspect-checkpoint`` imports it and must not import torch.
"""

from __future__ import annotations

import typing
from dataclasses import asdict, dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any

from lerobot_kit.core.errors import CheckpointError
from lerobot_kit.core.layout import paths
from lerobot_kit.core.layout.file_access import CheckpointAccessError, NotAFileError, entry_mode
from lerobot_kit.core.layout.json_file import json_type, read_json, write_json

WEIGHTS_KINDS = ("gathered", "dcp", "gathered+dcp")
OPTIMIZER_KINDS = ("safetensors", "dcp")
MIXED_PRECISION = ("no", "bf16", "fp16")


def is_sharded(dp_shard: int) -> bool:
    """Whether a run with ``dp_shard`` ranks per shard group shards its model (FSDP2).

    The one rule: the run's ``ParallelDims``, the checkpoint writer, the resume and
    ``inspect-checkpoint`` all ask it, so they cannot disagree on which files a checkpoint
    holds. Here, at the bottom and torch-free, because ``inspect-checkpoint`` needs it too.
    """
    return dp_shard > 1


class DataParallelDegrees:
    """What follows from the two data-parallel degrees, shared by the run's ``ParallelDims``
    and the ``Topology`` a checkpoint records, so the two cannot answer differently."""

    dp_replicate: int
    dp_shard: int

    @property
    def sharded(self) -> bool:
        return is_sharded(self.dp_shard)

    @property
    def dp_world_size(self) -> int:
        return self.dp_replicate * self.dp_shard


@dataclass(frozen=True)
class Topology(DataParallelDegrees):
    """The layout that wrote the checkpoint (``ParallelDims.topology``)."""

    world_size: int
    dp_replicate: int
    dp_shard: int
    layout: str


@dataclass(frozen=True)
class SamplerPosition:
    """Where the data order stood: the resumable sampler's ``DataPosition``."""

    epoch: int
    offset: int
    samples_seen: int


@dataclass(frozen=True, kw_only=True)
class TrainingStep:
    """``training_step.json`` of layout ``paths.LAYOUT_VERSION``, field for field."""

    layout_version: int = paths.LAYOUT_VERSION
    step: int
    lerobot_kit_version: str
    dp_world_size: int
    batch_size: int
    gradient_accumulation_steps: int
    mixed_precision: str
    topology: Topology
    checkpoint_format: str  # the registered format that wrote the weights, and must read them
    weights: str  # what pretrained_model/ holds: one of WEIGHTS_KINDS
    optimizer: str
    peft: bool  # the weights are a PEFT adapter (adapter_model.safetensors), not the full model
    sampler: SamplerPosition

    @property
    def sharded(self) -> bool:
        return self.topology.sharded

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: Any, source: Path | str) -> TrainingStep:
        """The record ``raw`` holds; one ``CheckpointError`` line naming ``source`` when it
        is not a whole record of this layout."""
        if not isinstance(raw, dict):
            raise CheckpointError(f"{source}: must be a JSON object, not {json_type(raw)}")
        why = other_layout(raw)
        if why is not None:
            raise CheckpointError(f"{source}: {why}")
        found = problems(raw)
        if found:
            more = f" (and {len(found) - 1} more problems)" if len(found) > 1 else ""
            raise CheckpointError(f"{source}: {found[0]}{more}")
        return _build(cls, raw)


def other_layout(raw: dict[str, Any]) -> str | None:
    """Why ``raw`` is not a record of this layout: it names no layout_version (as LeRobot
    0.6 wrote) or another one. None when it names this one, or a value that is not a
    version at all (``problems`` reports that as damage).

    Such a checkpoint cannot be resumed, but its ``pretrained_model/`` may still load.
    """
    if "layout_version" not in raw:
        return "has no layout_version: an older layout (such as LeRobot 0.6's)"
    version = raw["layout_version"]
    if type(version) is not int or version == paths.LAYOUT_VERSION:
        return None
    age = "an older" if version < paths.LAYOUT_VERSION else "a newer, unknown"
    return f"layout version {version} is {age} layout (this lerobot-kit reads {paths.LAYOUT_VERSION})"


def problems(raw: dict[str, Any]) -> list[str]:
    """Every way a record of this layout is broken: missing keys, wrong types, values out
    of range or inconsistent, one line each (without the file name)."""
    found = _schema_problems(TrainingStep, raw, "")
    choices = (("weights", WEIGHTS_KINDS), ("optimizer", OPTIMIZER_KINDS), ("mixed_precision", MIXED_PRECISION))
    for key, allowed in choices:
        if isinstance(raw.get(key), str) and raw[key] not in allowed:
            found.append(f"{key} is {raw[key]!r}, expected one of {', '.join(allowed)}")
    for key in ("step", "dp_world_size", "batch_size", "gradient_accumulation_steps"):
        value = raw.get(key)
        if type(value) is int and value < (0 if key == "step" else 1):
            found.append(f"{key} is {value}, which is out of range")
    sampler = raw.get("sampler")
    if isinstance(sampler, dict):
        for key in ("epoch", "offset", "samples_seen"):
            value = sampler.get(key)
            if type(value) is int and value < 0:
                found.append(f"sampler.{key} is {value}, which is out of range (a data position is never negative)")
    topo = raw.get("topology")
    if isinstance(topo, dict) and all(type(topo.get(k)) is int for k in ("dp_replicate", "dp_shard")):
        dp = topo["dp_replicate"] * topo["dp_shard"]
        if type(raw.get("dp_world_size")) is int and raw["dp_world_size"] != dp:
            found.append(
                f"dp_world_size is {raw['dp_world_size']}, but topology has dp_replicate × dp_shard = "
                f"{topo['dp_replicate']} × {topo['dp_shard']} = {dp}"
            )
    return found


def record_file(step_dir: Path) -> Path:
    return step_dir / paths.TRAINING_STATE_DIR / paths.TRAINING_STEP


def read_training_step(step_dir: Path, advice: str | None = None) -> TrainingStep:
    """The record of a checkpoint to resume; ``CheckpointError`` when it is missing, damaged or of
    another layout. ``advice``: what to do about a damaged one, said after the problem."""
    path = record_file(step_dir)
    if entry_mode(path) is None and not path.is_symlink():
        raise CheckpointError(f"{path}: missing; the checkpoint is incomplete")
    damaged = "the file is corrupt" if advice is None else f"the checkpoint is damaged: {advice}"
    raw = read_json(path, damaged)
    if isinstance(raw, dict) and other_layout(raw) is not None:
        raise CheckpointError(
            f"{path}: {other_layout(raw)}; it cannot be resumed, but its weights can still be loaded with "
            "--policy.path"
        )
    try:
        return TrainingStep.from_json(raw, path)
    except CheckpointError as exc:
        if advice is None:
            raise
        raise CheckpointError(f"{exc}; {damaged}") from exc


def recorded_training_step(step_dir: Path) -> TrainingStep | None:
    """The record of a step folder when it holds a valid one of this layout, else None.

    For loading weights only: they need nothing from ``training_state/``, so a copied
    ``pretrained_model/``, an older layout or a damaged record still loads, by the rules
    of a folder without a record (what ``inspect-checkpoint`` calls loadable). A record
    that is there but cannot be read at all (not a file, or one the system refuses) is
    raised instead: what the folder holds is then unknown, and nothing loads by guess.
    """
    try:
        return read_training_step(step_dir)
    except (CheckpointAccessError, NotAFileError):
        raise
    except CheckpointError:
        return None


def rewrite_weights_kind(pretrained_dir: Path, weights: str) -> None:
    """Record that ``pretrained_dir`` now holds ``weights``, after ``convert-dcp`` merged
    or deleted the shards, so that loaders read what is there. Replaced atomically; no-op
    for a folder without a valid record."""
    step_dir = Path(pretrained_dir).parent
    if Path(pretrained_dir).name != paths.PRETRAINED_DIR or recorded_training_step(step_dir) is None:
        return
    path = record_file(step_dir)
    write_json(path, {**read_json(path), "weights": weights}, durable=True)


_TYPE_WORDS = {int: "an integer", str: "a string", bool: "true or false"}


def _schema_problems(cls: type, obj: dict[str, Any], prefix: str) -> list[str]:
    """Missing keys and wrong types against ``cls``'s fields, nested records included."""
    found: list[str] = []
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        kind = hints[f.name]
        if f.name not in obj:
            found.append(f"missing key '{prefix}{f.name}'")
        elif is_dataclass(kind):
            if isinstance(obj[f.name], dict):
                found.extend(_schema_problems(kind, obj[f.name], f"{prefix}{f.name}."))
            else:
                found.append(f"{prefix}{f.name} must be an object, not {json_type(obj[f.name])}")
        elif type(obj[f.name]) is not kind:  # exact: JSON's true is no integer, 1 no boolean
            found.append(f"{prefix}{f.name} must be {_TYPE_WORDS[kind]}, not {json_type(obj[f.name])}")
    return found


def _build(cls: type, obj: dict[str, Any]) -> Any:
    """``cls`` from a dict that passed ``_schema_problems`` (keys it does not know are dropped)."""
    hints = typing.get_type_hints(cls)
    return cls(**{
        f.name: _build(hints[f.name], obj[f.name]) if is_dataclass(hints[f.name]) else obj[f.name]
        for f in fields(cls)
    })
