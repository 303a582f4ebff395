"""Plugin discovery through real entry points (a distribution on sys.path), as pip would install it."""

from __future__ import annotations

import json
import subprocess

import pytest

from _dist_util import free_port
from conftest import TINY_ACT, launch_env, run_cli, script
from lerobot_kit.core.registry import hookspecs
from plugin_dists import env_with, make_distribution

pytestmark = pytest.mark.fast  # starts no training run: the inner loop (-m "not slow") runs it

PLUGIN_MODULE = '''
from typing import Callable
from pydantic import Field
from lerobot_kit.api import DatasetConfig, EnvConfig, PolicyConfig, hookimpl

class TinyConfig(PolicyConfig):
    type: str = "tiny"
    width: int = Field(8, description="Width of the tiny policy.")

class TinyDataConfig(DatasetConfig):
    type: str = "tinydata"

class TinyEnvConfig(EnvConfig):
    type: str = "tinyenv"
    size: int = Field(3, description="Size of the tiny environment.")

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

@hookimpl
def lerobot_register_envs(register: Callable) -> None:
    register("tinyenv", TinyEnvConfig, "tinyplug_impl:TinyEnv")
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
                     "launcher": "tinylauncher", "env": "tinyenv"}
    assert set(kinds) == set(hookspecs.HOOK_KINDS.values())
    assert rows["act"]["builtin"] is True


# A launcher of a third-party scheduler that exports its own variables, not torch's.
LAUNCHER_MODULE = '''
from typing import Callable
from lerobot_kit.api import LaunchEnv, Launcher, env_int
from lerobot_kit.core.registry.hookspecs import hookimpl

class TinyLauncher(Launcher):
    name = "tinylauncher"
    priority = 5

    @classmethod
    def detect(cls, env):
        return "TINY_TASK_ID" in env

    @classmethod
    def read(cls, env):
        host, port = env["TINY_RENDEZVOUS"].split(":")
        rank = env_int(env, "TINY_TASK_ID")
        return LaunchEnv(rank=rank, local_rank=rank, world_size=env_int(env, "TINY_NUM_TASKS"),
                         master_addr=host, master_port=int(port))

@hookimpl
def lerobot_register_launchers(register: Callable) -> None:
    register("tinylauncher", TinyLauncher)
'''


@pytest.mark.slow  # two training processes
def test_a_third_party_launcher_starts_a_two_process_run(tmp_path):
    """Two `lerobot train` processes that only the plugin's variables describe: the plugin
    recognises them, and they form one two-rank FSDP job."""
    site = make_distribution(tmp_path / "site", "tinylaunch", LAUNCHER_MODULE)
    out = tmp_path / "run"
    rendezvous = f"127.0.0.1:{free_port()}"
    env = {**launch_env(tmp_path), **env_with(site), "TINY_NUM_TASKS": "2", "TINY_RENDEZVOUS": rendezvous}
    train = [script("lerobot"), "train", f"--output_dir={out}", *TINY_ACT, "--parallelism.dp_shard=2",
             "--steps=2", "--save_freq=2"]
    logs = [tmp_path / f"task{rank}.log" for rank in (0, 1)]
    procs = []
    for rank, log in enumerate(logs):
        with log.open("w") as handle:
            procs.append(subprocess.Popen(train, stdout=handle, stderr=subprocess.STDOUT, cwd=tmp_path,
                                          env={**env, "TINY_TASK_ID": str(rank)}))
    try:
        for proc in procs:
            proc.wait(timeout=180)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    outputs = [log.read_text() for log in logs]
    assert [p.returncode for p in procs] == [0, 0], [text[-2000:] for text in outputs]
    assert "layout fsdp | world 2 (dp_replicate 1 × dp_shard 2) | launcher tinylauncher" in outputs[0]
    step = json.loads((out / "checkpoints/last/training_state/training_step.json").read_text())
    assert step["topology"]["world_size"] == 2


def test_plugin_config_fields_are_validated_and_listed_in_help(tmp_path):
    site = make_distribution(tmp_path / "site", "tinyplug", PLUGIN_MODULE)
    result = run_cli("train", "--policy.type=tiny", "--help", env=env_with(site))
    assert result.returncode == 0, result.stderr
    assert "--policy.width  int  (default: 8)  Width of the tiny policy." in result.stdout
    env_help = run_cli("eval", "--env.type=tinyenv", "--help", env=env_with(site))
    assert env_help.returncode == 0, env_help.stderr
    assert "--env.size  int  (default: 3)  Size of the tiny environment." in env_help.stdout
    bad = run_cli("train", "--policy.type=tiny", "--policy.widht=3", env=env_with(site))
    assert bad.returncode == 2
    assert "did you mean --policy.width?" in bad.stderr


def test_plugin_that_fails_to_import_is_named(tmp_path):
    site = make_distribution(tmp_path / "site", "brokenplug", "import does_not_exist_anywhere\n")
    result = run_cli("plugins", env=env_with(site))
    assert result.returncode == 1, result.stderr
    assert "plugin 'brokenplug' from package 'brokenplug' failed to import" in result.stderr
    assert "Traceback" not in result.stderr


def test_name_clash_names_both_plugins(tmp_path):
    clash = PLUGIN_MODULE.replace('register("tiny", TinyConfig', 'register("act", TinyConfig')
    site = make_distribution(tmp_path / "site", "clashplug", clash)
    result = run_cli("plugins", env=env_with(site))
    assert result.returncode == 1, result.stderr
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
    assert result.returncode == 1, result.stderr
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
