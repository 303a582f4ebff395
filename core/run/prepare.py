"""Assemble a training run from a validated config and hand it to the Trainer.

This is DESIGN.md's data flow, one call per arrow: env guard → process group →
topology → output folder → data → policy → parallelize → optimizer/scheduler/scaler
→ optional resume → banner → loop → final save/push.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
from dataclasses import dataclass
from pathlib import Path
import torch
from torch.utils.data import DataLoader

from lerobot_kit.core.distributed.accelerate_guard import check_accelerate_env
from lerobot_kit.core.run.banner import format_banner
from lerobot_kit.core.checkpoint import paths
from lerobot_kit.core.checkpoint.save_restore import restore_checkpoint
from lerobot_kit.core.run.components import RunComponents
from lerobot_kit.core.config.schema import TrainConfig
from lerobot_kit.core.data.dataset import DatasetMeta
from lerobot_kit.core.data.sampler import DataPosition, ResumableBatchSampler
from lerobot_kit.core.distributed.process_group import DistContext, barrier, broadcast_object, init_distributed, shutdown
from lerobot_kit.core.errors import CheckpointError, ConfigError
from lerobot_kit.core.run.optim import build_optimizer, build_scheduler
from lerobot_kit.core.parallel.parallelize import Parallelized, parallelize
from lerobot_kit.core.parallel.precision import build_grad_scaler
from lerobot_kit.core.run.publish import publish_final
from lerobot_kit.core.parallel.dims import ParallelDims
from lerobot_kit.core.run.tracking import make_tracker
from lerobot_kit.core.run.trainer import Trainer, TrainResult

logger = logging.getLogger("lerobot_kit")


@dataclass
class RunPlan:
    """Where the run writes, and the checkpoint it resumes from (if any)."""

    output_dir: Path
    resume_from: Path | None


def plan_output(config: TrainConfig, config_path: str | None) -> RunPlan:
    """Decide the run folder and resume source; refuse to overwrite an existing run."""
    if config.resume:
        step_dir = _checkpoint_of(config_path)
        if step_dir is None:
            if config.output_dir is None:
                raise ConfigError(
                    "--resume=true needs a run to resume: pass --config_path=<output_dir>/checkpoints/last/"
                    "pretrained_model/train_config.json (or --output_dir of the run)"
                )
            step_dir = paths.last_checkpoint(Path(config.output_dir))
            if step_dir is None:
                raise CheckpointError(
                    f"--resume=true: {config.output_dir} has no checkpoint to resume ({paths.CHECKPOINTS_DIR}/"
                    f"{paths.LAST_LINK} is missing); start a new run without --resume"
                )
        return RunPlan(step_dir.parent.parent, step_dir)
    if config.output_dir is None:
        stamp = datetime.datetime.now().strftime("%Y-%m-%d/%H-%M-%S")
        job = config.job_name or f"{config.policy.type}_{config.dataset.type}"
        output_dir = Path("outputs/train") / f"{stamp}_{job}"
    else:
        output_dir = Path(config.output_dir)
    if output_dir.exists() and any(output_dir.iterdir()):
        raise ConfigError(
            f"--output_dir={output_dir} already exists and is not empty; pass --resume=true to continue "
            "that run, or choose another --output_dir (nothing was changed)"
        )
    return RunPlan(output_dir, None)


def _checkpoint_of(config_path: str | None) -> Path | None:
    """The step folder a ``.../checkpoints/NNNNNN/pretrained_model/train_config.json`` lives in."""
    if not config_path:
        return None
    pretrained = Path(config_path).resolve().parent
    if pretrained.name != paths.PRETRAINED_DIR:
        return None
    step_dir = pretrained.parent
    return step_dir if (step_dir / paths.TRAINING_STATE_DIR).is_dir() else None


def setup_logging(is_main: bool) -> None:
    """Only the main process prints (SPEC S2.6); other ranks keep errors only."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S"))
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO if is_main else logging.ERROR)
    logger.propagate = False


