"""Which files a checkpoint holds: one table, read by the writer, the restore and ``inspect-checkpoint``.

A step folder's files depend on what its ``training_step.json`` records: whether the
weights are a PEFT adapter, whether they are one gathered file, DCP shards or both,
whether the optimizer state is one file or shards, and whether fp16 needed a loss
scaler. ``layout_files`` lists every file with the record fields that make it required:
the configs and the record here, the rest by the state piece they hold
(``core.layout.state_pieces``), with the flags that mark the older layout. The
writer checks its temporary folder against it before publishing, a resume refuses a
step folder that lacks a required file before building anything, and
``inspect-checkpoint`` reports each one missing: "resumable" means what the resume
accepts, file for file. Torch-free.
"""

from __future__ import annotations

import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from lerobot_kit.core.errors import CheckpointError
from lerobot_kit.core.layout import paths, state_pieces
from lerobot_kit.core.layout.file_access import CheckpointAccessError, entry_mode, not_a_file_line
from lerobot_kit.core.layout.layout_file import ALWAYS, CheckpointKind, LayoutFile
from lerobot_kit.core.layout.training_step import TrainingStep, is_sharded, read_training_step

P, T = paths.PRETRAINED_DIR, paths.TRAINING_STATE_DIR

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


_OWN_FILES: tuple[LayoutFile, ...] = (
    LayoutFile(f"{P}/{paths.POLICY_CONFIG}", for_loading=True, essential=True),
    LayoutFile(f"{P}/{paths.DATASET_META}", for_loading=True),
    LayoutFile(f"{P}/{paths.PREPROCESSOR}.json", for_loading=True),
    LayoutFile(f"{P}/{paths.POSTPROCESSOR}.json", for_loading=True),
    LayoutFile(f"{P}/{paths.TRAIN_CONFIG}"),
    *state_pieces.MODEL.files,
    LayoutFile(f"{T}/{paths.TRAINING_STEP}", essential=True),
)
"""The files no state piece holds, around the model's (in the order messages name them)."""


def layout_files() -> tuple[LayoutFile, ...]:
    """Every file of the layout: the configs, the model's, the record, then those of every other
    state piece in table order (a registered piece's last)."""
    pieces = (piece for piece in state_pieces.state_pieces() if piece is not state_pieces.MODEL)
    return _OWN_FILES + tuple(file for piece in pieces for file in piece.files)


def content_rule(path: str) -> Callable[[Any], list[str]] | None:
    """The rule the table gives the contents of the file at ``path`` (relative to the step folder)."""
    return next((file.rule for file in layout_files() if file.path == path), None)


def older_layout(step_dir: Path, dp_shard: int) -> tuple[str, str] | None:
    """``(file, why)`` when a step folder whose run had ``dp_shard`` ranks per shard group keeps
    a piece in a file the table says a sharded run keeps elsewhere (``sharded_instead``): the
    older layout LeRobot 0.6 wrote, whose weights load but which cannot be resumed. Else None."""
    if not is_sharded(dp_shard):
        return None
    for file in layout_files():
        instead = file.sharded_instead
        if instead is not None and (Path(step_dir) / file.path).exists() and not (Path(step_dir) / instead).exists():
            return file.path, (f"old layout: a sharded run (dp_shard={dp_shard}) holding this file instead of "
                               f"{instead}/ (the older gathered-optimizer layout, as LeRobot 0.6 wrote)")
    return None


def required(kind: CheckpointKind) -> list[LayoutFile]:
    """The files a checkpoint of ``kind`` must hold, in table order."""
    return [file for file in layout_files() if file.required_for(kind)]


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
    older = older_layout(step_dir, record.topology.dp_shard)
    if older is not None:
        raise CheckpointError(
            f"{step_dir}/{older[0]}: {older[1]}; it cannot be resumed, but its weights can still be loaded with "
            "--policy.path"
        )
    check_complete(step_dir, record, advice)
    return record
