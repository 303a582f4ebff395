"""What a checkpoint saves and restores, handed to the checkpoint code as named pieces.

The checkpoint code never sees the run: the run hands it a ``CheckpointState`` (as
torchtitan's checkpointer is handed ``Stateful`` objects) whose ``TrainingState`` holds
every piece of training state by name (the model, the optimizer, the LR schedule, the
loss scaler, the random state, the data position), each a ``Stateful`` with the ``Store``
that puts its ``state_dict`` in a step folder; beside it, what makes ``pretrained_model/``
loadable and the facts about the run that ``training_step.json`` records. Saving,
resuming and ``inspect-checkpoint`` all go by the same names: those of the torch-free
table ``core.layout.state_pieces``, where each piece's files are declared. So the
checkpoint code depends on the model and the processes, and the run builds on it, not
the other way round.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful

from lerobot_kit.core.data.dataset import DatasetMeta
from lerobot_kit.core.distributed.process_group import DistContext
from lerobot_kit.core.layout import paths
from lerobot_kit.core.layout.state_pieces import StatePiece, state_piece
from lerobot_kit.core.layout.training_step import Topology, TrainingStep
from lerobot_kit.core.model.naming import ModelWeights
from lerobot_kit.core.model.processor import PolicyProcessor
from lerobot_kit.core.version import package_version

S = TypeVar("S", bound=Stateful)


@dataclass(frozen=True)
class RunFacts:
    """What ``training_step.json`` records about the run that wrote a checkpoint, beyond its step
    and what its state pieces record there (``Store.save``)."""

    checkpoint_format: str  # the registered format that writes (and must read) the weights
    topology: Topology
    batch_size: int
    gradient_accumulation_steps: int
    mixed_precision: str
    peft: bool

    @property
    def sharded(self) -> bool:
        return self.topology.sharded

    @property
    def dp_world_size(self) -> int:
        return self.topology.dp_world_size

    def record(self, step: int, recorded: dict[str, Any]) -> TrainingStep:
        """``training_step.json`` of a checkpoint of ``step`` written by this run; ``recorded``: the
        fields the state pieces set (the weights' and optimizer's kinds, the data position)."""
        raw = {
            "layout_version": paths.LAYOUT_VERSION,
            "step": step,
            "lerobot_kit_version": package_version(),
            "dp_world_size": self.dp_world_size,
            "batch_size": self.batch_size,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "mixed_precision": self.mixed_precision,
            "topology": asdict(self.topology),
            "checkpoint_format": self.checkpoint_format,
            "peft": self.peft,
            **recorded,
        }
        return TrainingStep.from_json(raw, paths.TRAINING_STEP)


@dataclass(frozen=True)
class StepFolder:
    """The step folder a save writes (its temporary folder) or a resume reads, and who does it."""

    ctx: DistContext
    root: Path
    facts: RunFacts

    @property
    def pretrained(self) -> Path:
        return self.root / paths.PRETRAINED_DIR

    @property
    def state_dir(self) -> Path:
        return self.root / paths.TRAINING_STATE_DIR

    def path(self, layout: StatePiece) -> Path:
        """The one file of ``training_state/`` that holds a piece stored as one file."""
        return self.state_dir / layout.file()


class Store(ABC):
    """How a piece's ``state_dict`` lives in a step folder, in the files the layout table
    declares for the piece (``layout``). Both calls are collective: every rank makes them."""

    @abstractmethod
    def save(self, state: Any, layout: StatePiece, folder: StepFolder) -> dict[str, Any]:
        """Write the piece's state; the fields of ``training_step.json`` it sets (often none)."""

    @abstractmethod
    def load(self, state: Any, layout: StatePiece, folder: StepFolder, record: TrainingStep) -> None:
        """Put the saved state back into ``state``, on the current topology, whatever wrote it."""


@dataclass(frozen=True)
class Piece:
    """One piece of training state: the live object and where its state is kept."""

    state: Stateful
    store: Store


@dataclass
class TrainingState(Mapping[str, Piece]):
    """Every piece of a run's training state by name, in the order they are saved and restored.

    A name must be one of the layout table's (``core.layout.state_pieces``), where its
    files are declared: that is how the writer checks them, a resume requires them and
    ``inspect-checkpoint`` lists them, without torch.
    """

    pieces: dict[str, Piece] = field(default_factory=dict)

    def add(self, name: str, piece: Piece) -> None:
        state_piece(name)  # declared in the layout table, or one line saying to register it
        if not isinstance(piece.state, Stateful):
            raise TypeError(f"state piece {name!r}: {type(piece.state).__name__} has no state_dict/load_state_dict")
        self.pieces[name] = piece

    def state(self, name: str, kind: type[S]) -> S:
        """The live object of piece ``name``, checked to be a ``kind``."""
        state = self.pieces[name].state
        assert isinstance(state, kind), f"state piece {name!r} is a {type(state).__name__}, not a {kind.__name__}"
        return state

    def save(
        self, folder: StepFolder, phase: Callable[[], AbstractContextManager[Any]] = nullcontext
    ) -> dict[str, Any]:
        """Collective: every piece written, each in a ``phase`` of its own (the ranks agree after
        each that every write of it succeeded); the fields of ``training_step.json`` they set."""
        recorded: dict[str, Any] = {}
        for name, piece in self.pieces.items():
            with phase():
                recorded |= piece.store.save(piece.state, state_piece(name), folder)
        return recorded

    def load(self, folder: StepFolder, record: TrainingStep) -> None:
        """Collective: every piece restored from ``folder``, whose files were checked before, in the
        order they were added (the run adds the random state after the pieces whose loading may
        draw random numbers)."""
        for name, piece in self.pieces.items():
            piece.store.load(piece.state, state_piece(name), folder, record)

    def __getitem__(self, name: str) -> Piece:
        return self.pieces[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.pieces)

    def __len__(self) -> int:
        return len(self.pieces)


class ModelState:
    """The model's weights as a ``Stateful``: DCP's (possibly sharded) model state dict."""

    def __init__(self, weights: ModelWeights) -> None:
        self.weights = weights

    def state_dict(self) -> dict[str, Any]:
        return get_model_state_dict(self.weights.model)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_model_state_dict(self.weights.model, state_dict)


class OptimizerState:
    """The optimizer's state as a ``Stateful``, keyed by parameter name (FQN), so a checkpoint
    written by one layout loads into another."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model = model
        self.optimizer = optimizer

    def state_dict(self) -> dict[str, Any]:
        return get_optimizer_state_dict(self.model, self.optimizer)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_optimizer_state_dict(self.model, self.optimizer, state_dict)

    def load_full_state_dict(self, state_dict: dict[str, Any], *, broadcast: bool) -> None:
        """The full (gathered) state; ``broadcast``: read by the main process only (the others pass {})."""
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=broadcast)
        set_optimizer_state_dict(self.model, self.optimizer, state_dict, options=options)


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
    training: TrainingState
    pretrained: PretrainedFiles
    facts: RunFacts

    @property
    def weights(self) -> ModelWeights:
        """The model (possibly sharded) and the naming its weights are stored under."""
        return self.training.state("model", ModelState).weights

    @property
    def model(self) -> torch.nn.Module:
        return self.weights.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.training.state("optimizer", OptimizerState).optimizer

    def folder(self, root: Path) -> StepFolder:
        return StepFolder(self.ctx, root, self.facts)
