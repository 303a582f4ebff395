"""A model in its parallel layout, and what the training loop does through it.

The loop never asks which layout it runs: ``no_sync`` for accumulation micro-steps,
``finish_grad_sync`` after a syncing backward, ``clip_grad_norm`` for the global norm and
``param_counts`` for the banner behave right for single, DDP, FSDP and HSDP alike.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from lerobot_kit.core.parallel.dims import ParallelDims
from lerobot_kit.core.parallel.wrap_units import WrapUnits


def has_meta(model: nn.Module) -> bool:
    """Whether any parameter or buffer is still on the meta device (shapes only, no storage)."""
    return any(t.is_meta for t in (*model.parameters(), *model.buffers()))


@dataclass
class Parallelized:
    module: nn.Module  # call forward on this (the DDP wrapper, or the fully_shard'ed model itself)
    model: nn.Module  # the unwrapped model: state dicts, select_action, init_weights
    dims: ParallelDims
    wrap: WrapUnits  # the run's units: sharded, checkpointed and compiled one at a time
    device: torch.device  # where compute happens
    init_device: torch.device  # where a meta-built model's (sharded) storage belongs: CPU under cpu_offload
    mesh: DeviceMesh | None = None

    @property
    def ignored_params(self) -> list[nn.Parameter]:
        """Looked up on every call: ``to_empty`` from meta replaces plain Parameter objects
        (DTensor ones are swapped in place), so a list taken earlier would go stale."""
        return self.wrap.ignored_params(self.model)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulation micro-steps: gradients stay local until a step outside this context."""
        if self.dims.layout == "ddp":
            with self.module.no_sync():  # type: ignore[operator]
                yield
        elif self.dims.sharded:
            self.module.set_requires_gradient_sync(False)  # type: ignore[operator]
            try:
                yield
            finally:
                self.module.set_requires_gradient_sync(True)  # type: ignore[operator]
        else:
            yield

    def to_empty(self) -> None:
        """Allocate storage for a meta-built model: shards on ``init_device``, ignored modules on ``device``."""
        self.model.to_empty(device=self.init_device)
        if self.init_device != self.device:
            for path in self.wrap.ignored_modules:
                self.model.get_submodule(path).to(self.device)

    def balance_loss(self, loss: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """``loss`` scaled by this rank's share of ``weight`` summed over every rank (see
        ``Policy.loss_weight``): averaged over data-parallel ranks, as gradients are, the
        scaled losses give the loss of one process on the whole global batch.

        Summed over the whole world, which is the data-parallel group (every mesh axis is
        data-parallel). One scalar all-reduce per micro-batch; a rank whose batch has no
        valid entry gets 0.
        """
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return loss
        weight = weight.detach().to(device=self.device, dtype=torch.float64).reshape(())
        total = weight.clone()
        dist.all_reduce(total)
        share = weight * dist.get_world_size() / total.clamp_min(torch.finfo(torch.float64).tiny)
        return loss * share.to(loss.dtype)

    def finish_grad_sync(self) -> None:
        """After the backward of a syncing step: average ignored modules' gradients over every
        data-parallel rank (FSDP does not reduce them). No-op when nothing is ignored."""
        ignored = self.ignored_params
        if not ignored or not dist.is_initialized():
            return
        world = self.dims.dp_world_size
        # A gradient that exists on some rank must exist (averaged) on all, or they diverge.
        present = torch.tensor([p.grad is not None for p in ignored], dtype=torch.float32, device=self.device)
        dist.all_reduce(present)
        by_dtype: dict[torch.dtype, list[nn.Parameter]] = defaultdict(list)
        for param, seen in zip(ignored, present.tolist()):
            if seen:
                by_dtype[param.dtype].append(param)
        with torch.no_grad():
            for params in by_dtype.values():
                flat = torch.cat(
                    [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
                ).to(self.device)
                dist.all_reduce(flat)
                flat /= world
                offset = 0
                for param in params:
                    chunk = flat[offset : offset + param.numel()].view_as(param).to(param.device)
                    offset += param.numel()
                    if param.grad is None:
                        param.grad = chunk.clone()
                    else:
                        param.grad.copy_(chunk)

    def clip_grad_norm(self, max_norm: float | None) -> float:
        """The global L2 norm of all gradients (sharded and plain), clipped to ``max_norm``
        when given. Returns the same float on every rank, so ranks take the same decisions.

        Sharded (DTensor) gradients: each shard's squared norm is summed over one shard
        group only (HSDP replicas hold identical shards). Plain gradients (DDP, ignored
        modules) are already identical on every rank.
        """
        sharded: list[torch.Tensor] = []
        plain: list[torch.Tensor] = []
        for param in self.model.parameters():
            grad = param.grad
            if grad is None:
                continue
            if isinstance(grad, DTensor):
                sharded.append(grad.to_local())
            else:
                plain.append(grad)
        sharded_sq, plain_sq = self._squared_norm(sharded), self._squared_norm(plain)
        grads = sharded + plain
        if self.dims.sharded:
            replica_axis = self.dims.shard_replica_axis
            if self.mesh is not None and replica_axis is not None and self.mesh.get_local_rank(replica_axis) != 0:
                sharded_sq.zero_()
            dist.all_reduce(sharded_sq)
        total = math.sqrt(float(sharded_sq + plain_sq))
        if max_norm is not None and math.isfinite(total):
            coef = max_norm / (total + 1e-6)
            if coef < 1.0:
                with torch.no_grad():
                    torch._foreach_mul_(grads, coef)
        return total

    def _squared_norm(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """Sum of squared L2 norms: one foreach norm per (device, dtype) group, in at least
        fp32, combined in fp64. Copying every gradient to fp64 instead cost ~7% of an ACT
        step on CPU (benchmarks/loop_overhead.py)."""
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = defaultdict(list)
        for tensor in tensors:
            groups[(tensor.device, tensor.dtype)].append(tensor)
        for (_, dtype), group in groups.items():
            norm_dtype = dtype if dtype in (torch.float32, torch.float64) else torch.float32
            norms = torch._foreach_norm(group, 2, dtype=norm_dtype)
            total += torch.stack(norms).to(self.device, torch.float64).square().sum()
        return total

    def param_counts(self) -> tuple[int, int]:
        """(parameters of the whole model, parameters this rank stores) — the banner's numbers."""
        total = local = 0
        for param in self.model.parameters():
            total += param.numel()
            local += param.to_local().numel() if isinstance(param, DTensor) else param.numel()
        return total, local
