"""Plugin discovery through real entry points (a distribution on sys.path), as pip would install it."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli
from lerobot_kit.core.registry import hookspecs
from plugin_dists import env_with, make_distribution

PLUGIN_MODULE = '''
from typing import Callable
from pydantic import Field
from lerobot_kit.api import DatasetConfig, PolicyConfig, hookimpl

class TinyConfig(PolicyConfig):
    type: str = "tiny"
    width: int = Field(8, description="Width of the tiny policy.")

class TinyDataConfig(DatasetConfig):
    type: str = "tinydata"

@hookimpl
def lerobot_register_policies(register: Callable) -> None:
    register("tiny", TinyConfig, "tinyplug_impl:TinyPolicy")

@hookimpl
def lerobot_register_datasets(register: Callable) -> None:
    register("tinydata", TinyDataConfig, "tinyplug_impl:make")

@hookimpl
def lerobot_register_checkpoint_formats(register: Callable) -> None:
    register("tinyformat", "tinyplug_impl:Format")

@hookimpl
def lerobot_register_launchers(register: Callable) -> None:
    register("tinylauncher", "tinyplug_impl:Launcher")
'''


def test_every_hook_is_registered_by_a_third_party_plugin_and_listed(tmp_path):
    site = make_distribution(tmp_path / "site", "tinyplug", PLUGIN_MODULE)
    result = run_cli("plugins", "--json", env=env_with(site))
    assert result.returncode == 0, result.stderr
    rows = {row["plugin"]: row for row in json.loads(result.stdout)}
    tiny = rows["tinyplug"]
    assert (tiny["package"], tiny["version"], tiny["builtin"]) == ("tinyplug", "1.2.3", False)
    kinds = {item["kind"]: item["name"] for item in tiny["registered"]}
    assert kinds == {"policy": "tiny", "dataset": "tinydata", "checkpoint_format": "tinyformat",
                     "launcher": "tinylauncher"}
    assert set(kinds) == set(hookspecs.HOOK_KINDS.values())
    assert rows["act"]["builtin"] is True


def test_plugin_config_fields_are_validated_and_listed_in_help(tmp_path):
    site = make_distribution(tmp_path / "site", "tinyplug", PLUGIN_MODULE)
    result = run_cli("train", "--policy.type=tiny", "--help", env=env_with(site))
    assert result.returncode == 0, result.stderr
    assert "--policy.width  int  (default: 8)  Width of the tiny policy." in result.stdout
    bad = run_cli("train", "--policy.type=tiny", "--policy.widht=3", env=env_with(site))
    assert bad.returncode == 2
    assert "did you mean --policy.width?" in bad.stderr


def test_plugin_that_fails_to_import_is_named(tmp_path):
    site = make_distribution(tmp_path / "site", "brokenplug", "import does_not_exist_anywhere\n")
    result = run_cli("plugins", env=env_with(site))
    assert result.returncode != 0
    assert "plugin 'brokenplug' from package 'brokenplug' failed to import" in result.stderr
    assert "Traceback" not in result.stderr


def test_name_clash_names_both_plugins(tmp_path):
    clash = PLUGIN_MODULE.replace('register("tiny", TinyConfig', 'register("act", TinyConfig')
    site = make_distribution(tmp_path / "site", "clashplug", clash)
    result = run_cli("plugins", env=env_with(site))
    assert result.returncode != 0
    assert "'act' is registered by plugin 'clashplug'" in result.stderr and "plugin 'act'" in result.stderr


def test_disabled_plugins_are_not_loaded(tmp_path):
    site = make_distribution(tmp_path / "site", "brokenplug", "import does_not_exist_anywhere\n")
    result = run_cli("plugins", "--json", env=env_with(site, LEROBOT_DISABLE_PLUGINS="brokenplug,reach"))
    assert result.returncode == 0, result.stderr
    names = {row["plugin"] for row in json.loads(result.stdout)}
    assert "brokenplug" not in names and "reach" not in names and "act" in names


def test_unknown_hook_in_a_plugin_is_an_error(tmp_path):
    source = PLUGIN_MODULE + "\n@hookimpl\ndef lerobot_register_polices(register):\n    pass\n"
    site = make_distribution(tmp_path / "site", "typoplug", source)
    result = run_cli("plugins", env=env_with(site))
    assert result.returncode != 0
    assert "typoplug" in result.stderr and "unknown hook" in result.stderr


HOOK_BODY = """
import sys
from lerobot_kit.api import hookimpl

@hookimpl
def lerobot_register_policies(register):
    {}
"""
FAILURES = {
    "raises on import": ("raise RuntimeError('no licence server')", "failed to import", "RuntimeError: no licence server"),
    "exits on import": ("import sys\nsys.exit(0)", "failed to import", "called sys.exit(0)"),
    "raises in a hook": (HOOK_BODY.format("raise RuntimeError('no licence server')"),
                         "failed in lerobot_register_policies", "RuntimeError: no licence server"),
    "exits in a hook": (HOOK_BODY.format("sys.exit(0)"), "failed in lerobot_register_policies", "called sys.exit(0)"),
}


@pytest.mark.parametrize("source, where, what", FAILURES.values(), ids=FAILURES.keys())
def test_a_plugin_that_raises_or_exits_is_one_line_naming_it(tmp_path, source, where, what):
    """sys.exit(0) matters most: uncaught, the command would end silently with success."""
    site = make_distribution(tmp_path / "site", "grumpyplug", source)
    result = run_cli("plugins", env=env_with(site))
    assert (result.returncode, result.stdout) == (1, ""), result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith("error: plugin 'grumpyplug'"), line
    assert where in line and what in line and "LEROBOT_DISABLE_PLUGINS=grumpyplug" in line, line


WRONG_KIND = """
from lerobot_kit.api import PolicyConfig, hookimpl

class DictPolicyConfig(PolicyConfig):
    type: str = "dict_policy"

@hookimpl
def lerobot_register_policies(register):
    register("dict_policy", DictPolicyConfig, "collections:OrderedDict")
"""


def test_a_registered_class_of_the_wrong_kind_is_one_line_naming_the_plugin(tmp_path):
    site = make_distribution(tmp_path / "site", "oddplug", WRONG_KIND)
    result = run_cli("train", "--policy.type=dict_policy", "--dataset.num_episodes=2", "--steps=1",
                     f"--output_dir={tmp_path / 'run'}", env=env_with(site), cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith("error: plugin 'oddplug' (oddplug) registered policy 'dict_policy' as "
                           "<class 'collections.OrderedDict'>, which is not a subclass of lerobot_kit.api.Policy"), line
