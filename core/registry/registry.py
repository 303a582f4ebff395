"""Discovers plugins once, lazily, and keeps what each one registered.

Built-in modules and third-party packages (entry-point group ``lerobot_kit``) go
through the same pluggy hooks. ``LEROBOT_DISABLE_PLUGINS=a,b`` blocks plugins by name.
"""

from __future__ import annotations

import difflib
import importlib
import os
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import pluggy

from lerobot_kit.core.errors import PluginError
from lerobot_kit.core.version import package_version
from lerobot_kit.core.registry import hookspecs

ENTRY_POINT_GROUP = "lerobot_kit"
DISABLE_ENV = "LEROBOT_DISABLE_PLUGINS"

BUILTIN_PLUGINS: dict[str, str] = {
    "act": "lerobot_kit.plugins.policies.act",
    "diffusion": "lerobot_kit.plugins.policies.diffusion",
    "reach": "lerobot_kit.plugins.datasets.reach.plugin",
    "lerobot_dataset": "lerobot_kit.plugins.datasets.lerobot.plugin",
    "builtin_formats": "lerobot_kit.plugins.formats",
    "builtin_launchers": "lerobot_kit.plugins.launchers",
}


@dataclass(frozen=True)
class PluginInfo:
    name: str
    package: str
    version: str
    builtin: bool


@dataclass
class Registration:
    """One named thing a plugin registered; ``load()`` imports a lazy target."""

    kind: str
    name: str
    plugin: PluginInfo
    target: Any
    config_class: type | None = None

    def load(self) -> Any:
        if isinstance(self.target, str):
            module_name, _, attr = self.target.partition(":")
            try:
                module = importlib.import_module(module_name)
                self.target = getattr(module, attr)
            except Exception as exc:  # noqa: BLE001 - reported with the plugin's name
                raise PluginError(
                    f"plugin {self.plugin.name!r} ({self.plugin.package}) registered "
                    f"{self.kind} {self.name!r} as {self.target!r}, which failed to import: {exc}"
                ) from exc
        return self.target


@dataclass
class Registry:
    plugins: list[PluginInfo] = field(default_factory=list)
    entries: dict[str, dict[str, Registration]] = field(default_factory=dict)

    def names(self, kind: str) -> list[str]:
        return sorted(self.entries.get(kind, {}))

    def get(self, kind: str, name: str) -> Registration:
        table = self.entries.get(kind, {})
        if name in table:
            return table[name]
        hint = difflib.get_close_matches(name, list(table), n=1)
        suggestion = f" Did you mean {hint[0]!r}?" if hint else ""
        known = ", ".join(sorted(table)) or "none"
        raise PluginError(
            f"unknown {kind.replace('_', ' ')} {name!r}.{suggestion} Known: {known} "
            f"(install a plugin package to add more; `lerobot plugins` lists them)."
        )

    def by_plugin(self, plugin: str) -> list[Registration]:
        return [r for table in self.entries.values() for r in table.values() if r.plugin.name == plugin]


_REGISTRY: Registry | None = None


def _disabled() -> set[str]:
    return {n.strip() for n in os.environ.get(DISABLE_ENV, "").split(",") if n.strip()}


def _load_plugins(pm: pluggy.PluginManager) -> dict[str, PluginInfo]:
    blocked = _disabled()
    infos: dict[str, PluginInfo] = {}
    for name, module_name in BUILTIN_PLUGINS.items():
        if name in blocked:
            continue
        pm.register(importlib.import_module(module_name), name=name)
        infos[name] = PluginInfo(name, "lerobot-kit", package_version(), builtin=True)
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in blocked:
            continue
        package = ep.dist.name if ep.dist else "?"
        version = ep.dist.version if ep.dist else "?"
        if ep.name in infos:
            raise PluginError(
                f"plugin name clash: package {package!r} declares plugin {ep.name!r}, "
                f"a name already used by {infos[ep.name].package!r}; rename its entry point "
                f"or block one with {DISABLE_ENV}={ep.name}."
            )
        try:
            module = ep.load()
        except Exception as exc:  # noqa: BLE001 - any import failure is the plugin's
            raise PluginError(
                f"plugin {ep.name!r} from package {package!r} failed to import ({ep.value}): "
                f"{type(exc).__name__}: {exc}. Fix or uninstall it, or block it with "
                f"{DISABLE_ENV}={ep.name}."
            ) from exc
        pm.register(module, name=ep.name)
        infos[ep.name] = PluginInfo(ep.name, package, version, builtin=False)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"plugin {exc.plugin!r} implements an unknown hook: {exc}") from exc
    return infos


def _collect(pm: pluggy.PluginManager, infos: dict[str, PluginInfo]) -> Registry:
    registry = Registry(plugins=list(infos.values()))
    for hook_name, kind in hookspecs.HOOK_KINDS.items():
        table = registry.entries.setdefault(kind, {})
        for impl in getattr(pm.hook, hook_name).get_hookimpls():
            info = infos[impl.plugin_name]

            def register(name: str, *args: Any, _info: PluginInfo = info, _kind: str = kind) -> None:
                if _kind in ("policy", "dataset"):
                    if len(args) != 2:
                        raise PluginError(
                            f"plugin {_info.name!r}: register({name!r}, ...) for a {_kind} takes "
                            "(name, config_class, target)"
                        )
                    config_class, target = args
                else:
                    if len(args) != 1:
                        raise PluginError(
                            f"plugin {_info.name!r}: register({name!r}, ...) for a {_kind} takes (name, target)"
                        )
                    config_class, target = None, args[0]
                if name in table:
                    other = table[name].plugin
                    raise PluginError(
                        f"{_kind.replace('_', ' ')} name clash: {name!r} is registered by plugin "
                        f"{_info.name!r} ({_info.package}) and by plugin {other.name!r} ({other.package}); "
                        f"block one with {DISABLE_ENV}=<plugin>."
                    )
                table[name] = Registration(_kind, name, _info, target, config_class)

            impl.function(register=register)
    return registry


def get_registry() -> Registry:
    """The registry, built on first use and kept for the life of the process."""
    global _REGISTRY
    if _REGISTRY is None:
        pm = pluggy.PluginManager(hookspecs.PROJECT)
        pm.add_hookspecs(hookspecs)
        _REGISTRY = _collect(pm, _load_plugins(pm))
    return _REGISTRY


def reset_registry() -> None:
    """Forget the registry (tests that install plugins at run time)."""
    global _REGISTRY
    _REGISTRY = None
    importlib.invalidate_caches()
