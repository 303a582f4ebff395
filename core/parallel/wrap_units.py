"""Wrap units: the submodules that are sharded, checkpointed and compiled one at a time.

Resolved once per run by ``resolve_wrap_units`` into a ``WrapUnits`` value that the
parallelize pipeline, ``lerobot plan`` and PEFT's dtype check all read, so each of them
refuses exactly what the run would. Units come from, in order:
``--accelerator.fsdp.wrap_modules`` > the policy's ``_fsdp_wrap_modules`` >
``--accelerator.fsdp.min_num_params``. A sharded run needs them (sharding only the root
would gather the whole model at once and save nothing), and so do activation
checkpointing and compile, which work per unit in every layout.

``--accelerator.fsdp.ignored_modules`` (a regex, full match on module paths) keeps whole
modules unsharded and out of FSDP's reductions; it applies to sharded runs only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torch import nn

from lerobot_kit.core.config.schema import AcceleratorConfig, FSDPConfig
from lerobot_kit.core.errors import ConfigError
from lerobot_kit.core.parallel.dims import ParallelDims

# Containers have no forward, so FSDP's pre-forward gather would never run for them.
_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.ParameterList, nn.ParameterDict)


@dataclass(frozen=True)
class WrapUnits:
    """The resolved units of a run: paths in model order, where they came from, ignored modules.

    Holds module paths, never parameter objects: ``to_empty`` from the meta device
    replaces plain parameters, so ``ignored_params`` looks them up on the model it is given.
    """

    paths: tuple[str, ...] = ()
    source: str = ""  # "flag" | "policy" | "min_num_params" | "" (none needed)
    ignored_modules: tuple[str, ...] = ()  # outermost matches of --accelerator.fsdp.ignored_modules

    def unit_of(self, param_path: str) -> str:
        """The innermost unit holding ``param_path``; "" for the root."""
        return unit_of(param_path, self.paths)

    def ignored_params(self, model: nn.Module) -> list[nn.Parameter]:
        """Every parameter of the ignored modules, once each, in module order (the same on every rank)."""
        params = (param for path in self.ignored_modules for param in model.get_submodule(path).parameters())
        return list(dict.fromkeys(params))


def resolve_wrap_units(
    model: nn.Module, dims: ParallelDims, accel: AcceleratorConfig, declared: list[str] | None
) -> WrapUnits:
    """The run's units, or none when nothing works per unit (DDP/single without AC or compile).

    Sharded runs also drop units wholly inside ignored modules (they would hold nothing
    to shard) and refuse a configuration that leaves no unit or ties weights across units.
    """
    uses = [
        (who, why)
        for who, why, on in (
            ("a sharded run", "sharding only the root would save no memory", dims.sharded),
            ("--accelerator.activation_checkpointing=true", "each unit is checkpointed on its own",
             accel.activation_checkpointing),
            ("--accelerator.compile=true", "each unit is compiled on its own", accel.compile),
        )
        if on
    ]
    if not uses:
        return WrapUnits()
    units, source = _select_units(model, accel.fsdp, declared, *uses[0])
    if not dims.sharded:
        return WrapUnits(tuple(units), source)
    fsdp = accel.fsdp
    ignored_paths = _ignored_paths(model, fsdp.ignored_modules)
    wrap = WrapUnits(tuple(units), source, tuple(ignored_paths))
    ignored = set(wrap.ignored_params(model))
    units = [u for u in units if any(p not in ignored for p in model.get_submodule(u).parameters())]
    if not units:
        raise ConfigError(
            f"every FSDP wrap unit lies inside --accelerator.fsdp.ignored_modules={fsdp.ignored_modules!r}, "
            "so nothing would be sharded: narrow the regex"
        )
    check_tied_weights(model, units, ignored)
    return WrapUnits(tuple(units), source, tuple(ignored_paths))


def _select_units(
    model: nn.Module, fsdp: FSDPConfig, declared: list[str] | None, who: str, why: str
) -> tuple[list[str], str]:
    """Module paths of the units (model order) and where the choice came from; ``who``
    needs them and ``why`` (for the error when nothing names any)."""
    if fsdp.wrap_modules:
        return _units_by_class(model, fsdp.wrap_modules, "--accelerator.fsdp.wrap_modules"), "flag"
    if declared:
        where = f"the policy's _fsdp_wrap_modules ({type(model).__name__})"
        return _units_by_class(model, list(declared), where), "policy"
    if fsdp.min_num_params:
        return _units_by_size(model, fsdp.min_num_params), "min_num_params"
    raise ConfigError(
        f"{who} needs FSDP wrap units, but the policy ({type(model).__name__}) declares no "
        "_fsdp_wrap_modules and neither --accelerator.fsdp.wrap_modules='[\"ClassName\"]' nor "
        f"--accelerator.fsdp.min_num_params=N is set: set one of them ({why}). "
        f"Module classes of this model: {', '.join(_class_names(model))}"
    )


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
            f"{where} names {', '.join(containers)}: a container has no forward of its own, so it cannot be a "
            "wrap unit; name the class of the layers inside it instead"
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


def outermost(paths: tuple[str, ...] | list[str]) -> list[str]:
    """``paths`` without those nested inside another of them (order kept, duplicates dropped)."""
    return [p for p in dict.fromkeys(paths) if not any(p.startswith(q + ".") for q in paths)]


def unit_of(param_path: str, units: tuple[str, ...] | list[str]) -> str:
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


def _ignored_paths(model: nn.Module, pattern: str | None) -> list[str]:
    """Outermost module paths fully matching ``pattern``."""
    if not pattern:
        return []
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
    return outermost(paths)
