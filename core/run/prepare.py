"""Assemble a training run from a validated config and hand it to the Trainer.

One call per stage: env guard → process group → run spec (agreed by every rank) → data
→ model → parallelize → optimizer/scheduler/scaler → optional resume → banner → loop →
final save/push.
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from lerobot_kit.core.checkpoint.save_restore import restore_checkpoint
from lerobot_kit.core.config.schema import TrainConfig
from lerobot_kit.core.data.loader import TrainingLoader, build_loader
from lerobot_kit.core.data.sampler import DataPosition, ResumableBatchSampler
from lerobot_kit.core.distributed.accelerate_guard import check_accelerate_env
from lerobot_kit.core.distributed.process_group import (
    DistContext,
    barrier,
    broadcast_object,
    init_distributed,
    shutdown,
)
from lerobot_kit.core.errors import LerobotError
from lerobot_kit.core.layout.training_step import TrainingStep
from lerobot_kit.core.parallel.parallel_model import Parallelized
from lerobot_kit.core.parallel.parallelize import parallelize
from lerobot_kit.core.parallel.precision import build_grad_scaler
from lerobot_kit.core.run.assemble import build_model
from lerobot_kit.core.run.components import RunComponents
from lerobot_kit.core.run.evaluation import evaluation_hooks
from lerobot_kit.core.run.optim import build_optimizer, build_scheduler
from lerobot_kit.core.run.output.lock import Claimant, OutputLock
from lerobot_kit.core.run.publishing.end_of_run import publish_final
from lerobot_kit.core.run.reliability.guards import EVERY_RANK_ERRORS, guarded_run
from lerobot_kit.core.run.reliability.preemption import run_stopped
from lerobot_kit.core.run.reporting.banner import format_banner
from lerobot_kit.core.run.reporting.mfu import Utilization, device_peak
from lerobot_kit.core.run.reporting.model_flops import SampleFlops, count_sample_flops
from lerobot_kit.core.run.reporting.tracking import make_tracker
from lerobot_kit.core.run.resume.optimizer_flags import apply_optimizer_config
from lerobot_kit.core.run.resume.rewind import discard_later_steps
from lerobot_kit.core.run.spec import Restarts, RunSpec, resolve_run
from lerobot_kit.core.run.trainer import Trainer, TrainResult

logger = logging.getLogger("lerobot_kit")


def setup_logging(is_main: bool) -> None:
    """Only the main process prints; other ranks keep errors only."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S"))
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO if is_main else logging.ERROR)
    logger.propagate = False


@guarded_run
def train(config: TrainConfig) -> TrainResult:
    """The whole run, on every rank. In a process group the caller initialised, the run
    joins it and leaves it initialised, so one set of processes can run many configs."""
    check_accelerate_env(os.environ)
    ctx = init_distributed(config.parallelism.timeout_s)
    setup_logging(ctx.is_main)
    # The main process locks the output folder as soon as the spec has chosen it and holds it
    # until the run has ended, however it ends (kill -9 aside: a later run takes a dead run's
    # lock over); the other ranks are part of its run and never touch it.
    lock = OutputLock(Claimant.current(restarting=ctx.restart_count >= 1, rerun=config.resume == "auto"))
    try:
        return _train_and_publish(config, ctx, lock)
    finally:
        lock.release()


def _train_and_publish(config: TrainConfig, ctx: DistContext, lock: OutputLock) -> TrainResult:
    # No ``finally``: on an error a peer may be dead, and shutdown's barrier would wait for
    # it until the collective timeout; exiting non-zero tears the group down instead.
    try:
        result = _train(config, ctx, lock)
    except EVERY_RANK_ERRORS:
        shutdown(ctx)  # every rank stopped at the same point: the group closes cleanly
        raise
    shutdown(ctx)
    if result.stopped_by is not None:  # exit code 75: the scheduler requeues, the restart continues
        raise run_stopped(result.stopped_by, result.steps_done, config.steps, result.last_checkpoint,
                          config.save_checkpoint)
    # After the process group is gone, so that peers exit instead of timing out in a
    # collective while the main process uploads.
    publish_final(config, result.last_checkpoint, ctx)
    return result


