"""Saving a whole checkpoint (collective) and restoring a run from one.

Every rank calls ``save_checkpoint``: sharded state is written by each rank, the rest
by the main process only, all into a temporary folder that ``atomic.publish`` makes
visible once complete. ``restore_checkpoint`` loads onto the *current* topology,
whatever the one that wrote it (DCP reshards; gathered files are broadcast).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist

from lerobot_kit.core.checkpoint import atomic, paths
from lerobot_kit.core.checkpoint.save_digests import gather_shard_digests
from lerobot_kit.core.checkpoint.shard_writes import save_shards
from lerobot_kit.core.checkpoint.training_state import (
    capture_rng,
    load_full_optimizer,
    load_rng,
    read_json,
    restore_rng,
    save_full_optimizer,
    save_rng,
    write_json,
)
from lerobot_kit.core.checkpoint.training_step import SamplerPosition, Topology, TrainingStep, read_training_step
from lerobot_kit.core.checkpoint.stored_weights import StoredWeights
from lerobot_kit.core.checkpoint.weights import SHAPE_FIX, CheckpointFormat, reads_shards
from lerobot_kit.core.data.sampler import DataPosition
from lerobot_kit.core.checkpoint.verify import damage
from lerobot_kit.core.distributed.process_group import barrier, broadcast_object
from lerobot_kit.core.errors import CheckpointError
from lerobot_kit.core.run.components import RunComponents
from lerobot_kit.core.run.optim import load_scheduler_state, scheduler_state
from lerobot_kit.core.version import package_version

logger = logging.getLogger(__name__)

RESUME_ADVICE = (
    "resume from an earlier step folder (--resume=true --config_path=<run>/checkpoints/<step>/pretrained_model/"
    "train_config.json)"
)


def checkpoint_format(name: str) -> CheckpointFormat:
    from lerobot_kit.core.registry.registry import get_registry

    return get_registry().checkpoint_format(name)


def save_checkpoint(run: RunComponents, step: int, position: DataPosition) -> Path | None:
    """Collective: every rank must call it at the same step. Returns the folder on the main process."""
    write_checkpoint(run, step, position)
    barrier(run.ctx)
    tmp = atomic.temp_step_dir(run.output_dir, step)
    digests = gather_shard_digests(tmp, distributed=run.ctx.distributed)
    final = atomic.publish(run.output_dir, step, digests) if run.ctx.is_main else None
    barrier(run.ctx)
    return final


def write_checkpoint(run: RunComponents, step: int, position: DataPosition) -> None:
    """Collective: write the whole checkpoint into its temporary folder, not yet visible.

    ``atomic.publish`` makes it the step folder and ``last`` once every rank's writes are
    done: at once in ``save_checkpoint``, after the background writes in ``CheckpointSaver``.
    """
    from lerobot_kit.core.model.policy import save_pretrained

    config, ctx = run.config, run.ctx
    tmp = atomic.temp_step_dir(run.output_dir, step)
    if ctx.is_main:
        atomic.prepare_temp_dir(run.output_dir, step)
    barrier(run.ctx)
    pretrained, state_dir = tmp / paths.PRETRAINED_DIR, tmp / paths.TRAINING_STATE_DIR
    weights = checkpoint_format(config.checkpoint_format).save_weights(
        run.weights, pretrained, sharded=run.dims.sharded, is_main=ctx.is_main
    )
    optimizer_kind = _save_optimizer(run, state_dir)
    rng = _gather_rng(run)
    if ctx.is_main:
        save_pretrained(run.parallel.model, run.meta, run.preprocessor, run.postprocessor, None, pretrained)
        write_json(pretrained / paths.TRAIN_CONFIG, run.spec.recorded_config())
        save_rng(rng, state_dir)
        write_json(state_dir / paths.SCHEDULER_STATE, scheduler_state(run.scheduler))
        if run.scaler is not None:
            write_json(state_dir / paths.SCALER_STATE, run.scaler.state_dict())
        record = _training_step(run, step, position, weights, optimizer_kind)
        write_json(state_dir / paths.TRAINING_STEP, record.to_json())


def _save_optimizer(run: RunComponents, state_dir: Path) -> str:
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    state = get_optimizer_state_dict(run.parallel.model, run.optimizer)
    if run.dims.sharded:
        save_shards(state, state_dir / paths.DCP_OPTIMIZER_DIR)
        return "dcp"
    if run.ctx.is_main:
        save_full_optimizer(state, state_dir)
    return "safetensors"


def _gather_rng(run: RunComponents) -> list[dict[str, Any]]:
    mine = capture_rng()
    if not run.ctx.distributed:
        return [mine]
    everyone: list[Any] = [None] * run.ctx.world_size
    dist.all_gather_object(everyone, mine)
    return everyone


def _training_step(
    run: RunComponents, step: int, position: DataPosition, weights: str, optimizer_kind: str
) -> TrainingStep:
    config = run.config
    return TrainingStep(
        step=step,
        lerobot_kit_version=package_version(),
        dp_world_size=run.dims.dp_world_size,
        batch_size=config.batch_size,
        gradient_accumulation_steps=config.accelerator.gradient_accumulation.steps,
        mixed_precision=config.accelerator.mixed_precision,
        topology=Topology(**run.dims.to_json()),
        checkpoint_format=config.checkpoint_format,
        weights=weights,
        optimizer=optimizer_kind,
        peft=config.peft.method_type is not None,
        sampler=SamplerPosition(**position.to_json()),
    )


@dataclass
class Restored:
    step: int
    position: DataPosition
    record: TrainingStep


def _check_resumable(step_dir: Path, record: TrainingStep) -> None:
    """Refuse what this version writes differently: a sharded run's gathered optimizer state."""
    if record.sharded and not (step_dir / paths.TRAINING_STATE_DIR / paths.DCP_OPTIMIZER_DIR).is_dir():
        raise CheckpointError(
            f"{step_dir}: a sharded run whose optimizer state is not in {paths.DCP_OPTIMIZER_DIR}/ "
            "(the older gathered-optimizer layout); it cannot be resumed, but its weights can still be "
            "loaded with --policy.path"
        )


