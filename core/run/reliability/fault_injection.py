"""``LEROBOT_KIT_FAULT``: make one rank die, hang or compute NaN at a chosen point of a chosen step.

The crash-safety claims are checked by failing real processes at real points of the loop:
the tests and the fault-injection benchmark start the installed trainer under ``torchrun``
with this variable set, so it lives in the package, inert unless set. The variable's keys,
the points and actions, and what ``LEROBOT_KIT_FAULT_LOG`` records are in
docs/fault-injection.md. The points are torch hooks on the model and the optimizer and a
thread that watches the checkpoint folder, so the loop has no branch for it.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lerobot_kit.core.errors import ConfigError
from lerobot_kit.core.layout import atomic

if TYPE_CHECKING:
    from lerobot_kit.core.run.components import RunComponents

ENV = "LEROBOT_KIT_FAULT"
LOG_ENV = "LEROBOT_KIT_FAULT_LOG"
POINTS = ("forward", "backward", "optimizer", "sync_save", "async_save")
SAVE_POINTS = ("sync_save", "async_save")
ACTIONS = ("kill", "hang", "nan")


@dataclass(frozen=True)
class Fault:
    point: str
    step: int
    rank: int = 0
    action: str = "kill"
    attempt: int = 0
    count: int = 1

    @classmethod
    def parse(cls, text: str) -> Fault:
        fields: dict[str, Any] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, eq, value = part.partition("=")
            if not eq or key not in cls.__dataclass_fields__:
                keys = ", ".join(cls.__dataclass_fields__)
                raise ConfigError(f"{ENV}={text!r}: {part!r} is not key=value with a key among {keys}")
            fields[key] = value if key in ("point", "action") else _int(text, key, value)
        if "point" not in fields or "step" not in fields:
            raise ConfigError(f"{ENV}={text!r}: point and step are required (e.g. point=backward,step=25,rank=1)")
        fault = cls(**fields)
        if fault.point not in POINTS or fault.action not in ACTIONS:
            raise ConfigError(
                f"{ENV}={text!r}: point is one of {', '.join(POINTS)}; action one of {', '.join(ACTIONS)}"
            )
        if fault.point in SAVE_POINTS and fault.action != "kill":
            raise ConfigError(f"{ENV}={text!r}: a save point only supports action=kill")
        return fault


def _int(text: str, key: str, value: str) -> int:
    try:
        return int(value)
    except ValueError as exc:
        raise ConfigError(f"{ENV}={text!r}: {key} must be an integer") from exc


class FaultInjector:
    """Arms the hooks of one fault on this rank; ``step_started`` keeps it told of the step."""

    def __init__(self, fault: Fault, run: RunComponents) -> None:
        config = run.config
        if fault.point in SAVE_POINTS and not (config.save_checkpoint and fault.step % config.save_freq == 0):
            raise ConfigError(f"{ENV}: step {fault.step} is not a checkpoint step (--save_freq={config.save_freq})")
        if fault.point == "async_save" and not (config.async_checkpoint and run.dims.sharded):
            raise ConfigError(f"{ENV}: point=async_save needs --async_checkpoint=true on a sharded run")
        self.fault = fault
        self.run = run
        self.step = 0
        model = run.parallel.model
        if fault.point == "forward" and fault.action == "nan":
            model.register_forward_pre_hook(self._poison_batch)
        elif fault.point == "forward":
            model.register_forward_pre_hook(lambda module, args: self._at_step("model forward"))
        elif fault.point == "backward":
            _middle_module(run).register_forward_hook(self._hook_backward)
        elif fault.point == "optimizer" and fault.action == "nan":
            run.optimizer.register_step_post_hook(self._poison_weight)
        elif fault.point == "optimizer":
            run.optimizer.register_step_pre_hook(lambda optimizer, args, kwargs: self._at_step("optimizer.step"))

    def step_started(self, step: int) -> None:
        self.step = step

    def step_finished(self, step: int) -> None:
        if self.fault.point in SAVE_POINTS and step == self.fault.step:
            threading.Thread(target=self._watch_save, name="lerobot-fault-injection", daemon=True).start()

    def _at_step(self, where: str) -> None:
        if self._armed():
            self._fire(where)

    def _armed(self) -> bool:
        """Whether the current step is one the fault fires at."""
        return self.fault.step <= self.step < self.fault.step + self.fault.count

    def _poison_batch(self, module: Any, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """A NaN in the first action value of the batch the model is about to see."""
        from lerobot_kit.core.data.dataset import ACTION_KEY

        if not self._armed() or not args or ACTION_KEY not in args[0]:
            return None
        self._fire("model forward: a NaN in the batch's action")
        batch = dict(args[0])
        action = batch[ACTION_KEY].clone()
        action.view(-1)[0] = float("nan")
        batch[ACTION_KEY] = action
        return (batch, *args[1:])

    def _poison_weight(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """A NaN in the first value of the first weight this rank holds, after the update."""
        import torch
        from torch.distributed.tensor import DTensor

        if not self._armed():
            return
        self._fire("after optimizer.step: a NaN in a weight")
        params = [p for group in optimizer.param_groups for p in group["params"]]
        local = next(t for t in (p.to_local() if isinstance(p, DTensor) else p for p in params) if t.numel())
        with torch.no_grad():
            local.view(-1)[0] = float("nan")

    def _hook_backward(self, module: Any, args: Any, output: Any) -> None:
        import torch

        if not self._armed() or not torch.is_grad_enabled():
            return
        tensor = output if isinstance(output, torch.Tensor) else next(
            (t for t in (output if isinstance(output, (tuple, list)) else ()) if isinstance(t, torch.Tensor)), None
        )
        if tensor is not None and tensor.requires_grad:
            tensor.register_hook(self._nan_gradient if self.fault.action == "nan" else
                                 lambda grad: self._fire("backward through the middle of the model"))

    def _nan_gradient(self, grad: Any) -> Any:
        self._fire("backward through the middle of the model: NaN gradients")
        return grad * float("nan")

    def _watch_save(self) -> None:
        """Polls the checkpoint's temporary folder until the chosen moment of its write."""
        tmp = atomic.temp_step_dir(self.run.output_dir, self.fault.step)
        while True:
            written = _has_file(tmp)
            if self.fault.point == "sync_save" and written:
                self._fire(f"{tmp.name} being written, training blocked")
            if self.fault.point == "async_save" and self.step > self.fault.step:
                if written:
                    self._fire(f"{tmp.name} written in the background during step {self.step}")
                if not tmp.exists():
                    self._fire(f"step {self.step}, after the background write of step {self.fault.step} was published")
            time.sleep(0.0005)

    def _fire(self, observed: str) -> None:
        record = {**asdict(self.fault), "observed": observed, "pid": os.getpid()}
        log = os.environ.get(LOG_ENV)
        if log:
            with open(log, "a") as handle:
                handle.write(json.dumps(record) + "\n")
                handle.flush()
                os.fsync(handle.fileno())
        if self.fault.action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.fault.action == "hang":
            threading.Event().wait()  # forever, as a deadlocked rank would


def _middle_module(run: RunComponents) -> Any:
    """The wrap unit in the middle of the model (else the model): killing when autograd
    reaches it leaves some gradients reduced and others not."""
    paths = run.parallel.wrap.paths
    model = run.parallel.model
    return model.get_submodule(paths[len(paths) // 2]) if paths else model


def _has_file(folder: Path) -> bool:
    try:
        return any(files for _, _, files in os.walk(folder))
    except OSError:
        return False


def from_env(run: RunComponents) -> list[FaultInjector]:
    """The faults ``LEROBOT_KIT_FAULT`` asks of this rank on this attempt, armed."""
    faults = [Fault.parse(text) for text in os.environ.get(ENV, "").split(";") if text.strip()]
    return [FaultInjector(f, run) for f in faults if f.rank == run.ctx.rank and f.attempt == run.ctx.restart_count]
