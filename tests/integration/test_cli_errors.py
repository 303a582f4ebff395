"""The commands' error boundary, through the console script: a user's problem is one line
and exit code 1 or 2; a bug is one line saying so and exit code 70; ``LEROBOT_KIT_DEBUG=1``
prints the traceback of either; ``--json`` commands answer with one JSON object whatever fails."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli
from plugin_dists import env_with, make_distribution
from test_inspect_checkpoint import write_checkpoint

from lerobot_kit.core.layout import paths as L

pytestmark = pytest.mark.fast  # starts no training run: the inner loop (-m "not slow") runs it

# A third-party policy with bugs: ACT whose loss, and whose offline weight shapes, divide by zero.
BUGGY_PLUGIN = '''
from typing import Callable
from lerobot_kit.api import hookimpl
from lerobot_kit.plugins.policies.act.configuration import ACTConfig
from lerobot_kit.plugins.policies.act.modeling import ACTPolicy

class BuggyConfig(ACTConfig):
    type: str = "buggy"

    def weight_shapes(self, meta):
        return 1 // 0

class BuggyPolicy(ACTPolicy):
    config_class = BuggyConfig

    def forward(self, batch):
        return 1 // 0

@hookimpl
def lerobot_register_policies(register: Callable) -> None:
    register("buggy", BuggyConfig, BuggyPolicy)
'''
TINY = ["--policy.dim_model=16", "--policy.dim_feedforward=32", "--policy.n_encoder_layers=1",
        "--policy.n_decoder_layers=1", "--policy.n_vae_encoder_layers=1", "--batch_size=2", "--num_workers=0"]
REPORT = "this is a bug in lerobot-kit or one of its plugins, not in your input"


@pytest.fixture(scope="module")
def buggy(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return env_with(make_distribution(tmp_path_factory.mktemp("site"), "buggyplug", BUGGY_PLUGIN))


def test_a_bug_exits_70_with_one_line_that_says_how_to_report_it(buggy: dict[str, str], tmp_path: Path) -> None:
    result = run_cli("train", "--policy.type=buggy", *TINY, "--steps=2", f"--output_dir={tmp_path / 'run'}",
                     env=buggy)
    assert result.returncode == 70, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        "error: internal error: ZeroDivisionError: integer division or modulo by zero; " + REPORT
        + ": please report it with the command you ran and the traceback that LEROBOT_KIT_DEBUG=1 prints"
    ]
    assert "Traceback" not in result.stderr


def test_debug_prints_the_traceback_of_a_bug(buggy: dict[str, str], tmp_path: Path) -> None:
    result = run_cli("train", "--policy.type=buggy", *TINY, "--steps=2", f"--output_dir={tmp_path / 'run'}",
                     env={**buggy, "LEROBOT_KIT_DEBUG": "1"})
    assert result.returncode == 70
    assert "Traceback (most recent call last)" in result.stderr
    assert "return 1 // 0" in result.stderr  # the plugin's own frame
    assert result.stderr.splitlines()[-1].startswith("error: internal error: ZeroDivisionError")


def test_debug_prints_the_traceback_and_the_cause_of_a_one_line_error(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    args = ("train", f"--policy.path={missing}", "--steps=2", f"--output_dir={tmp_path / 'run'}")
    plain = run_cli(*args)
    debug = run_cli(*args, env={"LEROBOT_KIT_DEBUG": "1"})
    assert plain.returncode == debug.returncode != 0
    assert len(plain.stderr.splitlines()) == 1 and plain.stderr.startswith("error: ")
    assert "Traceback (most recent call last)" in debug.stderr
    assert debug.stderr.splitlines()[-1] == plain.stderr.splitlines()[0]


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (("plan", "--json", "--world_size=2", "--steps=zero"), 2, "--steps"),
        (("plan", "--json"), 2, "--world_size=N"),
        (("inspect-checkpoint", "--json", "/nonexistent/checkpoint"), 2, "no such checkpoint folder"),
    ],
)
def test_json_commands_answer_a_failure_with_one_json_object(args: tuple[str, ...], code: int, words: str) -> None:
    result = run_cli(*args)
    assert result.returncode == code
    answer = json.loads(result.stdout)
    assert answer["ok"] is False and answer["exit_code"] == code and words in answer["error"]
    assert answer["problems"] == answer["error"].splitlines()


def test_a_bug_under_json_is_one_json_object_too(buggy: dict[str, str], tmp_path: Path) -> None:
    """inspect-checkpoint asks the policy's config for its weight shapes: a plugin's bug there."""
    from lerobot_kit.api import build_dataset, parse_train_config

    step_dir = write_checkpoint(tmp_path / "run")
    (step_dir / L.PRETRAINED_DIR / L.POLICY_CONFIG).write_text(json.dumps({"type": "buggy"}))
    meta = build_dataset(parse_train_config([])).meta  # the embedded data's features: a valid dataset_meta.json
    (step_dir / L.PRETRAINED_DIR / L.DATASET_META).write_text(json.dumps(meta.to_json()))
    result = run_cli("inspect-checkpoint", "--json", str(step_dir), env=buggy)
    assert result.returncode == 70
    answer = json.loads(result.stdout)
    assert answer["ok"] is False and answer["exit_code"] == 70
    assert answer["error"].startswith("internal error: ZeroDivisionError: integer division or modulo by zero; ")


def test_a_run_larger_than_the_machine_is_one_line_not_a_bug(tmp_path: Path) -> None:
    """The embedded data of 10**15 episodes cannot be generated: the machine's answer, exit 1."""
    result = run_cli("train", "--dataset.num_episodes=1000000000000000", "--steps=1", f"--output_dir={tmp_path / 'run'}")
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "error: out of memory: the run asked for more memory than this machine could give; lower the sizes the "
        "flags set (--batch_size, the policy's widths, --dataset sizes, --num_workers)"
    ]
    assert not (tmp_path / "run").exists()
