"""One row of the layout table: a file of a step folder and when a checkpoint must hold it.

``CheckpointKind`` is what a row's ``when`` is matched against: the fields of
``training_step.json`` that decide which files a checkpoint holds. Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lerobot_kit.core.layout import paths
from lerobot_kit.core.layout.training_step import TrainingStep

ALWAYS = "every checkpoint holds it"


@dataclass(frozen=True)
class CheckpointKind:
    """The record fields that decide which files a checkpoint holds."""

    peft: bool
    weights: str  # gathered | dcp | gathered+dcp
    optimizer: str  # safetensors | dcp
    mixed_precision: str  # no | bf16 | fp16

    @classmethod
    def of(cls, record: TrainingStep) -> CheckpointKind:
        return cls(record.peft, record.weights, record.optimizer, record.mixed_precision)

    def value(self, field: str) -> str:
        """A field as the record spells it (``peft``: true/false), for matching and for messages."""
        return record_value(getattr(self, field))


def record_value(value: bool | str) -> str:
    """A record field's value as a row's ``when`` spells it: JSON's true/false for a flag."""
    return ("true" if value else "false") if isinstance(value, bool) else value


@dataclass(frozen=True)
class LayoutFile:
    """One file (or DCP folder) of a step folder, and when a checkpoint must hold it."""

    path: str  # relative to the step folder
    # Required when every (record field, accepted values) pair matches; () = always.
    when: tuple[tuple[str, tuple[str, ...]], ...] = ()
    for_loading: bool = False  # read by --policy.path and eval, not only by a resume
    # Required even where no record says what the checkpoint holds: the files that make a folder
    # a policy folder (its config) or a step folder (the record itself).
    essential: bool = False
    folder: bool = False  # a DCP folder
    # A sharded run of this layout keeps the same state in this other path instead: this file
    # there without it is the older layout of LeRobot 0.6, which loads but cannot be resumed.
    sharded_instead: str | None = None
    # The problems of its parsed contents (a JSON value, or a safetensors header), one line each,
    # checked before anything reads it (``core.layout.validate``); None: parsing is its only check.
    rule: Callable[[Any], list[str]] | None = None

    def required_for(self, kind: CheckpointKind) -> bool:
        return all(kind.value(field) in accepted for field, accepted in self.when)

    def accepts(self, field: str, value: bool | str) -> bool:
        """Whether a checkpoint whose record says ``field: value`` may hold it (a row silent on the field: any)."""
        return all(record_value(value) in accepted for name, accepted in self.when if name == field)

    def depends_on(self, field: str) -> bool:
        return any(name == field for name, _ in self.when)

    @property
    def holds_tensors(self) -> bool:
        """A safetensors file or a DCP folder: the files that tell how a piece was stored (one file or shards)
        when no record says it, as against the JSON beside them."""
        return self.folder or self.path.endswith(".safetensors")

    def because(self, kind: CheckpointKind) -> str:
        """Why ``kind`` requires it, as a message says it."""
        if not self.when:
            return ALWAYS
        says = ", ".join(f"{field}: {kind.value(field)}" for field, _ in self.when)
        return f"{paths.TRAINING_STATE_DIR}/{paths.TRAINING_STEP} says {says}"