def train(config: TrainConfig, config_path: str | None = None) -> TrainResult:
    check_accelerate_env(os.environ)
    ctx = init_distributed(config.parallelism.timeout_s)
    setup_logging(ctx.is_main)
    # No ``finally``: on an error a peer may be dead, and shutdown's barrier would wait for
    # it until the collective timeout; exiting non-zero tears the group down instead.
    result = _train(config, config_path, ctx)
    shutdown(ctx)
    # After the process group is gone, so that peers exit instead of timing out in a
    # collective while the main process uploads.
    publish_final(config, result.last_checkpoint, ctx)
    return result


def _agreed_plan(config: TrainConfig, config_path: str | None, ctx: DistContext) -> RunPlan:
    """The main process decides (one clock, one look at the disk); the others follow."""
    outcome: object = None
    if ctx.is_main:
        try:
            outcome = plan_output(config, config_path)
        except (ConfigError, CheckpointError) as exc:
            outcome = exc
    outcome = broadcast_object(ctx, outcome)
    if isinstance(outcome, Exception):
        raise outcome
    assert isinstance(outcome, RunPlan)
    return outcome


@dataclass
class PreparedRun:
    """A run ready for its first step: components built, checkpoint (if any) restored."""

    run: RunComponents
    loader: DataLoader
    sampler: ResumableBatchSampler
    start_step: int
    position: DataPosition
    dataset_len: int


def prepare_run(config: TrainConfig, config_path: str | None, ctx: DistContext) -> PreparedRun:
    """Everything before the loop; collective. Also the entry for tools that inspect a run."""
    from lerobot_kit.core.model.processor import make_processors
    from lerobot_kit.core.data.build import build_dataset

    dims = ParallelDims.resolve(config.parallelism, ctx.world_size)
    accumulation = config.accelerator.gradient_accumulation.steps
    if config.save_checkpoint and config.save_freq % accumulation:
        raise ConfigError(
            f"--save_freq={config.save_freq} must be a multiple of --accelerator.gradient_accumulation.steps="
            f"{accumulation}, so that checkpoints fall between optimizer updates"
        )
    from lerobot_kit.core.model.peft import prepare_request

    prepare_request(config)
    plan = _agreed_plan(config, config_path, ctx)
    config.output_dir = str(plan.output_dir)
    config.resume = plan.resume_from is not None

    dataset = build_dataset(config)
    preprocessor, postprocessor = make_processors(config.policy, dataset.meta)
    parallel = _build_parallel_policy(config, ctx, dims, dataset.meta, from_checkpoint=plan.resume_from is not None)
    params = [p for p in parallel.model.parameters() if p.requires_grad]
    optimizer = build_optimizer(params, config.optimizer)
    scheduler = build_scheduler(optimizer, config.scheduler, config.steps)
    scaler = build_grad_scaler(config.accelerator, dims, ctx)
    run = RunComponents(
        config, ctx, dims, parallel, optimizer, scheduler, scaler, preprocessor, postprocessor, dataset.meta,
        plan.output_dir,
    )
    start_step, position = 0, DataPosition()
    if plan.resume_from is not None:
        restored = restore_checkpoint(run, plan.resume_from)
        start_step, position = restored.step, restored.position
        position = _check_data_position(restored.saved, config, dims, position)
    else:
        # Dropout differs per rank; weights (seeded above) and data order do not depend on it.
        torch.manual_seed(config.seed + ctx.rank)
    sampler = ResumableBatchSampler(
        len(dataset), config.batch_size, dims.dp_world_size, _dp_rank(ctx, dims), config.seed, start=position
    )
    # A private generator: creating the iterator must not draw from the global RNG, or a
    # resumed run's dropout would drift from the uninterrupted run's.
    loader = DataLoader(
        dataset, batch_sampler=sampler, num_workers=config.num_workers,
        generator=torch.Generator().manual_seed(config.seed),
    )
    return PreparedRun(run, loader, sampler, start_step, position, len(dataset))


