"""Typed registry lookups, and plugins whose targets break their contract, found through real entry points."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from plugin_dists import fresh_registry, make_distribution

from lerobot_kit.core.errors import PluginError
from lerobot_kit.core.registry.registry import Registry, get_registry

ODD_PLUGIN = """
import collections
from lerobot_kit.api import DatasetConfig, PolicyConfig, hookimpl

class OddConfig(PolicyConfig):
    type: str = "odd"

class OddDataConfig(DatasetConfig):
    type: str = "odddata"

NOT_CALLABLE = 3

def returns_a_list(config, delta_indices):
    return []

def raises(config, delta_indices):
    raise RuntimeError("no licence server")

def exits(config, delta_indices):
    import sys
    sys.exit(0)

@hookimpl
def lerobot_register_policies(register):
    register("not_a_policy", OddConfig, "collections:OrderedDict")
    register("other_config", OddConfig, "oddplug_torch:PolicyOfAnotherConfig")
    register("exits_on_import", OddConfig, "oddplug_exits:Anything")
    register("raises_in_init", OddConfig, "oddplug_torch:PolicyThatRaises")
    register("exits_in_processors", OddConfig, "oddplug_torch:PolicyThatExits")

@hookimpl
def lerobot_register_datasets(register):
    register("not_callable", OddDataConfig, "oddplug:NOT_CALLABLE")
    register("not_a_dataset", OddDataConfig, returns_a_list)
    register("raises", OddDataConfig, raises)
    register("exits", OddDataConfig, exits)

@hookimpl
def lerobot_register_checkpoint_formats(register):
    register("not_a_format", collections.OrderedDict)
    register("abstract_format", "oddplug_torch:AbstractFormat")

@hookimpl
def lerobot_register_launchers(register):
    register("no_priority", "oddplug_torch:LauncherWithoutPriority")
"""
ODD_TORCH = """
from lerobot_kit.api import CheckpointFormat, Launcher, Policy, PolicyConfig

class OtherConfig(PolicyConfig):
    type: str = "other"

class PolicyOfAnotherConfig(Policy):
    config_class = OtherConfig

class PolicyThatRaises(Policy):
    config_class = PolicyConfig

    def __init__(self, config, meta):
        raise RuntimeError("no GPU driver")

class PolicyThatExits(Policy):
    config_class = PolicyConfig

    @classmethod
    def make_processors(cls, config, meta):
        import sys
        sys.exit(0)

class AbstractFormat(CheckpointFormat):
    pass

class LauncherWithoutPriority(Launcher):
    name = "no_priority"
