"""Which files a checkpoint holds: one table, read by the writer, the restore and ``inspect-checkpoint``.

A step folder's files depend on what its ``training_step.json`` records: whether the
weights are a PEFT adapter, whether they are one gathered file, DCP shards or both,
whether the optimizer state is one file or shards, and whether fp16 needed a loss
scaler. ``FILES`` lists every file with the record fields that make it required. The
writer checks its temporary folder against it before publishing, a resume refuses a
step folder that lacks a required file before building anything, and
``inspect-checkpoint`` reports each one missing: "resumable" means what the resume
accepts, file for file. Torch-free.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from lerobot_kit.core.errors import CheckpointError
from lerobot_kit.core.layout import paths
from lerobot_kit.core.layout.training_step import TrainingStep, read_training_step

P, T = paths.PRETRAINED_DIR, paths.TRAINING_STATE_DIR
ALWAYS = "every checkpoint holds it"

RESUME_ADVICE = (
    "resume from an earlier step folder (--resume=true --resume_from=<step>, which removes the later ones)"
)


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
        value = getattr(self, field)
        return ("true" if value else "false") if isinstance(value, bool) else value


@dataclass(frozen=True)
class LayoutFile:
    """One file (or DCP folder) of a step folder, and when a checkpoint must hold it."""

    path: str  # relative to the step folder
    # Required when every (record field, accepted values) pair matches; () = always.
    when: tuple[tuple[str, tuple[str, ...]], ...] = ()
    for_loading: bool = False  # read by --policy.path and eval, not only by a resume
    folder: bool = False  # a DCP folder

    def required_for(self, kind: CheckpointKind) -> bool:
        return all(kind.value(field) in accepted for field, accepted in self.when)

    def because(self, kind: CheckpointKind) -> str:
        """Why ``kind`` requires it, as a message says it."""
        if not self.when:
            return ALWAYS
        says = ", ".join(f"{field}: {kind.value(field)}" for field, _ in self.when)
        return f"{T}/{paths.TRAINING_STEP} says {says}"


_GATHERED = ("gathered", "gathered+dcp")
_SHARDS = ("dcp", "gathered+dcp")

FILES: tuple[LayoutFile, ...] = (
    LayoutFile(f"{P}/{paths.POLICY_CONFIG}", for_loading=True),
    LayoutFile(f"{P}/{paths.DATASET_META}", for_loading=True),
    LayoutFile(f"{P}/{paths.PREPROCESSOR}.json", for_loading=True),
    LayoutFile(f"{P}/{paths.POSTPROCESSOR}.json", for_loading=True),
    LayoutFile(f"{P}/{paths.TRAIN_CONFIG}"),
    LayoutFile(f"{P}/{paths.MODEL_WEIGHTS}", (("peft", ("false",)), ("weights", _GATHERED)), for_loading=True),
    LayoutFile(f"{P}/{paths.ADAPTER_WEIGHTS}", (("peft", ("true",)), ("weights", _GATHERED)), for_loading=True),
    LayoutFile(f"{P}/{paths.ADAPTER_CONFIG}", (("peft", ("true",)),), for_loading=True),
    LayoutFile(f"{P}/{paths.DCP_MODEL_DIR}", (("weights", _SHARDS),), folder=True),
    LayoutFile(f"{T}/{paths.TRAINING_STEP}"),
    LayoutFile(f"{T}/{paths.RNG_STATE}"),
    LayoutFile(f"{T}/{paths.SCHEDULER_STATE}"),
    LayoutFile(f"{T}/{paths.OPTIMIZER_PARAM_GROUPS}", (("optimizer", ("safetensors",)),)),
    LayoutFile(f"{T}/{paths.OPTIMIZER_STATE}", (("optimizer", ("safetensors",)),)),
    LayoutFile(f"{T}/{paths.DCP_OPTIMIZER_DIR}", (("optimizer", ("dcp",)),), folder=True),
    LayoutFile(f"{T}/{paths.SCALER_STATE}", (("mixed_precision", ("fp16",)),)),
)


def required(kind: CheckpointKind) -> list[LayoutFile]:
    """The files a checkpoint of ``kind`` must hold, in table order."""
    return [file for file in FILES if file.required_for(kind)]


def missing(step_dir: Path, kind: CheckpointKind) -> Iterator[tuple[LayoutFile, str]]:
    """Each required file ``step_dir`` lacks (or holds as the wrong kind of entry), with the line that says so."""
    for file in required(kind):
        where = Path(step_dir) / file.path
        present = where.is_dir() if file.folder else where.is_file()
        if not present:
            what = "missing" if not where.exists() and not where.is_symlink() else (
                "not a folder" if file.folder else "not a file")
            yield file, f"{file.path}: {what} ({file.because(kind)})"


def check_complete(step_dir: Path, record: TrainingStep, advice: str) -> None:
    """One ``CheckpointError`` line for the first required file ``step_dir`` lacks, naming it and ``advice``."""
    found = list(missing(step_dir, CheckpointKind.of(record)))
    if found:
        more = f" (and {len(found) - 1} more files)" if len(found) > 1 else ""
        raise CheckpointError(f"{step_dir}/{found[0][1]}{more}; the checkpoint is incomplete: {advice}")


def resumable_record(step_dir: Path, advice: str) -> TrainingStep:
    """The record of a step folder a resume can continue from: of this layout, whole, and
    with every file the table requires for it; else one ``CheckpointError`` line."""
    record_file = Path(step_dir) / T / paths.TRAINING_STEP
    if not record_file.is_file():
        raise CheckpointError(f"{record_file}: missing ({ALWAYS}); the checkpoint is incomplete: {advice}")
    record = read_training_step(step_dir)
    state_dir = Path(step_dir) / T
    gathered_optimizer = (state_dir / paths.OPTIMIZER_STATE).is_file()
    if record.sharded and gathered_optimizer and not (state_dir / paths.DCP_OPTIMIZER_DIR).is_dir():
        raise CheckpointError(
            f"{step_dir}: a sharded run whose optimizer state is not in {paths.DCP_OPTIMIZER_DIR}/ "
            "(the older gathered-optimizer layout); it cannot be resumed, but its weights can still be "
            "loaded with --policy.path"
        )
    check_complete(step_dir, record, advice)
    return record
