"""Discovers plugins once, lazily, and answers typed lookups for what each one registered.

Built-in modules and third-party packages (entry-point group ``lerobot_kit``) go
through the same pluggy hooks. ``LEROBOT_DISABLE_PLUGINS=a,b`` blocks plugins by name.
Plugin code runs here (its import and its hooks), so whatever it raises, or a
``sys.exit`` in it, becomes a ``PluginError`` naming the plugin: one line a user can act
on instead of a traceback from someone else's package, or a command that just stops.
"""

from __future__ import annotations

import difflib
import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from typing import TYPE_CHECKING, Any, TypeVar

import pluggy

from lerobot_kit.core.errors import PluginError
from lerobot_kit.core.registry import hookspecs
from lerobot_kit.core.registry.contracts import is_subclass
from lerobot_kit.core.registry.entries import (
    CONFIG_BASES,
    DISABLE_ENV,
    ENTRY_TYPES,
    CheckpointFormatEntry,
    DatasetEntry,
    Entry,
    EnvEntry,
    Kind,
    LauncherEntry,
    PluginInfo,
    PolicyEntry,
    describe_failure,
)
from lerobot_kit.core.version import package_version

if TYPE_CHECKING:
    from lerobot_kit.core.checkpoint.weights import CheckpointFormat
    from lerobot_kit.core.distributed.launcher import Launcher

ENTRY_POINT_GROUP = "lerobot_kit"

BUILTIN_PLUGINS: dict[str, str] = {
    "act": "lerobot_kit.plugins.policies.act",
    "diffusion": "lerobot_kit.plugins.policies.diffusion",
    "reach": "lerobot_kit.plugins.datasets.reach.plugin",
    "lerobot_dataset": "lerobot_kit.plugins.datasets.lerobot.plugin",
    "builtin_formats": "lerobot_kit.plugins.formats",
    "builtin_launchers": "lerobot_kit.plugins.launchers",
    "reach_env": "lerobot_kit.plugins.envs.reach.plugin",
}

E = TypeVar("E", bound=Entry)


@dataclass
class Registry:
    plugins: list[PluginInfo] = field(default_factory=list)
    entries: dict[Kind, dict[str, Entry]] = field(default_factory=dict)

    def names(self, kind: Kind) -> list[str]:
        return sorted(self.entries.get(kind, {}))

    def policy(self, name: str) -> PolicyEntry:
        return self._find("policy", name, PolicyEntry)

    def claiming_policy_type(self, saved: dict[str, Any]) -> str | None:
        """The registered policy type whose config class claims a pretrained ``config.json``
        written by another library (its classmethod ``claims_pretrained(saved) -> bool``, as
        the LeRobot bridge's types recognise LeRobot's files), else None: the file's own
        ``type`` is then a lerobot-kit type, read as it is."""
        for name in self.names("policy"):
            claims = getattr(self.policy(name).config_class, "claims_pretrained", None)
            if callable(claims) and claims(saved):
                return name
        return None

    def dataset(self, name: str) -> DatasetEntry:
        return self._find("dataset", name, DatasetEntry)

    def env(self, name: str) -> EnvEntry:
        return self._find("env", name, EnvEntry)

    def checkpoint_format(self, name: str) -> CheckpointFormat:
        """A ready instance of the format registered as ``name``."""
        return self._find("checkpoint_format", name, CheckpointFormatEntry).create()

    def launchers(self) -> list[type[Launcher]]:
        """Every launcher class, in the order detection tries them: ``(priority, name)``."""
        classes = [self._find("launcher", name, LauncherEntry).load() for name in self.names("launcher")]
        return sorted(classes, key=lambda launcher: (launcher.priority, launcher.name))

    def by_plugin(self, plugin: str) -> list[Entry]:
        return [e for table in self.entries.values() for e in table.values() if e.plugin.name == plugin]

    def _find(self, kind: Kind, name: str, entry_type: type[E]) -> E:
        table = self.entries.get(kind, {})
        entry = table.get(name)
        if isinstance(entry, entry_type):
            return entry
        hint = difflib.get_close_matches(name, list(table), n=1)
        suggestion = f" Did you mean {hint[0]!r}?" if hint else ""
        known = ", ".join(sorted(table)) or "none"
        raise PluginError(
            f"unknown {kind.replace('_', ' ')} {name!r}.{suggestion} Known: {known} "
            f"(install a plugin package to add more; `lerobot plugins` lists them)."
        )


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
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - whatever its import does is the plugin's
            raise PluginError(
                f"plugin {ep.name!r} from package {package!r} failed to import ({ep.value}): "
                f"{describe_failure(exc)}. Fix or uninstall it, or block it with {DISABLE_ENV}={ep.name}."
            ) from exc
        pm.register(module, name=ep.name)
        infos[ep.name] = PluginInfo(ep.name, package, version, builtin=False)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"plugin {exc.plugin!r} implements an unknown hook: {exc}") from exc
    return infos


def _register_callback(kind: Kind, table: dict[str, Entry], info: PluginInfo) -> Callable[..., None]:
    """The ``register`` a hook receives: checks the call's shape and the config class, and refuses clashes."""
    entry_type = ENTRY_TYPES[kind]
    config_base = CONFIG_BASES.get(kind)
    label = kind.replace("_", " ")

    def register(name: str, *args: Any) -> None:
        wanted = "(name, config_class, target)" if config_base else "(name, target)"
        if len(args) != (2 if config_base else 1):
            raise PluginError(f"{info.describe()}: register({name!r}, ...) for a {label} takes {wanted}")
        if name in table:
            other = table[name].plugin
            raise PluginError(
                f"{label} name clash: {name!r} is registered by plugin {info.name!r} ({info.package}) and "
                f"by plugin {other.name!r} ({other.package}); block one with {DISABLE_ENV}=<plugin>."
            )
        if config_base is None:
            table[name] = entry_type(name, info, args[0])
            return
        config_class, target = args
        if not is_subclass(config_class, config_base):
            raise PluginError(
                f"{info.describe()}: the config class of {label} {name!r} is {config_class!r}, "
                f"not a subclass of lerobot_kit.api.{config_base}"
            )
        table[name] = entry_type(name, info, target, config_class)  # type: ignore[call-arg]

    return register


def _collect(pm: pluggy.PluginManager, infos: dict[str, PluginInfo]) -> Registry:
    registry = Registry(plugins=list(infos.values()))
    for hook_name, kind in hookspecs.HOOK_KINDS.items():
        table = registry.entries.setdefault(kind, {})
        for impl in getattr(pm.hook, hook_name).get_hookimpls():
            info = infos[impl.plugin_name]
            try:
                impl.function(register=_register_callback(kind, table, info))
            except PluginError:
                raise
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - whatever a hook does is its plugin's
                raise PluginError(
                    f"{info.describe()} failed in {hook_name}: {describe_failure(exc)}. Fix or uninstall "
                    f"it, or block it with {DISABLE_ENV}={info.name}."
                ) from exc
    return registry


def get_registry() -> Registry:
    """The registry, built on first use and kept for the life of the process."""
    global _REGISTRY
    if _REGISTRY is None:
        pm = pluggy.PluginManager(hookspecs.PROJECT)
        pm.add_hookspecs(hookspecs)
        _REGISTRY = _collect(pm, _load_plugins(pm))
    return _REGISTRY
