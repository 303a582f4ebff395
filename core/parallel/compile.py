"""``torch.compile`` per wrap unit, applied after activation checkpointing and before FSDP.

Compiling unit by unit (not the whole policy) keeps graphs small and identical across
layers of one class, so one compilation serves every encoder layer; FSDP's per-unit
gathers stay outside the compiled graphs, and everything outside the units (image
backbone, heads, loss) runs eagerly. ``nn.Module.compile`` compiles in place: no
``_orig_mod`` wrapper enters the module tree, so state-dict keys and checkpoints are the
same with and without compile. A unit already activation-checkpointed is traced with
its checkpoint (non-reentrant checkpoints are part of what ``torch.compile`` captures).

A unit group run by a method (``wrap_units.UnitGroup``: layers a joint attention calls
from outside, whose ``forward`` never runs) is compiled through that method, replaced in
place by its compiled version; FSDP then registers its forward method around the compiled
one, so the group's gather stays outside the graph as a unit's does. The method should
read nothing that differs from group to group (a layer index), so that one graph serves
them all; otherwise each group compiles on its own.

The platform is checked before anything compiles, because a missing compiler otherwise
surfaces as a long traceback in the first training step.
"""

from __future__ import annotations

import torch
from torch import nn

from lerobot_kit.core.errors import ConfigError
from lerobot_kit.core.parallel.wrap_units import WrapUnits, outermost

_FLAG = "--accelerator.compile=true"


def check_compile_supported(device: torch.device) -> None:
    """Refuse, in one line, a platform where ``torch.compile``'s default backend cannot run."""
    from torch._dynamo.eval_frame import check_if_dynamo_supported

    try:
        check_if_dynamo_supported()
    except RuntimeError as exc:
        raise ConfigError(f"{_FLAG}: torch.compile cannot run here ({exc}); drop the flag") from exc
    if device.type == "cpu":
        from torch._inductor.cpp_builder import get_cpp_compiler

        try:
            get_cpp_compiler()
        except Exception as exc:  # inductor raises its own InvalidCxxCompiler, or OSError from the probe
            raise ConfigError(
                f"{_FLAG} on CPU needs a C++ compiler (g++ or $CXX) to build the compiled kernels, and none "
                "runs here: install one, or drop the flag"
            ) from exc
    elif device.type == "cuda":
        from torch.utils._triton import has_triton

        if not has_triton():
            raise ConfigError(f"{_FLAG} on CUDA needs Triton, which is not installed here: install it, or drop it")


def apply_compile(model: nn.Module, wrap: WrapUnits) -> None:
    """Compile each unit in place: single units (nested ones with their outer one), and each
    unit group through its method, or module by module when it has none."""
    for path in outermost([*wrap.paths, *(p for g in wrap.groups if g.method is None for p in g.paths)]):
        model.get_submodule(path).compile()
    for group in wrap.groups:
        if group.method is not None:
            owner = model.get_submodule(group.paths[0])
            setattr(owner, group.method, torch.compile(getattr(owner, group.method)))
