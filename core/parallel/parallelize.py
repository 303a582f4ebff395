"""Apply the data-parallel layout to a model: nothing, DDP, or FSDP2 (FSDP / HSDP).

Sharded layouts shard each *wrap unit* with ``fully_shard`` (bottom-up), then the root,
so one unit's parameters are gathered at a time. Wrap units come from, in order:
``--accelerator.fsdp.wrap_modules`` > the policy's ``_fsdp_wrap_modules`` >
``--accelerator.fsdp.min_num_params``; with none of them a sharded run fails at start,
because sharding only the root would gather the whole model at once and save nothing.

``--accelerator.fsdp.ignored_modules`` (a regex, full match on module paths) keeps whole
modules unsharded and out of FSDP's reductions; ``Parallelized.finish_grad_sync``
averages their gradients over the data-parallel world instead, so they never drift.

Meta-device construction (no rank ever holds the whole model): build the model under
``torch.device("meta")``, call ``parallelize``, then ``Parallelized.to_empty()`` (the same
as ``model.to_empty(device=p.device)`` unless ``cpu_offload`` puts shards on the CPU) and
``model.init_weights()`` — or load weights. Build the optimizer only after that:
``to_empty`` from meta replaces the plain (non-DTensor) Parameter objects. Seed
identically on every rank before initialising: on CUDA, DTensor random ops draw from a
generator synchronised from rank 0; on CPU each rank draws its shard from its own
generator, so the initial values depend on the layout (identical replicas, but not the
numbers a one-process run would draw). For DDP, ``parallelize`` allocates the storage
itself (DDP cannot wrap meta tensors) and the caller's initialisation fills it; DDP does
not re-broadcast, so the identical seed is what keeps the replicas equal.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from lerobot_kit.core.config.schema import AcceleratorConfig, FSDPConfig
from lerobot_kit.core.errors import ConfigError
from lerobot_kit.core.parallel.precision import build_mp_policy
from lerobot_kit.core.parallel.dims import ParallelDims

# Containers have no forward, so FSDP's pre-forward gather would never run for them.
_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.ParameterList, nn.ParameterDict)


@dataclass
class Parallelized:
    module: nn.Module  # call forward on this (the DDP wrapper, or the fully_shard'ed model itself)
    model: nn.Module  # the unwrapped model: state dicts, select_action, init_weights
    dims: ParallelDims
    wrap_units: list[str]  # module paths sharded as FSDP units (empty unless sharded)
    wrap_source: str  # "flag" | "policy" | "min_num_params" | "" (not sharded)
    device: torch.device  # where compute happens
    init_device: torch.device  # where a meta-built model's (sharded) storage belongs: CPU under cpu_offload
    mesh: DeviceMesh | None = None
    ignored_modules: list[str] = field(default_factory=list)  # paths kept unsharded (outermost matches)

    @property
    def ignored_params(self) -> list[nn.Parameter]:
        """Looked up on every call: ``to_empty`` from meta replaces plain Parameter objects
        (DTensor ones are swapped in place), so a list taken earlier would go stale."""
        params: dict[int, nn.Parameter] = {}
        for path in self.ignored_modules:
            for param in self.model.get_submodule(path).parameters():
                params[id(param)] = param
        return list(params.values())

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
            for path in self.ignored_modules:
                self.model.get_submodule(path).to(self.device)

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
            if self.mesh is not None and self.dims.layout == "hsdp" and self.mesh.get_local_rank("dp_replicate") != 0:
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


def _class_names(model: nn.Module) -> list[str]:
    return sorted({type(m).__name__ for m in model.modules()})


def _units_by_class(model: nn.Module, names: list[str], where: str) -> list[str]:
    known = set(_class_names(model))
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(
            f"{where} names {', '.join(repr(n) for n in unknown)}, which {'is' if len(unknown) == 1 else 'are'} "
            f"not a module class of this model; its module classes are: {', '.join(_class_names(model))}"
        )
    containers = sorted(
        {type(m).__name__ for m in model.modules() if type(m).__name__ in names and isinstance(m, _CONTAINERS)}
    )
    if containers:
        raise ConfigError(
            f"{where} names {', '.join(containers)}: a container has no forward of its own, so it cannot be an FSDP "
            "unit; name the class of the layers inside it instead"
        )
    paths = [path for path, m in model.named_modules() if path and type(m).__name__ in names]
    if not paths:
        raise ConfigError(
            f"{where} matches only the root module ({type(model).__name__}), which is always sharded last; "
            "name the classes of its layers instead"
        )
    return paths


def _units_by_size(model: nn.Module, min_num_params: int) -> list[str]:
    """FSDP1's size-based rule: bottom-up, a module becomes a unit once it holds at least
    ``min_num_params`` parameters that no unit below it already took."""
    chosen: set[str] = set()

    def free_params(path: str, module: nn.Module) -> dict[int, int]:
        free = {id(p): p.numel() for p in module.parameters(recurse=False)}
        for name, child in module.named_children():
            free.update(free_params(f"{path}.{name}" if path else name, child))
        if path and not isinstance(module, _CONTAINERS) and sum(free.values()) >= min_num_params:
            chosen.add(path)
            return {}
        return free

    free_params("", model)
    if not chosen:
        largest = max(
            ((sum(p.numel() for p in m.parameters()), path) for path, m in model.named_modules() if path),
            default=(0, "-"),
        )
        raise ConfigError(
            f"--accelerator.fsdp.min_num_params={min_num_params} selects no submodule (the largest, "
            f"{largest[1]!r}, has {largest[0]} parameters): lower it, or name classes with "
            "--accelerator.fsdp.wrap_modules"
        )
    return [path for path, _ in model.named_modules() if path in chosen]


def resolve_wrap_units(model: nn.Module, fsdp: FSDPConfig, declared: list[str] | None) -> tuple[list[str], str]:
    """Module paths to shard as units (model order) and where the choice came from."""
    if fsdp.wrap_modules:
        return _units_by_class(model, fsdp.wrap_modules, "--accelerator.fsdp.wrap_modules"), "flag"
    if declared:
        where = f"the policy's _fsdp_wrap_modules ({type(model).__name__})"
        return _units_by_class(model, list(declared), where), "policy"
    if fsdp.min_num_params:
        return _units_by_size(model, fsdp.min_num_params), "min_num_params"
    raise ConfigError(
        f"a sharded run needs FSDP wrap units, but the policy ({type(model).__name__}) declares no "
        "_fsdp_wrap_modules and neither --accelerator.fsdp.wrap_modules='[\"ClassName\"]' nor "
        "--accelerator.fsdp.min_num_params=N is set: set one of them (sharding only the root would "
        f"save no memory). Module classes of this model: {', '.join(_class_names(model))}"
    )


def unit_of(param_path: str, units: list[str]) -> str:
    """The innermost unit holding ``param_path``; "" for the root."""
    best = ""
    for unit in units:
        if param_path.startswith(unit + ".") and len(unit) > len(best):
            best = unit
    return best


def check_tied_weights(
    model: nn.Module, unit_paths: list[str], ignored_params: set[nn.Parameter] | frozenset = frozenset()
) -> None:
    """Refuse one parameter reachable from two FSDP units (or a unit and the root): each
    unit gathers and frees its own parameters, so a shared one would be used while
    sharded. Ignored parameters are never sharded, so they may be shared."""
    seen: dict[int, tuple[str, str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if param in ignored_params:
            continue
        unit = unit_of(name, unit_paths)
        if id(param) not in seen:
            seen[id(param)] = (name, unit)
            continue
        first_name, first_unit = seen[id(param)]
        if first_unit != unit:

            def where(param_name: str, unit_path: str) -> str:
                module = param_name.rpartition(".")[0] or "<root>"
                inside = f"FSDP unit {unit_path!r}" if unit_path else "the root, outside every wrap unit"
                return f"module {module!r} (in {inside})"

            raise ConfigError(
                f"tied weights cannot be split across FSDP units: parameter {first_name!r} of "
                f"{where(first_name, first_unit)} is the same tensor as {name!r} of {where(name, unit)}; "
                "choose wrap units that keep both modules in one unit, or untie the weights"
            )


def _ignored(model: nn.Module, pattern: str | None) -> tuple[list[str], list[nn.Parameter]]:
    """Outermost module paths fully matching ``pattern``, and all their parameters."""
    if not pattern:
        return [], []
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise ConfigError(f"--accelerator.fsdp.ignored_modules={pattern!r} is not a valid regex: {exc}") from exc
    paths = [path for path, _ in model.named_modules() if path and regex.fullmatch(path)]
    if not paths:
        examples = [path for path, _ in model.named_modules() if path][:6]
        raise ConfigError(
            f"--accelerator.fsdp.ignored_modules={pattern!r} matches no module path (it must match a whole path; "
            f"paths look like {', '.join(repr(p) for p in examples)}; for PEFT models start it with '.*')"
        )
    outermost = [p for p in paths if not any(p.startswith(q + ".") for q in paths)]
    params: dict[int, nn.Parameter] = {}
    for path in outermost:
        for param in model.get_submodule(path).parameters():
            params[id(param)] = param
    return outermost, list(params.values())


def effective_wrap_units(
    model: nn.Module, fsdp: FSDPConfig, declared: list[str] | None
) -> tuple[list[str], str, list[str], set[nn.Parameter]]:
    """The wrap units ``parallelize`` shards, their source, the ignored module paths and
    the ignored parameters. One function for the run, ``lerobot plan`` and PEFT's dtype
    check, so each of them refuses exactly what the run would.

    Units wholly inside ignored modules are dropped (they would hold nothing to shard);
    refuses a configuration that leaves no unit, or that ties weights across units.
    """
    units, source = resolve_wrap_units(model, fsdp, declared)
    ignored_paths, ignored = _ignored(model, fsdp.ignored_modules)
    ignored_set = set(ignored)
    units = [u for u in units if any(p not in ignored_set for p in model.get_submodule(u).parameters())]
    if not units:
        raise ConfigError(
            f"every FSDP wrap unit lies inside --accelerator.fsdp.ignored_modules={fsdp.ignored_modules!r}, "
            "so nothing would be sharded: narrow the regex"
        )
    check_tied_weights(model, units, ignored_set)
    return units, source, ignored_paths, ignored_set


def _has_meta(model: nn.Module) -> bool:
    return any(t.is_meta for t in (*model.parameters(), *model.buffers()))


def _replicate(model: nn.Module, dims: ParallelDims, device: torch.device) -> Parallelized:
    if dims.layout == "ddp":
        # DDP broadcasts and buckets real storage; a meta model gets it here, values from the caller's init.
        if _has_meta(model):
            model.to_empty(device=device)
        else:
            model.to(device)
        module: nn.Module = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    else:
        if not _has_meta(model):
            model.to(device)
        module = model
    return Parallelized(module, model, dims, [], "", device, device)


def parallelize(
    model: nn.Module,
    dims: ParallelDims,
    mesh: DeviceMesh | None,
    accel: AcceleratorConfig,
    declared_wrap_modules: list[str] | None,
    device: torch.device,
) -> Parallelized:
    if not dims.sharded:
        return _replicate(model, dims, device)
    if mesh is None:
        raise ValueError(f"layout {dims.layout!r} needs the mesh from ParallelDims.build_mesh()")
    fsdp = accel.fsdp
    units, source, ignored_paths, ignored_set = effective_wrap_units(model, fsdp, declared_wrap_modules)
    offload: OffloadPolicy = OffloadPolicy()
    if fsdp.cpu_offload:
        # Pinned host memory needs an accelerator; without one pinning fails or wastes RAM.
        offload = CPUOffloadPolicy(pin_memory=device.type != "cpu")
    mp_policy = build_mp_policy(accel) or MixedPrecisionPolicy()
    options = dict(
        mesh=mesh,
        reshard_after_forward=fsdp.reshard_after_forward,
        mp_policy=mp_policy,
        offload_policy=offload,
        ignored_params=ignored_set or None,
    )
    for path in reversed(units):  # reversed model order: every unit before the units around it
        fully_shard(model.get_submodule(path), **options)
    fully_shard(model, **options)
    if not _has_meta(model):
        for path in ignored_paths:  # FSDP moves only what it manages
            model.get_submodule(path).to(device)
    init_device = torch.device("cpu") if fsdp.cpu_offload else device
    return Parallelized(
        module=model,
        model=model,
        dims=dims,
        wrap_units=units,
        wrap_source=source,
        device=device,
        init_device=init_device,
        mesh=mesh,
        ignored_modules=ignored_paths,
    )
