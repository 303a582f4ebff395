"""Saving a whole checkpoint (collective) and restoring a run's state from one.

Every rank calls ``save_checkpoint`` with the run's ``CheckpointState``: sharded state
is written by each rank, the rest by the main process only, all into a temporary folder
that ``atomic.publish`` makes visible once complete. ``restore_checkpoint`` loads into
the same pieces on the *current* topology, whatever the one that wrote it (DCP
reshards; gathered files are broadcast).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist

from lerobot_kit.core.checkpoint.pretrained import save_pretrained
from lerobot_kit.core.checkpoint.save_digests import gather_digests, own_shard_digests
from lerobot_kit.core.checkpoint.shard_writes import save_shards
from lerobot_kit.core.checkpoint.state import CheckpointState
from lerobot_kit.core.checkpoint.training_state import (
    capture_rng,
    load_full_optimizer,
    load_rng,
    restore_rng,
    save_full_optimizer,
    save_rng,
    write_json,
)
from lerobot_kit.core.checkpoint.weights import SHAPE_FIX, CheckpointFormat, reads_shards
from lerobot_kit.core.checkpoint.write_failures import save_phase
from lerobot_kit.core.data.sampler import DataPosition
from lerobot_kit.core.distributed.process_group import broadcast_object
from lerobot_kit.core.errors import CheckpointError
from lerobot_kit.core.layout import atomic, paths
from lerobot_kit.core.layout.files import resume_advice, resumable_record
from lerobot_kit.core.layout.json_file import read_json
from lerobot_kit.core.layout.stored_weights import StoredWeights
from lerobot_kit.core.layout.training_step import SamplerPosition, TrainingStep
from lerobot_kit.core.layout.verify import damage

logger = logging.getLogger(__name__)



def checkpoint_format(name: str) -> CheckpointFormat:
    from lerobot_kit.core.registry.registry import get_registry

    return get_registry().checkpoint_format(name)


def save_checkpoint(state: CheckpointState, step: int, position: DataPosition) -> Path | None:
    """Collective: every rank must call it at the same step. Returns the folder on the main process.

    Once every rank's writes are done, each hashes its own shard files and the main
    process publishes the folder with the gathered digests. A failed write raises
    ``write_failures.SaveFailed`` on every rank at the same point (``write_failures.cleaned_up``
    words it); nothing is published then.
    """
    ctx = state.ctx
    write_checkpoint(state, step, position)
    tmp = atomic.temp_step_dir(state.output_dir, step)
    with save_phase(state):
        mine = own_shard_digests(tmp, ctx.rank)
    digests = gather_digests(ctx, mine)
    final = None
    with save_phase(state):
        if ctx.is_main:
            final = atomic.publish(state.output_dir, step, digests)
    return final


def write_checkpoint(state: CheckpointState, step: int, position: DataPosition) -> None:
    """Collective: write the whole checkpoint into its temporary folder, not yet visible.

    ``atomic.publish`` makes it the step folder and ``last`` once every rank's writes are
    done: at once in ``save_checkpoint``, after the background writes in ``CheckpointSaver``.
    Each phase ends with the ranks agreeing that every write of it succeeded
    (``write_failures.save_phase``): a write that fails on one rank stops all of them there.
    """
    ctx, facts = state.ctx, state.facts
    with save_phase(state):
        if ctx.is_main:
            atomic.prepare_temp_dir(state.output_dir, step)
    tmp = atomic.temp_step_dir(state.output_dir, step)
    pretrained, state_dir = tmp / paths.PRETRAINED_DIR, tmp / paths.TRAINING_STATE_DIR
    with save_phase(state):
        weights = checkpoint_format(facts.checkpoint_format).save_weights(
            state.weights, pretrained, sharded=facts.sharded, is_main=ctx.is_main
        )
    with save_phase(state):
        optimizer_kind = _save_optimizer(state, state_dir)
    rng = _gather_rng(state)
    with save_phase(state):
        if ctx.is_main:
            files = state.pretrained
            save_pretrained(state.model, files.meta, files.preprocessor, files.postprocessor, None, pretrained)
            write_json(pretrained / paths.TRAIN_CONFIG, files.train_config)
            save_rng(rng, state_dir)
            for piece in state.json_pieces:
                write_json(state_dir / piece.file, piece.state.state_dict())
            record = facts.record(step, SamplerPosition(**position.to_json()), weights, optimizer_kind)
            write_json(state_dir / paths.TRAINING_STEP, record.to_json())


def _save_optimizer(state: CheckpointState, state_dir: Path) -> str:
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    optimizer_state = get_optimizer_state_dict(state.model, state.optimizer)
    if state.facts.sharded:
        save_shards(optimizer_state, state_dir / paths.DCP_OPTIMIZER_DIR)
        return "dcp"
    if state.ctx.is_main:
        save_full_optimizer(optimizer_state, state_dir)
    return "safetensors"


def _gather_rng(state: CheckpointState) -> list[dict[str, Any]]:
    mine = capture_rng()
    if not state.ctx.distributed:
        return [mine]
    everyone: list[Any] = [None] * state.ctx.world_size
    dist.all_gather_object(everyone, mine)
    return everyone


@dataclass
class Restored:
    step: int
    position: DataPosition
    record: TrainingStep


def restore_checkpoint(state: CheckpointState, step_dir: Path) -> Restored:
    """Collective: load weights, optimizer, the JSON pieces and RNG onto the current topology.

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
    pretrained, state_dir = step_dir / paths.PRETRAINED_DIR, step_dir / paths.TRAINING_STATE_DIR
    checkpoint_format(record.checkpoint_format).load_weights(
        state.weights, pretrained, distributed=ctx.distributed, is_main=ctx.is_main
    )
    _load_optimizer(state, state_dir)
    for piece in state.json_pieces:
        file = state_dir / piece.file
        if file.is_file():  # whether the checkpoint must hold it is the layout table's rule, checked above
            piece.state.load_state_dict(read_json(file))
    rng = load_rng(state_dir, ctx.rank)
    if rng is not None:
        restore_rng(rng, state_dir / paths.RNG_STATE)
    return Restored(record.step, DataPosition(**asdict(record.sampler)), record)


def _unread_weights(step_dir: Path, distributed: bool) -> str | None:
    """The weight kind a resume on this topology does not read (of a checkpoint holding both): not
    verified. None when the record cannot tell (its own check then names the problem)."""
    try:
        stored = StoredWeights.of(step_dir / paths.PRETRAINED_DIR)
    except CheckpointError:
        return None
    unread = stored.file_name if reads_shards(stored, distributed=distributed) else paths.DCP_MODEL_DIR
    return f"{paths.PRETRAINED_DIR}/{unread}"


def _load_optimizer(state: CheckpointState, state_dir: Path) -> None:
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    model, optimizer, ctx = state.model, state.optimizer, state.ctx
    shards = state_dir / paths.DCP_OPTIMIZER_DIR
    if shards.is_dir():
        from lerobot_kit.core.checkpoint.safe_dcp import load_dcp

        current = get_optimizer_state_dict(model, optimizer)
        load_dcp(current, shards, what="optimizer shards", fix=SHAPE_FIX)
        set_optimizer_state_dict(model, optimizer, current)
        return
    full = load_full_optimizer(state_dir) if (ctx.is_main or not ctx.distributed) else {}
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=ctx.distributed)
    set_optimizer_state_dict(model, optimizer, full, options=options)
