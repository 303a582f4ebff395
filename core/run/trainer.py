"""The fixed training loop; it owns no policy-, format- or launcher-specific code.

One loop step = one micro-batch per data-parallel worker. Gradients are
synchronised only on the last micro-batch of each accumulation window; the LR
scheduler steps once per loop step (not after an update skipped for a non-finite
loss, ``reliability.nonfinite``); metrics are averaged across ranks before the main process logs
them, leaving out the micro-batches of skipped updates.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch

from lerobot_kit.core.checkpoint.saver import CheckpointSaver, SaveSettings
from lerobot_kit.core.data.loader import batch_to_device
from lerobot_kit.core.data.sampler import DataPosition, ResumableBatchSampler
from lerobot_kit.core.distributed.process_group import all_reduce_mean
from lerobot_kit.core.model.peft import unwrapped_policy
from lerobot_kit.core.model.policy import PER_SAMPLE_LOSS, Policy
from lerobot_kit.core.parallel.precision import autocast_dtype
from lerobot_kit.core.run.components import RunComponents
from lerobot_kit.core.run.reliability.guards import LOOP_ERRORS, RunGuards
from lerobot_kit.core.run.reliability.nonfinite import NonFiniteError, NonFiniteGuard, weights_finite
from lerobot_kit.core.run.reporting.log_window import LogWindow
from lerobot_kit.core.run.reporting.member_metrics import MemberMetrics
from lerobot_kit.core.run.reporting.metrics_log import append_row, drop_rows_after
from lerobot_kit.core.run.reporting.mfu import Utilization
from lerobot_kit.core.run.reporting.progress import Progress
from lerobot_kit.core.run.reporting.tracking import Tracker

logger = logging.getLogger("lerobot_kit")

METRICS_LOG = "the metrics log"


@dataclass
class TrainResult:
    steps_done: int
    logged: list[dict[str, float]] = field(default_factory=list)
    last_checkpoint: str | None = None
    stopped_by: str | None = None  # the signal the ranks stopped on (core.run.reliability.preemption), else None


class Trainer:
    def __init__(
        self,
        run: RunComponents,
        batches: Iterator[dict[str, torch.Tensor]],
        sampler: ResumableBatchSampler,
        start_step: int,
        position: DataPosition,
        tracker: Tracker,
        step_hooks: Sequence[Callable[[int], dict[str, float] | None]] = (),
        member_names: Sequence[str] = (),
        utilization: Utilization | None = None,
    ) -> None:
        self.run = run
        self.tracker = tracker
        self.batches = batches
        self.sampler = sampler
        self.step = start_step
        self.cursor = run.cursor  # the data_position piece of every checkpoint
        self.cursor.position = position
        config = run.config
        self.accumulation = config.accelerator.gradient_accumulation.steps
        self.amp_dtype = autocast_dtype(config.accelerator)
        self.global_batch = config.batch_size * run.dims.dp_world_size
        policy = unwrapped_policy(run.parallel.model)
        assert isinstance(policy, Policy), type(policy)
        self.policy = policy
        self.guards = RunGuards(run)  # stop on signals, hang watchdog: around the loop, not in it
        self.saver = CheckpointSaver(run.checkpoint_state, SaveSettings(
            config.async_checkpoint, config.keep_last_checkpoints, config.parallelism.timeout_s
        ), refused=self.guards.failures.record)
        # Non-finite loss or gradient norm: inside the step, between clipping and the update.
        self.nonfinite = NonFiniteGuard(config, run.ctx, scaled=run.scaler is not None)
        # Called with the step number after each step, its log line and its checkpoint; each
        # hook decides whether the step is its own (evaluation: core.run.evaluation) and may
        # return a metrics row, which the main process logs like its own.
        self.step_hooks = list(step_hooks)
        # A mixture's members (``dataset.member_names()``): their samples and losses per log window.
        self.members = MemberMetrics(member_names, run.ctx.device)
        # The main process's model FLOPs and device peak (core.run.reporting.mfu): model_tflops and mfu per row.
        self.utilization = utilization

    def _is_sync_step(self, step: int) -> bool:
        """Last micro-batch of an accumulation window, or the very last step of the run."""
        return (step + 1) % self.accumulation == 0 or step + 1 == self.run.config.steps

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.run.ctx.device.type, dtype=self.amp_dtype)

    def _train_step(
        self, batch: dict[str, torch.Tensor], sync: bool
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor], float | None, bool]:
        """One micro-batch; on a sync step also the update. Returns the loss, the policy's
        metrics, the global gradient norm (sync steps) and whether the update was applied."""
        run = self.run
        parallel, scaler, optimizer = run.parallel, run.scaler, run.optimizer
        # Cameras become float on the device; text (a frame's task) stays on the host, where the
        # policy's preprocessor tokenizes it.
        batch = batch_to_device(batch, run.ctx.device, run.meta.image_keys())
        batch = run.preprocessor(batch)
        with contextlib.nullcontext() if sync else parallel.no_sync():
            with self._autocast():
                loss, logs = parallel.module(batch)
            logs = dict(logs)
            self.members.add(batch, logs.pop(PER_SAMPLE_LOSS, None))  # per member, never a plain metric
            weight = self.policy.loss_weight(batch)
            if weight is not None:
                loss = parallel.balance_loss(loss, weight)
            scaled = self.nonfinite.fold(loss, loss / self.accumulation)
            (scaler.scale(scaled) if scaler is not None else scaled).backward()
        grad_norm, applied = None, True
        if sync:
            parallel.finish_grad_sync()
            if scaler is not None:
                scaler.unscale_(optimizer)
            grad_norm = parallel.clip_grad_norm(run.config.optimizer.grad_clip_norm)
            applied = self.nonfinite.check(self.step + 1, grad_norm)
            if scaler is not None:
                if applied:
                    scaler.step(optimizer)
                scaler.update()  # after a skip: backs the scale off, as after an overflow
            elif applied:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if applied:
            run.scheduler.step()
        # Metrics stay tensors until a log step: no device sync on every step.
        return loss.detach().float(), {k: v.detach().float() for k, v in logs.items()}, grad_norm, applied

    def fit(self) -> TrainResult:
        """The loop. A non-finite step raises ``NonFiniteError`` on every rank at once, after
        letting a checkpoint still being written finish: nothing is saved from that state. A
        checkpoint that could not be written raises on every rank at once too, and a failed
        write that only the main process sees (the metrics log, the tracker, the publish of a
        background checkpoint) stops every rank at the next step boundary with
        ``OutputWriteError`` (``output.failures``)."""
        try:
            return self._fit()
        except LOOP_ERRORS:
            self.saver.finish()
            self.guards.finish(agreed_error=True)
            raise

    def _fit(self) -> TrainResult:
        run, config = self.run, self.run.config
        result = TrainResult(steps_done=self.step)
        progress = Progress(config.steps, self.step, enabled=run.ctx.is_main)
        window = LogWindow(skipped_before=self.nonfinite.skipped)
        if run.ctx.is_main:
            with self.guards.failures.recorded(METRICS_LOG):
                drop_rows_after(run.output_dir, self.step)  # a resume replays the steps after its checkpoint
        run.parallel.module.train()
        self.guards.start()
        while self.step < config.steps and not self.guards.stop_now():
            self._loop_step(window, result, progress)
        return self._end(result, progress)

    def _loop_step(self, window: LogWindow, result: TrainResult, progress: Progress) -> None:
        """One step of the loop: the micro-batch, then its log line, checkpoint and hooks when due."""
        config = self.run.config
        self.guards.step_started(self.step + 1)
        sync = self._is_sync_step(self.step)
        wait_start = time.perf_counter()
        batch = next(self.batches)
        window.data_wait += time.perf_counter() - wait_start  # time the step waited for its batch (data_s)
        loss, logs, norm, applied = self._train_step(batch, sync)
        window.grad_norm = norm if norm is not None else window.grad_norm
        self.step += 1
        self.guards.step_finished(self.step)
        self.cursor.position = self.sampler.advance(self.cursor.position, 1)
        window.add_micro_batch({"loss": loss, **logs})
        is_log_step = self.step % config.log_freq == 0 or self.step == config.steps
        if sync or is_log_step:
            window.end_update(applied)  # a skipped update's metrics (non-finite) stay out of the log
            self.members.end_update(applied)
        if is_log_step:
            result.logged.append(self._log_window(window, progress))
        progress.update(self.step)
        self.saver.poll()
        if config.save_checkpoint and (self.step % config.save_freq == 0 or self.step == config.steps):
            self._save()
        hooks_start = time.perf_counter()
        for hook in self.step_hooks:
            row = hook(self.step)
            if row is not None:
                self._write_row(row)
        window.start += time.perf_counter() - hooks_start  # their time is not training throughput

    def _log_window(self, window: LogWindow, progress: Progress) -> dict[str, float]:
        """The window's row, averaged over ranks (collective); the main process logs and writes it."""
        run = self.run
        means = all_reduce_mean(run.ctx, window.local_means())
        if not window.metric_steps:
            means["loss"] = math.nan  # every update of the window was skipped
        means["samples_per_s"] = window.samples_per_s(self.global_batch)
        if self.utilization is not None:
            means.update(self.utilization.row(means["samples_per_s"]))
        means["lr"] = run.optimizer.param_groups[0]["lr"]
        if window.grad_norm is not None:
            means["grad_norm"] = window.grad_norm
        means["skipped_steps"] = self.nonfinite.skipped - window.skipped_before
        means["step"] = self.step
        means.update(self.members.window_row(run.ctx))  # collective; metrics.jsonl and tracker only
        if run.ctx.is_main:
            progress.clear()
            self._log(means, progress)
            self._write_row(means)
        window.restart(self.nonfinite.skipped)
        return means

    def _end(self, result: TrainResult, progress: Progress) -> TrainResult:
        """After the last step or an agreed stop: the stop's checkpoint, the pending save, the result."""
        config = self.run.config
        stopped = self.guards.stopped_by
        if stopped is not None and config.save_checkpoint and self.step % config.save_freq:
            self._save()  # where every rank agreed to stop
        last = self.saver.finish()
        failed = self.guards.output_error(self.step)
        self.guards.finish(agreed_error=failed is not None)
        if failed is not None:
            raise failed
        result.stopped_by = stopped.name if stopped is not None else None
        result.last_checkpoint = str(last) if last else None
        progress.clear()
        result.steps_done = self.step
        return result

    def _save(self) -> None:
        """Checkpoint this step, unless a weight is not finite (a finite but huge update can
        overflow one): then stop, so no checkpoint, and no `last`, ever holds one."""
        if not weights_finite(self.run.parallel.model, self.run.ctx, self.run.dims.sharded):
            raise NonFiniteError(
                f"step {self.step}: a weight is not finite after the update; stopped without writing its "
                "checkpoint, so checkpoints/last is unchanged; fix: lower --optimizer.lr"
            )
        self.saver.save(self.step)

    def _write_row(self, row: dict[str, float]) -> None:
        """Main process: one row to ``logs/metrics.jsonl`` and the tracker. A refused write stops
        every rank at the next step boundary instead of this process alone (``output.failures``)."""
        failures = self.guards.failures
        with failures.recorded(METRICS_LOG):
            append_row(self.run.output_dir, row)
        with failures.recorded("the tracker's log"):
            self.tracker.log(row, self.step)

    def _log(self, means: dict[str, float], progress: Progress) -> None:
        parts = [f"step {int(means['step'])}/{self.run.config.steps}", f"loss {means['loss']:.4f}"]
        parts += [f"{k} {means[k]:.4f}" for k in sorted(means) if k.endswith("_loss")]
        parts.append(f"lr {means['lr']:.2e}")
        if "grad_norm" in means:
            parts.append(f"grad_norm {means['grad_norm']:.3f}")
        if means["skipped_steps"]:
            parts.append(f"skipped {int(means['skipped_steps'])}")
        parts.append(f"samples/s {means['samples_per_s']:.1f}")
        if "model_tflops" in means:
            parts.append(f"model_tflops {means['model_tflops']:.3g}")
        if "mfu" in means:
            parts.append(f"mfu {100 * means['mfu']:.3g}%")
        parts.append(f"data_s {means['data_s']:.3f}")
        parts.append(f"eta {progress.eta(int(means['step']))}")
        logger.info(" | ".join(parts))
