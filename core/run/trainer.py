"""The fixed training loop; it owns no policy-, format- or launcher-specific code.

One loop step = one micro-batch per data-parallel worker. Gradients are
synchronised only on the last micro-batch of each accumulation window; the LR
scheduler steps once per loop step; metrics are averaged across ranks before
the main process logs them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch

from lerobot_kit.core.checkpoint.saver import CheckpointSaver
from lerobot_kit.core.run.components import RunComponents
from lerobot_kit.core.data.sampler import DataPosition, ResumableBatchSampler
from lerobot_kit.core.distributed.process_group import all_reduce_mean
from lerobot_kit.core.parallel.precision import autocast_dtype
from lerobot_kit.core.run.guards import RunGuards
from lerobot_kit.core.run.progress import Progress
from lerobot_kit.core.run.tracking import Tracker

logger = logging.getLogger("lerobot_kit")


@dataclass
class TrainResult:
    steps_done: int
    logged: list[dict[str, float]] = field(default_factory=list)
    last_checkpoint: str | None = None
    stopped_by: str | None = None  # the signal the ranks stopped on (core.run.preemption), else None


class Trainer:
    def __init__(
        self,
        run: RunComponents,
        batches: Iterator[dict[str, torch.Tensor]],
        sampler: ResumableBatchSampler,
        start_step: int,
        position: DataPosition,
        tracker: Tracker,
        step_hooks: Sequence[Callable[[int], None]] = (),
    ) -> None:
        self.run = run
        self.tracker = tracker
        self.batches = batches
        self.sampler = sampler
        self.step = start_step
        self.position = position
        config = run.config
        self.accumulation = config.accelerator.gradient_accumulation.steps
        self.amp_dtype = autocast_dtype(config.accelerator)
        self.global_batch = config.batch_size * run.dims.dp_world_size
        self.saver = CheckpointSaver(run)
        self.guards = RunGuards(run)  # stop on signals, hang watchdog: around the loop, not in it
        # Called with the step number after each step, its log line and its checkpoint; each
        # hook decides whether the step is its own (evaluation: core.eval.training).
        self.step_hooks = list(step_hooks)

    def _is_sync_step(self, step: int) -> bool:
        """Last micro-batch of an accumulation window, or the very last step of the run."""
        return (step + 1) % self.accumulation == 0 or step + 1 == self.run.config.steps

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.run.ctx.device.type, dtype=self.amp_dtype)

    def _train_step(
        self, batch: dict[str, torch.Tensor], sync: bool
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor], float | None]:
        run = self.run
        parallel, scaler, optimizer = run.parallel, run.scaler, run.optimizer
        batch = {k: v.to(run.ctx.device, non_blocking=True) for k, v in batch.items()}
        batch = run.preprocessor(batch)
        with contextlib.nullcontext() if sync else parallel.no_sync():
            with self._autocast():
                loss, logs = parallel.module(batch)
            scaled = loss / self.accumulation
            (scaler.scale(scaled) if scaler is not None else scaled).backward()
        grad_norm = None
        if sync:
            parallel.finish_grad_sync()
            if scaler is not None:
                scaler.unscale_(optimizer)
            grad_norm = parallel.clip_grad_norm(run.config.optimizer.grad_clip_norm)
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        run.scheduler.step()
        # Metrics stay tensors until a log step: no device sync on every step.
        return loss.detach().float(), {k: v.detach().float() for k, v in logs.items()}, grad_norm

    def fit(self) -> TrainResult:
        run, config = self.run, self.run.config
        result = TrainResult(steps_done=self.step)
        progress = Progress(config.steps, self.step, enabled=run.ctx.is_main)
        window: dict[str, torch.Tensor] = {}
        window_steps, window_start, grad_norm, data_wait = 0, time.perf_counter(), None, 0.0
        run.parallel.module.train()
        self.guards.start()
        while self.step < config.steps and not self.guards.stop_now():
            self.guards.step_started(self.step + 1)
            sync = self._is_sync_step(self.step)
            wait_start = time.perf_counter()
            batch = next(self.batches)
            data_wait += time.perf_counter() - wait_start  # time the step waited for its batch (data_s)
            loss, logs, norm = self._train_step(batch, sync)
            grad_norm = norm if norm is not None else grad_norm
            self.step += 1
            self.guards.step_finished(self.step)
            self.position = self.sampler.advance(self.position, 1)
            for key, value in {"loss": loss, **logs}.items():
                window[key] = window[key] + value if key in window else value
            window_steps += 1
            if self.step % config.log_freq == 0 or self.step == config.steps:
                local = {k: v.item() / window_steps for k, v in window.items()}
                means = all_reduce_mean(run.ctx, {**local, "data_s": data_wait / window_steps})
                elapsed = time.perf_counter() - window_start
                means["samples_per_s"] = window_steps * self.global_batch / elapsed if elapsed > 0 else 0.0
                means["lr"] = run.optimizer.param_groups[0]["lr"]
                if grad_norm is not None:
                    means["grad_norm"] = grad_norm
                means["step"] = self.step
                result.logged.append(means)
                if run.ctx.is_main:
                    progress.clear()
                    self._log(means, progress)
                    self._append_metrics(means)
                    self.tracker.log(means, self.step)
                window, window_steps, window_start, data_wait = {}, 0, time.perf_counter(), 0.0
            progress.update(self.step)
            self.saver.poll()
            if config.save_checkpoint and (self.step % config.save_freq == 0 or self.step == config.steps):
                self.saver.save(self.step, self.position)
            hooks_start = time.perf_counter()
            for hook in self.step_hooks:
                hook(self.step)
            window_start += time.perf_counter() - hooks_start  # their time is not training throughput
        stopped = self.guards.stopped_by
        if stopped is not None and config.save_checkpoint and self.step % config.save_freq:
            self.saver.save(self.step, self.position)  # where every rank agreed to stop
        last = self.saver.finish()
        self.guards.finish()
        result.stopped_by = stopped.name if stopped is not None else None
        result.last_checkpoint = str(last) if last else None
        progress.clear()
        result.steps_done = self.step
        return result

    def _append_metrics(self, means: dict[str, float]) -> None:
        """``logs/metrics.jsonl``: the logged metrics, one JSON object per log step, for scripts."""
        path = self.run.output_dir / "logs" / "metrics.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as handle:
            handle.write(json.dumps(means) + "\n")

    def _log(self, means: dict[str, float], progress: Progress) -> None:
        parts = [f"step {int(means['step'])}/{self.run.config.steps}", f"loss {means['loss']:.4f}"]
        parts += [f"{k} {means[k]:.4f}" for k in sorted(means) if k.endswith("_loss")]
        parts.append(f"lr {means['lr']:.2e}")
        if "grad_norm" in means:
            parts.append(f"grad_norm {means['grad_norm']:.3f}")
        parts.append(f"samples/s {means['samples_per_s']:.1f}")
        parts.append(f"data_s {means['data_s']:.3f}")
        parts.append(f"eta {progress.eta(int(means['step']))}")
        logger.info(" | ".join(parts))
