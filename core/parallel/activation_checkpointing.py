"""Activation checkpointing per wrap unit: keep only each unit's inputs, recompute the rest.

Each unit's ``forward`` is replaced in place by one that runs the original under
``torch.utils.checkpoint.checkpoint(use_reentrant=False)``. The module tree is left as
it is — no wrapper module is inserted (``checkpoint_wrapper`` would add
``_checkpoint_wrapped_module`` to every parameter path) — so state-dict keys, optimizer
state names, ``--accelerator.fsdp.ignored_modules`` paths and checkpoints are the same
with and without AC: a checkpoint saved with AC on resumes with it off and vice versa.

Non-reentrant checkpointing is the variant that works when a unit's inputs do not
require grad (frozen PEFT bases), accepts keyword arguments, nests, and is traced by
``torch.compile``. It restores the RNG state for the recomputation, so dropout draws the
same mask twice and the numbers equal a run without AC. Hooks on the unit itself (FSDP's
gather/reshard) stay outside the checkpoint, as with a wrapper module: FSDP's pre-backward
gather has run by the time the recomputation needs the parameters.

A unit group run by a method (``wrap_units.UnitGroup``) is checkpointed by wrapping that
method the same way; FSDP registers its forward method around the wrapped one, so again
its gather stays outside the checkpoint.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from torch import nn
from torch.utils.checkpoint import checkpoint

from lerobot_kit.core.parallel.wrap_units import UnitGroup, outermost


def _checkpointed(inner: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return checkpoint(inner, *args, use_reentrant=False, **kwargs)


def is_checkpointed(module: nn.Module, method: str = "forward") -> bool:
    """Whether ``module.<method>`` runs under a checkpoint, also once FSDP has registered the
    method as a forward method (its wrapper keeps the checkpointed one as ``__wrapped__``)."""
    bound = inspect.unwrap(module.__dict__.get(method), stop=lambda f: isinstance(f, functools.partial))
    return isinstance(bound, functools.partial) and bound.func is _checkpointed


def checkpoint_groups(model: nn.Module, groups: tuple[UnitGroup, ...] | list[UnitGroup]) -> None:
    """Checkpoint each unit group: the method that runs it, or, without one, each of its modules."""
    for group in groups:
        if group.method is None:
            apply_activation_checkpointing(model, list(group.paths))
            continue
        owner = model.get_submodule(group.paths[0])
        if is_checkpointed(owner, group.method):
            raise ValueError(f"unit {group.name!r} is already activation-checkpointed")
        setattr(owner, group.method, functools.partial(_checkpointed, getattr(owner, group.method)))


def apply_activation_checkpointing(model: nn.Module, unit_paths: list[str]) -> None:
    """Checkpoint each module at ``unit_paths`` (paths as in ``model.named_modules()``), in place.

    A unit nested inside another listed unit is left alone: the outer checkpoint already
    keeps none of its activations, and a second level would only recompute it twice.
    Applying it again to an already checkpointed unit is refused for the same reason.
    """
    for path in outermost(unit_paths):
        module = model.get_submodule(path)
        if is_checkpointed(module):
            raise ValueError(f"module {path!r} is already activation-checkpointed")
        module.forward = functools.partial(_checkpointed, module.forward)  # type: ignore[method-assign]
