"""Mixed precision: autocast dtype, FSDP2's MixedPrecisionPolicy, and the fp16 loss scaler.

``--accelerator.mixed_precision`` drives all three. The trainer should autocast in every
layout: under FSDP2 too it keeps numerically sensitive ops (softmax, the loss) in fp32,
and it lets unsharded ``ignored_modules``, which stay fp32, consume low-precision
activations.

FSDP2 policy. Derived from ``mixed_precision``: bf16/fp16 compute and
all-gather (``param_dtype``) with gradient reduction in fp32 (``reduce_dtype``), so
averaging over many ranks does not lose precision. Once any
``--accelerator.fsdp.mixed_precision_policy.*`` field is set, the policy is built from
those fields alone.

Unset ``reduce_dtype`` on the installed torch (2.13): gradients are reduced in
``param_dtype`` — FSDP2's ``foreach_reduce`` uses ``reduce_dtype or grad_dtype`` and the
gradients are computed in ``param_dtype``. (From torch 2.15 an unset ``reduce_dtype``
follows the parameters' own dtype instead.) The sharded gradient
the optimizer sees is in the parameters' own dtype either way; only the precision of the
sum differs. ``tests/integration/test_parallelize_ranks.py`` checks this on real processes: with
``param_dtype=bfloat16`` and no ``reduce_dtype`` every reduced gradient value is exactly
representable in bf16, with ``reduce_dtype=float32`` they are not; on torch >= 2.15 the
test fails and points back here.

The loss scaler is our own rather than ``torch.amp.GradScaler``: the torch one feeds
gradients to a fused kernel together with plain tensors, which DTensor (sharded)
gradients reject, and it decides to skip a step from the local gradients only. Here the
overflow flag is all-reduced over the data-parallel world, so every rank skips (or
takes) the same steps and the replicas never diverge.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.distributed.tensor import DTensor

from lerobot_kit.core.config.schema import AcceleratorConfig
from lerobot_kit.core.distributed.process_group import DistContext
from lerobot_kit.core.errors import ConfigError
from lerobot_kit.core.parallel.dims import ParallelDims

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_MP_FLAG = "--accelerator.fsdp.mixed_precision_policy"


def autocast_dtype(accel: AcceleratorConfig) -> torch.dtype | None:
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(accel.mixed_precision)


def build_mp_policy(accel: AcceleratorConfig) -> MixedPrecisionPolicy | None:
    """The policy applied to every FSDP unit; ``None`` means full precision."""
    fields = accel.fsdp.mixed_precision_policy
    if fields.is_set():
        if fields.param_dtype is None:
            raise ConfigError(
                f"{_MP_FLAG}.* fields are set but {_MP_FLAG}.param_dtype is not: once any field is set the "
                f"policy is built from these fields alone, so set {_MP_FLAG}.param_dtype too (e.g. bfloat16)"
            )
        fp16 = [
            name
            for name in ("param_dtype", "reduce_dtype", "output_dtype")
            if getattr(fields, name) == "float16"
        ]
        if fp16 and accel.mixed_precision != "fp16":
            raise ConfigError(
                f"{', '.join(f'{_MP_FLAG}.{n}=float16' for n in fp16)} needs --accelerator.mixed_precision=fp16 "
                f"(got {accel.mixed_precision!r}): fp16 training needs the loss scaler that only fp16 builds"
            )
        return MixedPrecisionPolicy(
            param_dtype=_DTYPES[fields.param_dtype],
            reduce_dtype=_DTYPES[fields.reduce_dtype] if fields.reduce_dtype else None,
            output_dtype=_DTYPES[fields.output_dtype] if fields.output_dtype else None,
            cast_forward_inputs=True if fields.cast_forward_inputs is None else fields.cast_forward_inputs,
        )
    compute = autocast_dtype(accel)
    if compute is None:
        return None
    return MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)


class LossScaler:
    """Dynamic loss scaling for fp16, with the same interface as ``torch.amp.GradScaler``.

    Use per optimizer update: ``scale(loss).backward()`` (each micro-batch), then
    ``unscale_(opt)`` before clipping, ``step(opt)`` (skipped on overflow anywhere),
    ``update()``.
    """

    def __init__(
        self,
        device: torch.device,
        reduce: bool,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
    ) -> None:
        self._device = device
        self._reduce = reduce
        self._scale = init_scale
        self._growth_factor = growth_factor
        self._backoff_factor = backoff_factor
        self._growth_interval = growth_interval
        self._growth_tracker = 0
        self._found_inf: bool | None = None  # None: not unscaled since the last update()

    def get_scale(self) -> float:
        return self._scale

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self._scale

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide every gradient by the scale and agree, across ranks, on any overflow."""
        if self._found_inf is not None:
            raise RuntimeError("unscale_() was already called since the last update()")
        groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = defaultdict(list)
        for group in optimizer.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    grad = param.grad.to_local() if isinstance(param.grad, DTensor) else param.grad
                    groups[(grad.device, grad.dtype)].append(grad)
        found = torch.zeros(1, dtype=torch.float32, device=self._device)
        with torch.no_grad():
            for (device, _), grads in groups.items():
                found_here = torch.zeros(1, dtype=torch.float32, device=device)
                inv_scale = torch.full((1,), 1.0 / self._scale, dtype=torch.float32, device=device)
                torch._amp_foreach_non_finite_check_and_unscale_(grads, found_here, inv_scale)
                found += found_here.to(self._device)
        if self._reduce:
            dist.all_reduce(found, op=dist.ReduceOp.MAX)
        self._found_inf = bool(found.item() > 0)

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """``optimizer.step()`` unless some rank saw inf/NaN gradients; True if it stepped."""
        if self._found_inf is None:
            self.unscale_(optimizer)
        if self._found_inf:
            return False
        optimizer.step()
        return True

    def update(self) -> None:
        if self._found_inf is None:
            raise RuntimeError("update() called without unscale_()/step() since the last update()")
        if self._found_inf:
            self._scale *= self._backoff_factor
            self._growth_tracker = 0
        else:
            self._growth_tracker += 1
            if self._growth_tracker == self._growth_interval:
                self._scale *= self._growth_factor
                self._growth_tracker = 0
        self._found_inf = None

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable (``scaler_state.json``)."""
        return {
            "scale": self._scale,
            "growth_factor": self._growth_factor,
            "backoff_factor": self._backoff_factor,
            "growth_interval": self._growth_interval,
            "growth_tracker": self._growth_tracker,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._scale = float(state["scale"])
        self._growth_factor = float(state["growth_factor"])
        self._backoff_factor = float(state["backoff_factor"])
        self._growth_interval = int(state["growth_interval"])
        self._growth_tracker = int(state["growth_tracker"])


def build_grad_scaler(accel: AcceleratorConfig, dims: ParallelDims, ctx: DistContext) -> LossScaler | None:
    if accel.mixed_precision != "fp16":
        return None
    return LossScaler(device=ctx.device, reduce=dims.dp_world_size > 1)
