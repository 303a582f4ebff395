"""``torch.compile`` per wrap unit, applied after activation checkpointing and before FSDP.

Compiling unit by unit (not the whole policy) keeps graphs small and identical across
layers of one class, so one compilation serves every encoder layer; FSDP's per-unit
gathers stay outside the compiled graphs, and everything outside the units (image
backbone, heads, loss) runs eagerly. ``nn.Module.compile`` compiles in place: no
``_orig_mod`` wrapper enters the module tree, so state-dict keys and checkpoints are the
same with and without compile. A unit already activation-checkpointed is traced with
its checkpoint (non-reentrant checkpoints are part of what ``torch.compile`` captures).

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


def check_compilable(wrap: WrapUnits) -> None:
    """Refuse compile for unit groups run by a method: compile works on each unit's
    ``forward``, which such a group never calls, so nothing of it would be compiled."""
    methods = [g for g in wrap.groups if g.method is not None]
    if methods:
        raise ConfigError(
            f"{_FLAG} compiles each wrap unit's forward, but this policy runs {len(methods)} of its units through "
            f"{methods[0].method!r} (e.g. {methods[0].name!r}), which calls no forward of theirs: drop the flag"
        )


def apply_compile(model: nn.Module, unit_paths: list[str]) -> None:
    """Compile each unit at ``unit_paths`` in place; nested units are compiled with their outer one."""
    for path in outermost(unit_paths):
        model.get_submodule(path).compile()
