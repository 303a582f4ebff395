"""How each kind of state piece is kept in a step folder, and the run's built-in pieces.

A ``Store`` writes a piece's ``state_dict`` into the files the layout table declares for
it (``core.layout.state_pieces``) and reads it back on the current topology:

- ``WeightFiles``: the model, by the run's checkpoint format (gathered, DCP shards or both);
- ``OptimizerFiles``: one gathered file, or DCP shards in a sharded run;
- ``JsonFile``: a small state written by the main process and read by every rank (the LR
  schedule, the loss scaler, and any piece a plugin adds);
- ``PerRankFile``: state each rank has its own of (the random state), gathered into one file;
  a rank that did not exist then keeps its own;
- ``RecordField``: state kept in ``training_step.json`` (the data position).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import torch.distributed as dist

from lerobot_kit.core.checkpoint.shard_writes import save_shards
from lerobot_kit.core.checkpoint.state import (
    ModelState,
    OptimizerState,
    Piece,
    StepFolder,
    Store,
    TrainingState,
)
from lerobot_kit.core.checkpoint.training_state import (
    DataCursor,
    RandomState,
    load_full_optimizer,
    load_per_rank,
    save_full_optimizer,
    save_per_rank,
)
from lerobot_kit.core.checkpoint.weights import SHAPE_FIX, CheckpointFormat
from lerobot_kit.core.errors import CheckpointError, first_line
from lerobot_kit.core.layout import paths
from lerobot_kit.core.layout.json_file import read_json, write_json
from lerobot_kit.core.layout.state_pieces import StatePiece
from lerobot_kit.core.layout.training_step import TrainingStep
from lerobot_kit.core.model.naming import ModelWeights


def checkpoint_format(name: str) -> CheckpointFormat:
    from lerobot_kit.core.registry.registry import get_registry

    return get_registry().checkpoint_format(name)


class WeightFiles(Store):
    """The model's weights, by the registered format the run saves with and the record names."""

    def save(self, state: ModelState, layout: StatePiece, folder: StepFolder) -> dict[str, Any]:
        facts = folder.facts
        kind = checkpoint_format(facts.checkpoint_format).save_weights(
            state.weights, folder.pretrained, sharded=facts.sharded, is_main=folder.ctx.is_main
        )
        return {"weights": kind}

    def load(self, state: ModelState, layout: StatePiece, folder: StepFolder, record: TrainingStep) -> None:
        checkpoint_format(record.checkpoint_format).load_weights(
            state.weights, folder.pretrained, distributed=folder.ctx.distributed, is_main=folder.ctx.is_main
        )


class OptimizerFiles(Store):
    """DCP shards in a sharded run (each rank writes its own), else one gathered file (the main process)."""

    def save(self, state: OptimizerState, layout: StatePiece, folder: StepFolder) -> dict[str, Any]:
        optimizer_state = state.state_dict()
        if folder.facts.sharded:
            save_shards(optimizer_state, folder.state_dir / paths.DCP_OPTIMIZER_DIR)
            return {"optimizer": "dcp"}
        if folder.ctx.is_main:
            save_full_optimizer(optimizer_state, folder.state_dir)
        return {"optimizer": "safetensors"}

    def load(self, state: OptimizerState, layout: StatePiece, folder: StepFolder, record: TrainingStep) -> None:
        shards = folder.state_dir / paths.DCP_OPTIMIZER_DIR
        if shards.is_dir():  # DCP reshards them onto this topology
            from lerobot_kit.core.checkpoint.safe_dcp import load_dcp

            current = state.state_dict()
            load_dcp(current, shards, what="optimizer shards", fix=SHAPE_FIX)
            state.load_state_dict(current)
            return
        ctx = folder.ctx
        full = load_full_optimizer(folder.state_dir) if (ctx.is_main or not ctx.distributed) else {}
        state.load_full_state_dict(full, broadcast=ctx.distributed)


class JsonFile(Store):
    """The state as one JSON file, written by the main process, read by every rank."""

    def save(self, state: Any, layout: StatePiece, folder: StepFolder) -> dict[str, Any]:
        if folder.ctx.is_main:
            write_json(folder.path(layout), state.state_dict())
        return {}

    def load(self, state: Any, layout: StatePiece, folder: StepFolder, record: TrainingStep) -> None:
        file = folder.path(layout)
        if file.is_file():  # whether the checkpoint must hold it is the layout table's rule, checked before
            state.load_state_dict(read_json(file))


class PerRankFile(Store):
    """Every rank's own state in one safetensors file (``rank<r>.<name>`` tensors), written by the
    main process; on resume each rank takes its own, and a rank that did not exist keeps its state."""

    def save(self, state: Any, layout: StatePiece, folder: StepFolder) -> dict[str, Any]:
        mine = state.state_dict()
        everyone: list[Any] = [mine]
        if folder.ctx.distributed:
            everyone = [None] * folder.ctx.world_size
            dist.all_gather_object(everyone, mine)
        if folder.ctx.is_main:
            save_per_rank(everyone, folder.path(layout))
        return {}

    def load(self, state: Any, layout: StatePiece, folder: StepFolder, record: TrainingStep) -> None:
        """Names, dtypes and shapes were checked before the resume began (the layout's file rules);
        values the object refuses are one ``CheckpointError`` line naming the file."""
        file = folder.path(layout)
        mine = load_per_rank(file, folder.ctx.rank)
        if mine is None:
            return
        try:
            state.load_state_dict(mine)
        except (RuntimeError, ValueError, TypeError, OverflowError, KeyError) as exc:
            raise CheckpointError(
                f"{file}: the saved {layout.name} state cannot be restored ({first_line(exc)}); the file is damaged"
            ) from exc


class RecordField(Store):
    """State kept as one field of ``training_step.json`` (the layout table names the field)."""

    def save(self, state: Any, layout: StatePiece, folder: StepFolder) -> dict[str, Any]:
        assert layout.record_field is not None, f"state piece {layout.name!r} names no field of the record"
        return {layout.record_field: state.state_dict()}

    def load(self, state: Any, layout: StatePiece, folder: StepFolder, record: TrainingStep) -> None:
        assert layout.record_field is not None, f"state piece {layout.name!r} names no field of the record"
        state.load_state_dict(asdict(getattr(record, layout.record_field)))


def run_training_state(
    weights: ModelWeights, optimizer: Any, scheduler: Any, scaler: Any | None, cursor: DataCursor
) -> TrainingState:
    """A run's built-in pieces, by their names in the layout table: ``scaler`` only for fp16."""
    training = TrainingState()
    training.add("model", Piece(ModelState(weights), WeightFiles()))
    training.add("optimizer", Piece(OptimizerState(weights.model, optimizer), OptimizerFiles()))
    training.add("rng", Piece(RandomState(), PerRankFile()))
    training.add("scheduler", Piece(scheduler, JsonFile()))
    if scaler is not None:
        training.add("scaler", Piece(scaler, JsonFile()))
    training.add("data_position", Piece(cursor, RecordField()))
    return training