def agree_on_spec(config: TrainConfig, ctx: DistContext, lock: OutputLock | None = None) -> RunSpec:
    """The main process resolves the spec (one clock, one look at the disk); the others follow.

    With ``lock``, the main process takes the output folder's lock before it reads the
    folder; its failure, like any refusal, reaches every rank.
    """
    outcome: object = None
    if ctx.is_main:
        try:
            outcome = resolve_run(config, ctx.world_size, Restarts(ctx.restart_count, ctx.max_restarts),
                                  claim_folder=None if lock is None else lock.acquire)
        except (LerobotError, OSError) as exc:
            outcome = exc
    outcome = broadcast_object(ctx, outcome)
    if isinstance(outcome, Exception):
        raise outcome
    assert isinstance(outcome, RunSpec)
    if outcome.resume_note and outcome.nothing_left is None:  # else that line says it all
        logger.info(outcome.resume_note)
    return outcome


@dataclass
class PreparedRun:
    """A run ready for its first step: components built, checkpoint (if any) restored."""

    run: RunComponents
    loader: TrainingLoader
    sampler: ResumableBatchSampler
    start_step: int
    position: DataPosition
    dataset_len: int
    member_names: list[str]  # a mixture's members, else empty (``PolicyDataset.member_names``)
    sample_flops: SampleFlops | None = None  # counted on the main process when asked (count_flops)


def prepare_run(
    config: TrainConfig, ctx: DistContext, spec: RunSpec | None = None, count_flops: bool = False
) -> PreparedRun:
    """Everything before the loop; collective. Also the entry for tools that inspect a run:
    they pass no ``spec``, which is then agreed on here without the output folder's lock
    (they write nothing to the folder). ``count_flops``: the main process counts the
    model's FLOPs per sample, for MFU (``core.run.reporting.model_flops``)."""
    from lerobot_kit.core.data.build import build_dataset
    from lerobot_kit.core.model.policy import make_policy_processors

    spec = spec or agree_on_spec(config, ctx)
    dims = spec.dims
    dataset = build_dataset(config)
    preprocessor, postprocessor = make_policy_processors(config.policy, dataset.meta)
    counted = functools.partial(count_sample_flops, dataset=dataset, preprocessor=preprocessor,
                                batch_size=config.batch_size) if count_flops and ctx.is_main else None
    parallel, sample_flops = _parallel_model(spec, ctx, dataset.meta, counted)
    params = [p for p in parallel.model.parameters() if p.requires_grad]
    optimizer = build_optimizer(params, config.optimizer)
    scheduler = build_scheduler(optimizer, config.scheduler, config.steps)
    scaler = build_grad_scaler(config.accelerator, dims, ctx)
    run = RunComponents(spec, ctx, parallel, optimizer, scheduler, scaler, preprocessor, postprocessor, dataset.meta)
    start_step, position = 0, DataPosition()
    if spec.resume_from is not None:
        restored = restore_checkpoint(run.checkpoint_state, spec.resume_from)
        start_step, position = restored.step, run.cursor.position
        for change in apply_optimizer_config(optimizer, scheduler, config.optimizer):
            logger.info(f"resume: {change} (the schedule continues from step {start_step} on the new base)")
        _warn_if_not_sample_exact(restored.record, spec)
    else:
        # Dropout differs per rank; weights (seeded above) and data order do not depend on it.
        torch.manual_seed(config.seed + ctx.rank)
    loader = build_loader(dataset, config, dims.dp_world_size, dims.dp_rank(ctx.rank), position, ctx.device)
    return PreparedRun(run, loader, loader.sampler, start_step, position, len(dataset), dataset.member_names(),
                       sample_flops)


