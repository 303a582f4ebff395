"""Saving a whole checkpoint (collective) and restoring a run's state from one.

Every rank calls ``save_checkpoint`` with the run's ``CheckpointState``: sharded state
is written by each rank, the rest by the main process only, all into a temporary folder
that ``atomic.publish`` makes visible once complete. ``restore_checkpoint`` loads into
the same pieces on the *current* topology, whatever the one that wrote it (DCP
reshards; gathered files are broadcast). Both go piece by piece through the run's
``TrainingState``; ``pretrained_model/``'s configs and ``training_step.json`` (with the
fields the pieces set in it) are written last.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from lerobot_kit.core.checkpoint.pretrained import save_pretrained
from lerobot_kit.core.checkpoint.save_digests import gather_digests, own_shard_digests
from lerobot_kit.core.checkpoint.state import CheckpointState
from lerobot_kit.core.checkpoint.weights import reads_shards
from lerobot_kit.core.checkpoint.write_failures import save_phase
from lerobot_kit.core.distributed.process_group import broadcast_object
from lerobot_kit.core.errors import CheckpointError
from lerobot_kit.core.layout import atomic, paths
from lerobot_kit.core.layout.files import resume_advice, resumable_record
from lerobot_kit.core.layout.json_file import write_json
from lerobot_kit.core.layout.stored_weights import StoredWeights
from lerobot_kit.core.layout.training_step import TrainingStep
from lerobot_kit.core.layout.verify import damage

logger = logging.getLogger(__name__)


def save_checkpoint(state: CheckpointState, step: int) -> Path | None:
    """Collective: every rank must call it at the same step. Returns the folder on the main process.

    Once every rank's writes are done, each hashes its own shard files and the main
    process publishes the folder with the gathered digests. A failed write raises
    ``write_failures.SaveFailed`` on every rank at the same point (``write_failures.cleaned_up``
    words it); nothing is published then.
    """
    ctx = state.ctx
    write_checkpoint(state, step)
    tmp = atomic.temp_step_dir(state.output_dir, step)
    with save_phase(state):
        mine = own_shard_digests(tmp, ctx.rank)
    digests = gather_digests(ctx, mine)
    final = None
    with save_phase(state):
        if ctx.is_main:
            final = atomic.publish(state.output_dir, step, digests)
    return final


def write_checkpoint(state: CheckpointState, step: int) -> None:
    """Collective: write the whole checkpoint into its temporary folder, not yet visible.

    ``atomic.publish`` makes it the step folder and ``last`` once every rank's writes are
    done: at once in ``save_checkpoint``, after the background writes in ``CheckpointSaver``.
    Each phase ends with the ranks agreeing that every write of it succeeded
    (``write_failures.save_phase``): a write that fails on one rank stops all of them there.
    """
    ctx = state.ctx
    with save_phase(state):
        if ctx.is_main:
            atomic.prepare_temp_dir(state.output_dir, step)
    folder = state.folder(atomic.temp_step_dir(state.output_dir, step))
    recorded = state.training.save(folder, lambda: save_phase(state))
    with save_phase(state):
        if ctx.is_main:
            files = state.pretrained
            save_pretrained(state.model, files.meta, files.preprocessor, files.postprocessor, None, folder.pretrained)
            write_json(folder.pretrained / paths.TRAIN_CONFIG, files.train_config)
            write_json(folder.state_dir / paths.TRAINING_STEP, state.facts.record(step, recorded).to_json())


@dataclass
class Restored:
    step: int
    record: TrainingStep


def restore_checkpoint(state: CheckpointState, step_dir: Path) -> Restored:
    """Collective: load every piece of the run's training state onto the current topology.

    Every file's contents passed ``core.layout.validate.check_resumable`` when the run's
    spec was resolved, before the model was built. The main process first checks every
    file it is about to read against the checkpoint's manifest (all but the weight kind
    this topology does not read), and every rank stops alike when one differs.
    """
    ctx = state.ctx
    problem = None
    advice = resume_advice(step_dir)
    if ctx.is_main:
        unread = _unread_weights(step_dir, ctx.distributed)
        problem = damage(step_dir, None, advice, skip=[unread] if unread else [])
    problem = broadcast_object(ctx, problem)
    if problem is not None:
        raise CheckpointError(problem)
    record = resumable_record(step_dir, advice)
    state.training.load(state.folder(step_dir), record)
    return Restored(record.step, record)


def _unread_weights(step_dir: Path, distributed: bool) -> str | None:
    """The weight kind a resume on this topology does not read (of a checkpoint holding both): not
    verified. None when the record cannot tell (its own check then names the problem)."""
    try:
        stored = StoredWeights.of(step_dir / paths.PRETRAINED_DIR)
    except CheckpointError:
        return None
    unread = stored.file_name if reads_shards(stored, distributed=distributed) else paths.DCP_MODEL_DIR
    return f"{paths.PRETRAINED_DIR}/{unread}"
