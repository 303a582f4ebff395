"""No flag is accepted and then ignored: a field of another type, a bad config file, a
type switched over a config file — each is refused (or applied) by name, in one line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lerobot_kit.core.config.flags import parse_train_config
from lerobot_kit.core.errors import ConfigError


def reach_run_config(tmp_path: Path) -> Path:
    """A reach run's train_config.json as a run records it (the dataset's repo_id/root as null)."""
    recorded = parse_train_config(["--dataset.num_episodes=3", "--policy.dim_model=32"]).to_json_dict()
    recorded["dataset"].update(repo_id=None, root=None)  # as configs recorded before the fields moved hold them
    path = tmp_path / "train_config.json"
    path.write_text(json.dumps(recorded))
    return path


def refusal(*flags: str) -> str:
    with pytest.raises(ConfigError) as error:
        parse_train_config(list(flags))
    return str(error.value)


def test_a_field_of_another_dataset_type_is_refused_naming_the_type_from_the_config_file(tmp_path):
    config = reach_run_config(tmp_path)
    assert parse_train_config([f"--config_path={config}"]).dataset.type == "reach"  # recorded nulls mean unset
    message = refusal(f"--config_path={config}", "--dataset.repo_id=u/ds", "--dataset.root=/data")
    assert message.splitlines() == [
        "--dataset.repo_id does not apply to --dataset.type=reach (the type --config_path sets), so it would be "
        "ignored; it is a field of --dataset.type=lerobot: pass --dataset.type=lerobot too, or remove "
        "--dataset.repo_id",
        "--dataset.root does not apply to --dataset.type=reach (the type --config_path sets), so it would be "
        "ignored; it is a field of --dataset.type=lerobot: pass --dataset.type=lerobot too, or remove --dataset.root",
    ]
    assert refusal("--dataset.root=/data").startswith("--dataset.root does not apply to --dataset.type=reach, so")
    assert refusal("--policy.type=diffusion", "--policy.kl_weight=1").startswith(
        "--policy.kl_weight does not apply to --policy.type=diffusion, so it would be ignored; it is a field of "
        "--policy.type=act")


def test_a_type_flag_over_a_config_file_drops_only_the_fields_of_the_old_type(tmp_path):
    recorded = json.loads(reach_run_config(tmp_path).read_text())
    recorded["dataset"]["sampler"] = {"type": "episode_blocks", "block_size": 4}
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(recorded))
    config = parse_train_config([f"--config_path={path}", "--dataset.type=lerobot", "--dataset.repo_id=u/ds"])
    assert (config.dataset.type, config.dataset.repo_id) == ("lerobot", "u/ds")
    sampler = config.dataset.sampler  # a field every dataset type has: kept from the file
    assert (sampler.type, sampler.block_size) == ("episode_blocks", 4)
    policy = parse_train_config([f"--config_path={path}", "--policy.type=diffusion"]).policy
    assert policy.type == "diffusion"


@pytest.mark.parametrize("content, expected", [
    (b'{"steps": 5, "job_name": "caf\xe9"}', r"not UTF-8 text \(byte 0xe9 at offset 29\); save it as UTF-8 JSON"),
    (b'{"steps": 5,', r"not valid JSON \(Expecting property name enclosed in double quotes at line 1 column 13\)"),
    (b'[1, 2]', r"expected a JSON object at the top level, got a list"),
    (b'"steps"', r"expected a JSON object at the top level, got a str"),
], ids=["latin-1", "truncated", "list", "string"])
def test_a_config_file_that_is_not_a_json_object_is_one_line_naming_it(tmp_path, content, expected):
    path = tmp_path / "config.json"
    path.write_bytes(content)
    message = refusal(f"--config_path={path}")
    assert len(message.splitlines()) == 1 and message.startswith(f"--config_path={path}: "), message
    assert re.search(expected, message), message