def _train(config: TrainConfig, ctx: DistContext, lock: OutputLock) -> TrainResult:
    spec = agree_on_spec(config, ctx, lock)
    if spec.nothing_left is not None:  # every rank returns: the spec is the same on all
        logger.warning(spec.nothing_left)
        return TrainResult(steps_done=spec.resume_step)
    prepared = prepare_run(config, ctx, spec, count_flops=True)
    run = prepared.run
    utilization = None
    if ctx.is_main:
        assert prepared.sample_flops is not None
        peak = device_peak(config.accelerator, ctx.device, spec.dims.sharded)
        utilization = Utilization(prepared.sample_flops, peak, ctx.world_size)
        if run.spec.discarded:
            assert run.spec.resume_from is not None
            discard_later_steps(run.spec.resume_from, run.spec.discarded)
            logger.info(
                f"--resume_from={prepared.start_step}: removed the later step folders "
                f"{', '.join(d.name for d in run.spec.discarded)}; the run continues from step {prepared.start_step}"
            )
        run.output_dir.mkdir(parents=True, exist_ok=True)
        for line in format_banner(run, prepared.dataset_len, prepared.start_step, utilization):
            logger.info(line)
    tracker = make_tracker(run.spec, ctx)
    hooks = evaluation_hooks(run)
    barrier(ctx)
    trainer = Trainer(
        run, iter(prepared.loader), prepared.sampler, prepared.start_step, prepared.position, tracker, hooks,
        prepared.member_names, utilization,
    )
    try:
        result = trainer.fit()
    except RuntimeError as exc:
        failure = prepared.loader.worker_failure(exc)
        if failure is exc:
            raise
        raise failure from exc
    finally:
        tracker.finish()
    if ctx.is_main and result.logged:
        first, last = result.logged[0]["loss"], result.logged[-1]["loss"]
        logger.info(f"done: {result.steps_done} steps | first logged loss {first:.4f} | last logged loss {last:.4f}")
        if result.last_checkpoint:
            logger.info(f"checkpoint: {result.last_checkpoint}")
    return result


def _parallel_model(
    spec: RunSpec, ctx: DistContext, meta: object, count_flops: Callable[[nn.Module], SampleFlops] | None
) -> tuple[Parallelized, SampleFlops | None]:
    """The policy in its layout, with the weights a one-process run would start from, and
    ``count_flops`` of the policy before the layout changes it (the model's own FLOPs,
    without activation checkpointing's recomputation).

    Sharded runs materialise the full model on the main process only: the others build
    it on the meta device, and ``parallelize`` broadcasts the main process's
    weights into their shards. So initial weights equal a one-process run's with the same
    seed, and no other rank ever holds the whole model. Replicated layouts hold full
    copies anyway and build them on every rank from the same seed.
    """
    dims = spec.dims
    on_meta = dims.sharded and not ctx.is_main
    built = build_model(spec, meta, torch.device("meta") if on_meta else torch.device("cpu"))  # type: ignore[arg-type]
    flops = count_flops(built.model) if count_flops is not None else None
    parallel = parallelize(built.model, built.wrap, dims, spec.config.accelerator, ctx.device, weights_from_main=True)
    return parallel, flops


def _warn_if_not_sample_exact(saved: TrainingStep, spec: RunSpec) -> None:
    config, dims = spec.config, spec.dims
    same = saved.dp_world_size == dims.dp_world_size and saved.batch_size == config.batch_size
    if not same:
        logger.warning(
            "resuming the data order from the same epoch and sample offset, but not sample-exact: the checkpoint "
            f"was written with dp_world_size={saved.dp_world_size} batch_size={saved.batch_size}, "
            f"this run has dp_world_size={dims.dp_world_size} batch_size={config.batch_size}, so each worker's "
            "micro-batches differ from the uninterrupted run"
        )