def restore_checkpoint(run: RunComponents, step_dir: Path) -> Restored:
    """Collective: load weights, optimizer, scheduler, scaler and RNG onto the current topology.

    The main process first checks every file it is about to read against the checkpoint's
    manifest (all but the weight kind this topology does not read), and every rank stops
    alike when one differs.
    """
    problem = None
    if run.ctx.is_main:
        unread = _unread_weights(step_dir, run.ctx.distributed)
        problem = damage(step_dir, None, RESUME_ADVICE, skip=[unread] if unread else [])
    problem = broadcast_object(run.ctx, problem)
    if problem is not None:
        raise CheckpointError(problem)
    record = read_training_step(step_dir)
    _check_resumable(step_dir, record)
    pretrained, state_dir = step_dir / paths.PRETRAINED_DIR, step_dir / paths.TRAINING_STATE_DIR
    checkpoint_format(record.checkpoint_format).load_weights(
        run.weights, pretrained, distributed=run.ctx.distributed, is_main=run.ctx.is_main
    )
    _load_optimizer(run, state_dir)
    load_scheduler_state(run.scheduler, read_json(state_dir / paths.SCHEDULER_STATE))
    if run.scaler is not None:
        scaler_file = state_dir / paths.SCALER_STATE
        if scaler_file.is_file():
            run.scaler.load_state_dict(read_json(scaler_file))
    rng = load_rng(state_dir, run.ctx.rank)
    if rng is not None:
        restore_rng(rng)
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


def _load_optimizer(run: RunComponents, state_dir: Path) -> None:
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    model = run.parallel.model
    shards = state_dir / paths.DCP_OPTIMIZER_DIR
    if shards.is_dir():
        from lerobot_kit.core.checkpoint.safe_dcp import load_dcp

        state = get_optimizer_state_dict(model, run.optimizer)
        load_dcp(state, shards, what="optimizer shards", fix=SHAPE_FIX)
        set_optimizer_state_dict(model, run.optimizer, state)
        return
    full = load_full_optimizer(state_dir) if (run.ctx.is_main or not run.ctx.distributed) else {}
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=run.ctx.distributed)
    set_optimizer_state_dict(model, run.optimizer, full, options=options)
