"""What a checkpoint saves and restores, handed to the checkpoint code as named pieces.

The checkpoint code never sees the run: the run hands it a ``CheckpointState`` (as
torchtitan's checkpointer is handed ``Stateful`` objects) holding the model's weights in
their stored naming, the optimizer over them, the small JSON pieces of
``training_state/`` (the LR schedule, the loss scaler) that follow
``state_dict``/``load_state_dict``, what makes ``pretrained_model/`` loadable, and the
facts about the run that ``training_step.json`` records. So the checkpoint code depends
on the model and the processes, and the run builds on it, not the other way round.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from lerobot_kit.core.data.dataset import DatasetMeta
from lerobot_kit.core.distributed.process_group import DistContext
from lerobot_kit.core.layout.training_step import SamplerPosition, Topology, TrainingStep
from lerobot_kit.core.model.naming import ModelWeights
from lerobot_kit.core.model.processor import PolicyProcessor
from lerobot_kit.core.version import package_version


class Stateful(Protocol):
    """Anything whose state round-trips through a JSON-able dict (a scheduler, a loss scaler)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class JsonPiece:
    """One ``training_state/`` JSON file and the object whose state it holds."""

    file: str  # a name of the layout table (core.layout.files)
    state: Stateful


@dataclass(frozen=True)
class RunFacts:
    """What ``training_step.json`` records about the run that wrote a checkpoint, beyond its step."""

    checkpoint_format: str  # the registered format that writes (and must read) the weights
    topology: Topology
    batch_size: int
    gradient_accumulation_steps: int
    mixed_precision: str
    peft: bool

    @property
    def sharded(self) -> bool:
        return self.topology.dp_shard > 1

    @property
    def dp_world_size(self) -> int:
        return self.topology.dp_replicate * self.topology.dp_shard

    def record(self, step: int, sampler: SamplerPosition, weights: str, optimizer: str) -> TrainingStep:
        """``training_step.json`` of a checkpoint of ``step`` written by this run."""
        return TrainingStep(
            step=step,
            lerobot_kit_version=package_version(),
            dp_world_size=self.dp_world_size,
            batch_size=self.batch_size,
            gradient_accumulation_steps=self.gradient_accumulation_steps,
            mixed_precision=self.mixed_precision,
            topology=self.topology,
            checkpoint_format=self.checkpoint_format,
            weights=weights,
            optimizer=optimizer,
            peft=self.peft,
            sampler=sampler,
        )


@dataclass(frozen=True)
class PretrainedFiles:
    """What besides the weights makes ``pretrained_model/`` loadable, and the config a reload reproduces."""

    meta: DatasetMeta
    preprocessor: PolicyProcessor
    postprocessor: PolicyProcessor
    train_config: dict[str, Any]  # train_config.json


@dataclass(frozen=True)
class CheckpointState:
    """Everything one checkpoint of a run holds, and the processes and folder it is written by and in."""

    ctx: DistContext
    output_dir: Path
    weights: ModelWeights  # the model (possibly sharded) and the naming its weights are stored under
    optimizer: torch.optim.Optimizer
    json_pieces: tuple[JsonPiece, ...]
    pretrained: PretrainedFiles
    facts: RunFacts

    @property
    def model(self) -> torch.nn.Module:
        return self.weights.model