"""
ODD_MODULES = ("oddplug", "oddplug_torch", "oddplug_exits")


@pytest.fixture
def odd_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Registry]:
    """The registry with plugin ``oddplug`` installed (and forgotten afterwards)."""
    site = make_distribution(tmp_path / "site", "oddplug", ODD_PLUGIN)
    (site / "oddplug_torch.py").write_text(ODD_TORCH)
    (site / "oddplug_exits.py").write_text("import sys\nsys.exit(3)\n")
    monkeypatch.syspath_prepend(str(site))
    fresh_registry(monkeypatch)
    yield get_registry()
    for name in ODD_MODULES:
        sys.modules.pop(name, None)


BROKEN: dict[str, tuple[Callable[[Registry], Any], str]] = {
    "policy not a Policy": (
        lambda r: r.policy("not_a_policy").load(),
        "registered policy 'not_a_policy' as <class 'collections.OrderedDict'>, which is not a subclass of "
        "lerobot_kit.api.Policy"),
    "policy of another config": (
        lambda r: r.policy("other_config").load(),
        "which is not a policy for OddConfig (its config_class is <class 'oddplug_torch.OtherConfig'>)"),
    "policy module exits": (
        lambda r: r.policy("exits_on_import").load(),
        "registered policy 'exits_on_import' as 'oddplug_exits:Anything', which failed to import: called sys.exit(3)"),
    "policy constructor raises": (
        lambda r: r.policy("raises_in_init").build(r.policy("raises_in_init").config_class(), None),
        "the factory of policy 'raises_in_init' failed: RuntimeError: no GPU driver. Fix or update the plugin"),
    "policy processors exit": (  # uncaught, `lerobot train` would end silently with success
        lambda r: r.policy("exits_in_processors").processors(r.policy("exits_in_processors").config_class(), None),
        "the factory of policy 'exits_in_processors' failed: called sys.exit(0)."),
    "dataset not callable": (
        lambda r: r.dataset("not_callable").load(), "as 3, which is not a callable factory(config, delta_indices)"),
    "dataset factory returns no dataset": (
        lambda r: r.dataset("not_a_dataset").build(r.dataset("not_a_dataset").config_class(), {}),
        "the factory of dataset 'not_a_dataset' returned list, which is not a dataset"),
    "dataset factory raises": (
        lambda r: r.dataset("raises").build(r.dataset("raises").config_class(), {}),
        "the factory of dataset 'raises' failed: RuntimeError: no licence server. Fix or update the plugin, or "
        "block it with LEROBOT_DISABLE_PLUGINS=oddplug"),
    "dataset factory exits": (  # uncaught, `lerobot train` would end silently with success
        lambda r: r.dataset("exits").build(r.dataset("exits").config_class(), {}),
        "the factory of dataset 'exits' failed: called sys.exit(0)."),
    "format not a CheckpointFormat": (
        lambda r: r.checkpoint_format("not_a_format"), "which is not a subclass of lerobot_kit.api.CheckpointFormat"),
    "format abstract": (
        lambda r: r.checkpoint_format("abstract_format"),
        "checkpoint format 'abstract_format' cannot be created (TypeError: Can't instantiate abstract class"),
    "launcher without priority": (
        lambda r: r.launchers(), "which is not a Launcher with a str `name` and an int `priority`"),
}


@pytest.mark.parametrize("use, message", BROKEN.values(), ids=BROKEN.keys())
def test_a_target_that_breaks_its_contract_is_a_plugin_error_naming_the_plugin(
    odd_registry: Registry, use: Callable[[Registry], Any], message: str
) -> None:
    with pytest.raises(PluginError) as caught:
        use(odd_registry)
    assert "plugin 'oddplug' (oddplug)" in str(caught.value)
    assert message in str(caught.value)


def test_lookups_are_typed_and_builtins_keep_working_next_to_a_broken_plugin(odd_registry: Registry) -> None:
    from lerobot_kit.core.checkpoint.weights import CheckpointFormat
    from lerobot_kit.plugins.policies.act.configuration import ACTConfig
    from lerobot_kit.plugins.policies.act.modeling import ACTPolicy

    act = odd_registry.policy("act")
    assert (act.config_class, act.load(), act.plugin.name) == (ACTConfig, ACTPolicy, "act")
    assert isinstance(odd_registry.checkpoint_format("safetensors"), CheckpointFormat)
    assert odd_registry.names("checkpoint_format") == [
        "abstract_format", "dcp", "not_a_format", "safetensors", "safetensors_dcp"]
    with pytest.raises(PluginError, match=r"unknown dataset 'not_a_datset'. Did you mean 'not_a_dataset'\?"):
        odd_registry.dataset("not_a_datset")
    with pytest.raises(PluginError, match=r"unknown policy 'not_callable'"):  # a dataset's name is no policy
        odd_registry.policy("not_callable")


def test_a_config_class_that_is_not_a_config_is_refused_at_registration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = ODD_PLUGIN.replace('register("not_callable", OddDataConfig', 'register("not_callable", dict')
    monkeypatch.syspath_prepend(str(make_distribution(tmp_path / "site", "oddplug", source)))
    fresh_registry(monkeypatch)
    try:
        with pytest.raises(PluginError, match=r"plugin 'oddplug' \(oddplug\): the config class of dataset "
                                              r"'not_callable' is <class 'dict'>, not a subclass of "
                                              r"lerobot_kit.api.DatasetConfig"):
            get_registry()
    finally:
        sys.modules.pop("oddplug", None)


def test_every_contract_the_registry_checks_is_declared_by_the_class_the_api_exports_under_its_name() -> None:
    """The registry imports none of the layers it registers: each of them declares its base class to it
    (``@contract``), so what the registry checks a target against is the API's class of that name."""
    from lerobot_kit import api
    from lerobot_kit.core.registry.contracts import CONTRACTS, declared

    exported = {name: getattr(api, name) for name in CONTRACTS}  # imports each class, and so declares it
    assert {name: declared(name) for name in CONTRACTS} == exported
