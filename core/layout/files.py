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

import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from lerobot_kit.core.errors import CheckpointError
from lerobot_kit.core.layout import paths
from lerobot_kit.core.layout.file_access import CheckpointAccessError, entry_mode, not_a_file_line
from lerobot_kit.core.layout.training_step import TrainingStep, read_training_step

P, T = paths.PRETRAINED_DIR, paths.TRAINING_STATE_DIR
ALWAYS = "every checkpoint holds it"

SHOWN_STEPS = 5  # step folders named in the advice; more are counted


def resume_advice(step_dir: Path) -> str:
    """What to do about a damaged step folder of a run: resume from the newest step folder
    before it, naming every step folder ``--resume_from`` then deletes (this one, and any
    later). Only for damage: a file the system refuses to read is named with its own fix."""
    step_dir = Path(step_dir)
    if not (paths.is_step_dir_name(step_dir.name) and step_dir.parent.name == paths.CHECKPOINTS_DIR):
        return "resume from another step folder of the run, or start a new run"
    run = step_dir.parent.parent
    step = int(step_dir.name)
    try:
        earlier = [s for s in paths.resumable_steps(run) if s < step]
        back = max(earlier, default=None)
        doomed = [d.name for d in paths.later_steps(run, back)] if back is not None else []
    except OSError:
        return "resume from an earlier step folder of the run, or start a new run"
    if back is None:
        return f"{run} has no earlier step folder to resume from: start a new run in another --output_dir"
    more = f" and {len(doomed) - SHOWN_STEPS} more" if len(doomed) > SHOWN_STEPS else ""
    return (f"resume from step {back}, the newest step folder before it, with --resume=true --resume_from={back}, "
            f"which deletes the step folders after it ({', '.join(doomed[:SHOWN_STEPS])}{more})")


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
    """Each required file ``step_dir`` lacks (or holds as the wrong kind of entry), with the line that says so;
    ``CheckpointAccessError`` when the system does not let this user look."""
    for file in required(kind):
        mode = entry_mode(Path(step_dir) / file.path, file.path)
        if mode is None:
            yield file, f"{file.path}: missing ({file.because(kind)})"
        elif file.folder and not stat.S_ISDIR(mode):
            yield file, f"{file.path}: not a folder ({file.because(kind)})"
        elif not file.folder and not stat.S_ISREG(mode):
            yield file, f"{not_a_file_line(file.path, mode)} ({file.because(kind)})"


def check_complete(step_dir: Path, record: TrainingStep, advice: str) -> None:
    """One ``CheckpointError`` line for the first required file ``step_dir`` lacks, naming it and ``advice``
    (a ``CheckpointAccessError`` for one the system does not let this user see)."""
    try:
        found = list(missing(step_dir, CheckpointKind.of(record)))
    except CheckpointAccessError as exc:
        raise CheckpointAccessError(f"{step_dir}/{exc}") from exc
    if found:
        more = f" (and {len(found) - 1} more files)" if len(found) > 1 else ""
        raise CheckpointError(f"{step_dir}/{found[0][1]}{more}; the checkpoint is incomplete: {advice}")


def resumable_record(step_dir: Path, advice: str) -> TrainingStep:
    """The record of a step folder a resume can continue from: of this layout (not a sharded
    run's single gathered optimizer file, as LeRobot 0.6 wrote), whole, and with every file
    the table requires for it; else one ``CheckpointError`` line."""
    record_file = Path(step_dir) / T / paths.TRAINING_STEP
    if entry_mode(record_file, str(record_file)) is None:
        raise CheckpointError(f"{record_file}: missing ({ALWAYS}); the checkpoint is incomplete: {advice}")
    record = read_training_step(step_dir, advice)
    state_dir = Path(step_dir) / T
    if (record.sharded and (state_dir / paths.OPTIMIZER_STATE).exists()
            and not (state_dir / paths.DCP_OPTIMIZER_DIR).is_dir()):
        raise CheckpointError(
            f"{step_dir}: a sharded run whose optimizer state is not in {paths.DCP_OPTIMIZER_DIR}/ (the older "
            "gathered-optimizer layout); it cannot be resumed, but its weights can still be loaded with --policy.path"
        )
    check_complete(step_dir, record, advice)
    return record
