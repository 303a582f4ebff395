"""What the registry hands out: one typed entry per registered name, checked against its contract on load.

A plugin registers its target as the object itself or as a ``"module:attribute"``
string. Nothing is imported, and so nothing can be checked, until a run uses the
name: that keeps ``lerobot --help`` and ``lerobot plugins`` free of torch. The
contracts' base classes live in the layers above (``Policy`` and ``CheckpointFormat``
need torch), which declare them to ``core.registry.contracts``: the registry imports
none of what it registers. A target that fails to import, or is not what its contract
asks for, is a ``PluginError`` naming the plugin and its package, so a user knows which
package to fix, update or block.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from lerobot_kit.core.errors import LerobotError, PluginError, first_line
from lerobot_kit.core.registry.contracts import Contract, is_instance, is_subclass

if TYPE_CHECKING:
    from lerobot_kit.core.checkpoint.weights import CheckpointFormat
    from lerobot_kit.core.config.schema import DatasetConfig, EnvConfig, PolicyConfig
    from lerobot_kit.core.data.dataset import PolicyDataset
    from lerobot_kit.core.distributed.launcher import Launcher
    from lerobot_kit.core.eval.env import VectorEnv
    from lerobot_kit.core.model.policy import Policy

Kind = Literal["policy", "dataset", "checkpoint_format", "launcher", "env"]
DISABLE_ENV = "LEROBOT_DISABLE_PLUGINS"
DatasetFactory = Callable[["DatasetConfig", dict[str, list[int]]], "PolicyDataset"]


@dataclass(frozen=True)
class PluginInfo:
    """A plugin as ``lerobot plugins`` shows it: its entry-point name and the package that installed it."""

    name: str
    package: str
    version: str
    builtin: bool

    def describe(self) -> str:
        return f"plugin {self.name!r} ({self.package})"


def describe_failure(exc: BaseException) -> str:
    """One line for what a plugin's code did: an exception, or a ``sys.exit`` that would end the command silently."""
    if isinstance(exc, SystemExit):
        return f"called sys.exit({exc.code!r})"
    return f"{type(exc).__name__}: {first_line(exc)}"


@dataclass
class Entry:
    """One name a plugin registered; ``target`` is the object or its lazy ``"module:attribute"`` path."""

    kind: ClassVar[Kind]
    name: str
    plugin: PluginInfo
    target: object

    def _resolve(self) -> object:
        """The target, imported on first use (and kept)."""
        if isinstance(self.target, str):
            module_name, _, attr = self.target.partition(":")
            try:
                self.target = getattr(importlib.import_module(module_name), attr)
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - whatever the plugin did, it is the plugin's
                raise PluginError(
                    f"{self.plugin.describe()} registered {self._label()} as {self.target!r}, which failed "
                    f"to import: {describe_failure(exc)}"
                ) from exc
        return self.target

    def _call(self, factory: Callable[..., object], *args: object) -> object:
        """Run a third-party plugin's factory: what it raises (a ``LerobotError`` excepted: the
        plugin's own message for the user) or a ``sys.exit`` in it is one line naming the plugin."""
        if self.plugin.builtin:
            return factory(*args)
        try:
            return factory(*args)
        except LerobotError:
            raise
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - whatever the factory did, it is the plugin's
            raise PluginError(
                f"{self.plugin.describe()}: the factory of {self._label()} failed: {describe_failure(exc)}. Fix or "
                f"update the plugin, or block it with {DISABLE_ENV}={self.plugin.name}"
            ) from exc

    def _refuse(self, target: object, wanted: str) -> PluginError:
        return PluginError(
            f"{self.plugin.describe()} registered {self._label()} as {target!r}, which is not {wanted}; "
            f"update the plugin, or block it with {DISABLE_ENV}={self.plugin.name}"
        )

    def _label(self) -> str:
        return f"{self.kind.replace('_', ' ')} {self.name!r}"

    def _class_of(self, base: Contract) -> type:
        target = self._resolve()
        if not is_subclass(target, base):
            raise self._refuse(target, f"a subclass of lerobot_kit.api.{base}")
        return target  # type: ignore[return-value]


