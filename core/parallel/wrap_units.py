"""Wrap units: the submodules that are sharded, checkpointed and compiled one at a time.

Resolved once per run by ``resolve_wrap_units`` into a ``WrapUnits`` value that
``parallelize``, ``lerobot plan`` and PEFT's dtype check all read, so each of them
refuses exactly what the run would. Units come from, in order:
``--accelerator.fsdp.wrap_modules`` > the policy's ``_fsdp_wrap_modules`` >
``--accelerator.fsdp.min_num_params``. A sharded run needs them (sharding only the root
would gather the whole model at once and save nothing), and so do activation
checkpointing and compile, which work per unit in every layout.

``--accelerator.fsdp.ignored_modules`` (a regex, full match on module paths) keeps whole
modules unsharded and out of FSDP's reductions; it applies to sharded runs only.

Unit groups. FSDP2 gathers a unit's parameters in a hook on its ``forward`` and frees them
in another after it. Some models never call the forward of their layers: a joint
attention (LeRobot's π0/π0.5 and SmolVLA) runs layer *i* of two towers together, calling
each layer's norms and projections from outside the layer, so hooks on the layers never
fire and their parameters would stay sharded while used. Such a policy declares, besides
its classes, ``fsdp_unit_groups()``: ``UnitGroup``s, each several modules that are one
unit, and the name of the method (an attribute of the group's first module) that runs
them. The group is sharded as one unit (``fully_shard`` on the list of modules) and the
method is registered as an FSDP forward method, so calling it gathers the whole group
before and frees it after, and its backward reduces the group's gradients once.
Activation checkpointing wraps that method. A group may also name one module and no
method: a unit chosen by path rather than class (a tied or unused head, an embedding).
Groups are the policy's, whatever the flags say: the model computes wrongly without them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torch import nn

from lerobot_kit.core.config.schema import AcceleratorConfig, FSDPConfig
from lerobot_kit.core.errors import ConfigError, PluginError
from lerobot_kit.core.parallel.dims import ParallelDims
from lerobot_kit.core.parallel.unit_group import UnitGroup

# Containers have no forward, so FSDP's pre-forward gather would never run for them.
_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.ParameterList, nn.ParameterDict)


@dataclass(frozen=True)
class WrapUnits:
    """The resolved units of a run: single-module units (paths, in model order), unit
    groups, where the single units came from, ignored modules.

    Holds module paths, never parameter objects: ``to_empty`` from the meta device
    replaces plain parameters, so ``ignored_params`` looks them up on the model it is given.
    """

    paths: tuple[str, ...] = ()
    source: str = ""  # "flag" | "policy" | "min_num_params" | "" (none needed)
    ignored_modules: tuple[str, ...] = ()  # outermost matches of --accelerator.fsdp.ignored_modules
    groups: tuple[UnitGroup, ...] = ()  # the policy's fsdp_unit_groups(), paths from the model's root

    @property
    def any(self) -> bool:
        """Whether the run has any unit besides the root."""
        return bool(self.paths or self.groups)

    @property
    def count(self) -> int:
        return len(self.paths) + len(self.groups)

    def unit_of(self, param_path: str) -> str:
        """The unit holding ``param_path``: the innermost single unit, or the name of the
        group one of whose modules holds it; "" for the root."""
        for group in self.groups:
            if unit_of(param_path, group.paths):
                return group.name
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
    groups, singles = declared_groups(model)
    units, source = _select_units(model, accel.fsdp, declared, *uses[0], have_groups=bool(groups or singles))
    units = _merge_single_units(model, units, singles, groups)
    if singles and not source:
        source = "policy"
    if not dims.sharded:
        return WrapUnits(tuple(units), source, (), tuple(groups))
    fsdp = accel.fsdp
    ignored_paths = _ignored_paths(model, fsdp.ignored_modules)
    wrap = WrapUnits(tuple(units), source, tuple(ignored_paths), tuple(groups))
    ignored = set(wrap.ignored_params(model))

    def holds_sharded(path: str) -> bool:
        return any(p not in ignored for p in model.get_submodule(path).parameters())

    units = [u for u in units if holds_sharded(u)]
    groups = [g for g in groups if any(holds_sharded(p) for p in g.paths)]
    if not units and not groups:
        raise ConfigError(
            f"every FSDP wrap unit lies inside --accelerator.fsdp.ignored_modules={fsdp.ignored_modules!r}, "
            "so nothing would be sharded: narrow the regex"
        )
    wrap = WrapUnits(tuple(units), source, tuple(ignored_paths), tuple(groups))
    check_tied_weights(model, wrap, ignored)
    return wrap


def declared_groups(model: nn.Module) -> tuple[list[UnitGroup], list[str]]:
    """The unit groups the policy inside ``model`` declares (``fsdp_unit_groups()``), with
    paths from ``model``'s root, split into real groups (several modules, or a method) and
    single modules chosen by path; both empty when the policy declares none.

    Refuses groups whose modules do not exist, overlap, or whose method is missing: a
    wrong declaration must fail at start-up, not as a shape error deep in a forward.
    """
    # Looked up on the class: a PEFT wrapper forwards unknown attributes to the model it wraps,
    # so asking instances would find the policy's method on the wrapper, with the wrong prefix.
    owner = next(((path, m) for path, m in model.named_modules() if callable(getattr(type(m), "fsdp_unit_groups", None))),
                 None)
    if owner is None:
        return [], []
    prefix, policy = owner
    declared = [group.under(prefix) for group in policy.fsdp_unit_groups()]
    known = dict(model.named_modules())
    where = f"{type(policy).__name__}.fsdp_unit_groups()"
    seen: dict[str, str] = {}
    for group in declared:
        if not group.paths:
            raise PluginError(f"{where} declares a group of no modules")
        for path in group.paths:
            if path not in known or not path:
                raise PluginError(f"{where} names {path!r}, which is not a submodule of {type(model).__name__}")
            clash = next((other for other in seen if path == other or path.startswith(other + ".")
                          or other.startswith(path + ".")), None)
            if clash is not None:
                raise PluginError(
                    f"{where}: module {path!r} (unit {group.name!r}) overlaps {clash!r} (unit {seen[clash]!r}); "
                    "a module belongs to one unit"
                )
            seen[path] = group.name
        if group.method is not None and not callable(getattr(known[group.paths[0]], group.method, None)):
            raise PluginError(
                f"{where}: unit {group.name!r} is run by {group.method!r}, which module {group.paths[0]!r} "
                f"({type(known[group.paths[0]]).__name__}) does not have"
            )
    groups = [g for g in declared if len(g.paths) > 1 or g.method is not None]
    singles = [g.paths[0] for g in declared if len(g.paths) == 1 and g.method is None]
    return groups, singles


def _merge_single_units(
    model: nn.Module, units: list[str], singles: list[str], groups: list[UnitGroup]
) -> list[str]:
    """The class-selected units plus the policy's single-module groups, in model order; a
    selected unit inside or around a group's module is refused (a group's modules are
    gathered by its method, which a unit's own hooks would preempt or miss)."""
    in_groups = [p for g in groups for p in g.paths]
    for unit in units:
        clash = next((p for p in in_groups if unit == p or unit.startswith(p + ".") or p.startswith(unit + ".")),
                     None)
        if clash is not None:
            group = next(g for g in groups if clash in g.paths)
            raise ConfigError(
                f"wrap unit {unit!r} ({type(model.get_submodule(unit)).__name__}) overlaps module {clash!r} of the "
                f"policy's unit group {group.name!r}, which runs through {group.method or 'forward'}: "
                "name other classes in --accelerator.fsdp.wrap_modules"
            )
    chosen = set(units) | set(singles)
    return [path for path, _ in model.named_modules() if path in chosen]


def _select_units(
    model: nn.Module, fsdp: FSDPConfig, declared: list[str] | None, who: str, why: str, *, have_groups: bool
) -> tuple[list[str], str]:
    """Module paths of the units (model order) and where the choice came from; ``who``
    needs them and ``why`` (for the error when nothing names any). A policy with unit
    groups may name no class."""
    if fsdp.wrap_modules:
        return _units_by_class(model, fsdp.wrap_modules, "--accelerator.fsdp.wrap_modules"), "flag"
    if declared:
        where = f"the policy's _fsdp_wrap_modules ({type(model).__name__})"
        return _units_by_class(model, list(declared), where), "policy"
    if fsdp.min_num_params:
        return _units_by_size(model, fsdp.min_num_params), "min_num_params"
    if have_groups:
        return [], ""
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
    model: nn.Module, wrap: WrapUnits, ignored_params: set[nn.Parameter] | frozenset = frozenset()
) -> None:
    """Refuse one parameter reachable from two FSDP units (or a unit and the root): each
    unit gathers and frees its own parameters, so a shared one would be used while
    sharded. Ignored parameters are never sharded, so they may be shared."""
    seen: dict[int, tuple[str, str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if param in ignored_params:
            continue
        unit = wrap.unit_of(name)
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
