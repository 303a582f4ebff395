"""The pieces of training state a checkpoint holds, by name, and where each one lives. Torch-free.

A run's training state is one collection of named ``Stateful`` pieces
(``core.checkpoint.state.TrainingState``): the model, the optimizer, the LR
schedule, the loss scaler, the random state and the data position. This table says, for
each name, the files of a step folder that hold it (with when a checkpoint must hold
them), or the field of ``training_step.json`` that does. The layout table
(``core.layout.files``), the writer, the resume and ``inspect-checkpoint`` all go by it,
and inspect reads it without torch.

A new piece is one ``register_state_piece`` call here (a plugin makes it when imported)
and one ``Piece`` added to the run's ``TrainingState``: its files join the layout table,
so the writer checks them before publishing, a resume refuses a folder without them (or
with contents its files' ``rule`` refuses), and inspect lists them under the piece's name.
"""

from __future__ import annotations

from dataclasses import dataclass

from lerobot_kit.core.errors import CheckpointError
from lerobot_kit.core.layout import paths
from lerobot_kit.core.layout.file_rules import param_groups_problems, rng_problems, scaler_problems, scheduler_problems
from lerobot_kit.core.layout.layout_file import LayoutFile

P, T = paths.PRETRAINED_DIR, paths.TRAINING_STATE_DIR
_GATHERED = ("gathered", "gathered+dcp")
_SHARDS = ("dcp", "gathered+dcp")


@dataclass(frozen=True)
class StatePiece:
    """A named piece of training state and where a step folder keeps it."""

    name: str
    files: tuple[LayoutFile, ...] = ()  # its files, relative to the step folder
    record_field: str | None = None  # for a piece kept in training_step.json: its field there

    def file(self) -> str:
        """The name of its one file in ``training_state/`` (for a piece stored as one file)."""
        if len(self.files) != 1 or not self.files[0].path.startswith(f"{T}/"):
            raise CheckpointError(f"state piece {self.name!r} is not kept in one file of {T}/")
        return self.files[0].path.removeprefix(f"{T}/")


_PIECES: dict[str, StatePiece] = {}


def register_state_piece(piece: StatePiece) -> StatePiece:
    """Add ``piece`` to the table; one ``CheckpointError`` line when its name or a file is taken."""
    if piece.name in _PIECES:
        raise CheckpointError(f"state piece {piece.name!r} is registered already; give the new one another name")
    taken = {file.path: known.name for known in _PIECES.values() for file in known.files}
    for file in piece.files:
        if file.path in taken:
            raise CheckpointError(f"state piece {piece.name!r}: {file.path} holds {taken[file.path]!r} already")
    _PIECES[piece.name] = piece
    return piece


def state_pieces() -> tuple[StatePiece, ...]:
    """Every piece, the built-in ones first, in the order they were registered."""
    return tuple(_PIECES.values())


def tensor_files(piece: StatePiece, field: str, value: str) -> tuple[LayoutFile, ...]:
    """The files holding ``piece``'s tensors in a checkpoint whose record says ``field: value``
    (``weights: gathered``: the one file, full or adapter; ``weights: dcp``: the shards), in
    table order: what a checkpoint's files say about how it was stored, where no record does."""
    return tuple(file for file in piece.files
                 if file.holds_tensors and file.depends_on(field) and file.accepts(field, value))


def state_piece(name: str) -> StatePiece:
    try:
        return _PIECES[name]
    except KeyError:
        raise CheckpointError(
            f"no state piece {name!r} in the layout table (known: {', '.join(_PIECES)}); register it first"
        ) from None


MODEL = register_state_piece(StatePiece("model", (
    LayoutFile(f"{P}/{paths.MODEL_WEIGHTS}", (("peft", ("false",)), ("weights", _GATHERED)), for_loading=True),
    LayoutFile(f"{P}/{paths.ADAPTER_WEIGHTS}", (("peft", ("true",)), ("weights", _GATHERED)), for_loading=True),
    LayoutFile(f"{P}/{paths.ADAPTER_CONFIG}", (("peft", ("true",)),), for_loading=True),
    LayoutFile(f"{P}/{paths.DCP_MODEL_DIR}", (("weights", _SHARDS),), folder=True),
)))
RNG = register_state_piece(StatePiece("rng", (LayoutFile(f"{T}/{paths.RNG_STATE}", rule=rng_problems),)))
SCHEDULER = register_state_piece(StatePiece("scheduler", (
    LayoutFile(f"{T}/{paths.SCHEDULER_STATE}", rule=scheduler_problems),
)))
OPTIMIZER = register_state_piece(StatePiece("optimizer", (
    LayoutFile(f"{T}/{paths.OPTIMIZER_PARAM_GROUPS}", (("optimizer", ("safetensors",)),), rule=param_groups_problems),
    # A sharded run of this layout keeps its optimizer in shards: this file without them is LeRobot 0.6's.
    LayoutFile(f"{T}/{paths.OPTIMIZER_STATE}", (("optimizer", ("safetensors",)),),
               sharded_instead=f"{T}/{paths.DCP_OPTIMIZER_DIR}"),
    LayoutFile(f"{T}/{paths.DCP_OPTIMIZER_DIR}", (("optimizer", ("dcp",)),), folder=True),
)))
SCALER = register_state_piece(StatePiece("scaler", (
    LayoutFile(f"{T}/{paths.SCALER_STATE}", (("mixed_precision", ("fp16",)),), rule=scaler_problems),
)))
DATA_POSITION = register_state_piece(StatePiece("data_position", record_field="sampler"))