@dataclass
class PolicyEntry(Entry):
    """``register(name, config_class, policy_class)``: the config class is checked at registration."""

    kind: ClassVar[Kind] = "policy"
    config_class: type[PolicyConfig]

    def load(self) -> type[Policy]:
        """The policy class, a ``Policy`` subclass whose ``config_class`` accepts the registered config class."""
        policy_class = self._class_of("Policy")
        accepted = getattr(policy_class, "config_class", None)
        if not (isinstance(accepted, type) and issubclass(self.config_class, accepted)):
            raise self._refuse(
                policy_class, f"a policy for {self.config_class.__name__} (its config_class is {accepted!r})"
            )
        return policy_class

    def build(self, config: PolicyConfig, meta: object) -> Policy:
        """The policy, constructed; a third-party constructor that fails is one line naming its plugin."""
        return self._call(self.load(), config, meta)  # type: ignore[return-value]

    def processors(self, config: PolicyConfig, meta: object) -> tuple[object, object]:
        """The policy's pre- and postprocessor (``Policy.make_processors``), failures named like ``build``'s."""
        return self._call(self.load().make_processors, config, meta)  # type: ignore[return-value]


@dataclass
class DatasetEntry(Entry):
    """``register(name, config_class, factory)``: the config class is checked at registration."""

    kind: ClassVar[Kind] = "dataset"
    config_class: type[DatasetConfig]

    def load(self) -> DatasetFactory:
        factory = self._resolve()
        if not callable(factory):
            raise self._refuse(factory, "a callable factory(config, delta_indices)")
        return factory

    def build(self, config: DatasetConfig, delta_indices: dict[str, list[int]]) -> PolicyDataset:
        """Call the factory; what it returns must carry a ``DatasetMeta`` and map-style access."""
        dataset = self._call(self.load(), config, delta_indices)
        if not (is_instance(getattr(dataset, "meta", None), "DatasetMeta")
                and hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
            raise PluginError(
                f"{self.plugin.describe()}: the factory of {self._label()} returned {type(dataset).__name__}, "
                "which is not a dataset (a PolicyDataset: a DatasetMeta as .meta, __len__ and __getitem__)"
            )
        return dataset


@dataclass
class CheckpointFormatEntry(Entry):
    kind: ClassVar[Kind] = "checkpoint_format"

    def load(self) -> type[CheckpointFormat]:
        return self._class_of("CheckpointFormat")

    def create(self) -> CheckpointFormat:
        """An instance; formats take no arguments (an abstract method left unimplemented fails here)."""
        format_class = self.load()
        try:
            return format_class()
        except Exception as exc:  # noqa: BLE001 - a plugin class that cannot be instantiated
            raise PluginError(
                f"{self.plugin.describe()}: {self._label()} cannot be created ({describe_failure(exc)})"
            ) from exc


@dataclass
class LauncherEntry(Entry):
    kind: ClassVar[Kind] = "launcher"

    def load(self) -> type[Launcher]:
        """The launcher class, with the ``name`` and ``priority`` that order the detection."""
        launcher = self._class_of("Launcher")
        if not (isinstance(getattr(launcher, "name", None), str) and isinstance(getattr(launcher, "priority", None), int)):
            raise self._refuse(launcher, "a Launcher with a str `name` and an int `priority`")
        return launcher


@dataclass
class EnvEntry(Entry):
    """``register(name, config_class, factory)``: the config class is checked at registration."""

    kind: ClassVar[Kind] = "env"
    config_class: type[EnvConfig]

    def build(self, config: EnvConfig, num_envs: int) -> VectorEnv:
        """Call the factory; what it returns must be a ``VectorEnv`` of ``num_envs`` environments."""
        factory = self._resolve()
        if not callable(factory):
            raise self._refuse(factory, "a callable factory(config, num_envs)")
        env = self._call(factory, config, num_envs)
        if not (is_instance(env, "VectorEnv") and env.num_envs == num_envs):  # type: ignore[attr-defined]
            raise PluginError(
                f"{self.plugin.describe()}: the factory of {self._label()} returned {type(env).__name__}, "
                f"which is not a lerobot_kit.api.VectorEnv of num_envs={num_envs} environments"
            )
        return env


ENTRY_TYPES: dict[Kind, type[Entry]] = {
    entry.kind: entry for entry in (PolicyEntry, DatasetEntry, CheckpointFormatEntry, LauncherEntry, EnvEntry)
}
CONFIG_BASES: dict[Kind, Contract] = {"policy": "PolicyConfig", "dataset": "DatasetConfig", "env": "EnvConfig"}
