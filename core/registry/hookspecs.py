"""The hooks a plugin package implements.

Every hook receives a ``register`` callback (the simonw/llm and datasette style): a
plugin calls it once per thing it provides, so one plugin can provide several, and the
registry knows which plugin provided each name. Built-ins use exactly these hooks.

A target given as ``"package.module:attribute"`` is imported only when first used, so
registering a torch model does not import torch (``lerobot train --help`` and
``lerobot plugins`` load every plugin and stay fast).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import pluggy

if TYPE_CHECKING:
    from lerobot_kit.core.registry.entries import Kind

PROJECT = "lerobot_kit"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def lerobot_register_policies(register: Callable[..., None]) -> None:
    """Register policies: ``register(name, config_class, policy_class)``.

    ``config_class`` subclasses ``lerobot_kit.api.PolicyConfig`` (pydantic, no torch).
    ``policy_class`` (or its ``"module:Class"`` path) subclasses ``lerobot_kit.api.Policy``,
    sets ``config_class`` and declares ``_fsdp_wrap_modules``.
    """


@hookspec
def lerobot_register_datasets(register: Callable[..., None]) -> None:
    """Register datasets: ``register(name, config_class, factory)``.

    ``config_class`` subclasses ``lerobot_kit.api.DatasetConfig``; ``factory`` (or its
    ``"module:function"`` path) is called as ``factory(config, delta_indices)`` and returns
    a ``lerobot_kit.api.PolicyDataset``.
    """


@hookspec
def lerobot_register_checkpoint_formats(register: Callable[..., None]) -> None:
    """Register checkpoint formats: ``register(name, format_class)``.

    ``format_class`` (or its ``"module:Class"`` path) subclasses
    ``lerobot_kit.api.CheckpointFormat``.
    """


@hookspec
def lerobot_register_launchers(register: Callable[..., None]) -> None:
    """Register launchers: ``register(name, launcher_class)``.

    ``launcher_class`` (or its ``"module:Class"`` path) subclasses ``lerobot_kit.api.Launcher``:
    it recognises its environment and reports rank, world size and rendezvous address.
    """


@hookspec
def lerobot_register_envs(register: Callable[..., None]) -> None:
    """Register evaluation environments: ``register(name, config_class, factory)``.

    ``config_class`` subclasses ``lerobot_kit.api.EnvConfig``; ``factory`` (or its
    ``"module:function"`` path) is called as ``factory(config, num_envs)`` and returns a
    ``lerobot_kit.api.VectorEnv`` of ``num_envs`` copies of the task, stepped together.
    """


HOOK_KINDS: dict[str, Kind] = {
    "lerobot_register_policies": "policy",
    "lerobot_register_datasets": "dataset",
    "lerobot_register_checkpoint_formats": "checkpoint_format",
    "lerobot_register_launchers": "launcher",
    "lerobot_register_envs": "env",
}