def _train(config: TrainConfig, config_path: str | None, ctx: DistContext) -> TrainResult:
    prepared = prepare_run(config, config_path, ctx)
    run = prepared.run
    if ctx.is_main:
        run.output_dir.mkdir(parents=True, exist_ok=True)
        for line in format_banner(run, prepared.dataset_len, prepared.start_step):
            logger.info(line)
    tracker = make_tracker(config, ctx, run.output_dir)
    barrier(ctx)
    trainer = Trainer(run, iter(prepared.loader), prepared.sampler, prepared.start_step, prepared.position, tracker)
    try:
        result = trainer.fit()
    finally:
        tracker.finish()
    if ctx.is_main and result.logged:
        first, last = result.logged[0]["loss"], result.logged[-1]["loss"]
        logger.info(f"done: {result.steps_done} steps | first logged loss {first:.4f} | last logged loss {last:.4f}")
        if result.last_checkpoint:
            logger.info(f"checkpoint: {result.last_checkpoint}")
    return result


def _build_parallel_policy(
    config: TrainConfig, ctx: DistContext, dims: ParallelDims, meta: DatasetMeta, from_checkpoint: bool
) -> Parallelized:
    """The policy in its layout, with the weights a one-process run would start from.

    Sharded runs materialise the full model on the main process only: the others build
    it on the meta device, and after ``fully_shard`` the main process's weights are
    broadcast shard by shard. So initial weights equal a one-process run's with the same
    seed, and no other rank ever holds the whole model. Replicated layouts hold full
    copies anyway and build them on every rank from the same seed.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    from lerobot_kit.core.model.policy import load_pretrained_weights, make_policy

    on_meta = dims.sharded and not ctx.is_main
    torch.manual_seed(config.seed)
    with torch.device("meta") if on_meta else contextlib.nullcontext():
        policy = make_policy(config.policy, meta)
    use_peft = config.peft.method_type is not None
    # A PEFT checkpoint holds only the adapter: on resume too the base comes from --policy.path.
    if config.policy.path and (use_peft or not from_checkpoint) and not on_meta:
        load_pretrained_weights(policy, Path(config.policy.path))
    declared = getattr(type(policy), "_fsdp_wrap_modules", None)
    model: torch.nn.Module = policy
    if use_peft:
        from lerobot_kit.core.model.peft import align_trainable_dtypes, base_path_of, wrap_policy

        # Every rank wraps (meta ranks on meta), once, before sharding: the adapters shard with the base.
        model = wrap_policy(policy, config.peft, base_path_of(str(config.policy.path)))
        align_trainable_dtypes(model, config, dims, declared)
    full_state = model.state_dict() if dims.sharded and ctx.is_main else {}
    mesh = dims.build_mesh(ctx.device.type)
    parallel = parallelize(model, dims, mesh, config.accelerator, declared, ctx.device)
    if dims.sharded:
        if on_meta:
            parallel.to_empty()
        set_model_state_dict(
            parallel.model, full_state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        )
    return parallel


def _dp_rank(ctx: DistContext, dims: ParallelDims) -> int:
    """Data-parallel workers are all ranks in these layouts: the global rank is the dp rank."""
    return ctx.rank


def _check_data_position(
    saved: dict[str, object], config: TrainConfig, dims: ParallelDims, position: DataPosition
) -> DataPosition:
    same = saved.get("dp_world_size") == dims.dp_world_size and saved.get("batch_size") == config.batch_size
    if not same:
        logger.warning(
            "resuming the data order from the same epoch and sample offset, but not sample-exact: the checkpoint "
            f"was written with dp_world_size={saved.get('dp_world_size')} batch_size={saved.get('batch_size')}, "
            f"this run has dp_world_size={dims.dp_world_size} batch_size={config.batch_size}, so each worker's "
            "micro-batches differ from the uninterrupted run"
        )
    return position
