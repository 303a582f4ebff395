"""The typed config tree: flags, files, polymorphic sections, errors, JSON round trip."""

from __future__ import annotations

import json

import pytest

from lerobot_kit.core.errors import ConfigError
from lerobot_kit.core.config.flags import build_train_config, flags_to_dict, parse_train_config


def test_dotted_flags_become_a_nested_dict_with_json_values():
    tree = flags_to_dict(["--a.b=1", "--a.c", "x", '--l=["A","B"]', "--n=null", '--d={"k": 2}', "--e="])
    assert tree == {"a": {"b": "1", "c": "x"}, "l": ["A", "B"], "n": None, "d": {"k": 2}, "e": ""}


def test_flags_are_typed_and_polymorphic_policy_is_picked_by_type():
    config = parse_train_config(
        ["--policy.dim_model=64", "--parallelism.dp_shard=4", '--accelerator.fsdp.wrap_modules=["Block"]',
         "--accelerator.mixed_precision=bf16", "--resume=false"]
    )
    assert type(config.policy).__name__ == "ACTConfig"
    assert config.policy.dim_model == 64
    assert config.parallelism.dp_shard == 4
    assert config.accelerator.fsdp.wrap_modules == ["Block"]
    assert config.resume is False


def test_json_round_trip_is_lossless(tmp_path):
    config = parse_train_config(["--policy.chunk_size=7", "--policy.n_action_steps=7", "--dataset.image=true", "--optimizer.betas=[0.8,0.9]"])
    path = tmp_path / "train_config.json"
    path.write_text(json.dumps(config.to_json_dict()))
    again = parse_train_config([f"--config_path={path}"])
    assert again.config_path == str(path)  # where it was read from; never written into the file
    assert again.model_copy(update={"config_path": None}) == config
    assert again.to_json_dict() == config.to_json_dict()
    assert type(again.dataset).__name__ == "ReachDatasetConfig" and again.dataset.image is True


def test_flags_override_the_config_file(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"steps": 5, "policy": {"type": "act", "dim_model": 32}, "batch_size": 3}))
    config = parse_train_config([f"--config_path={path}", "--steps=9", "--policy.n_heads=2"])
    assert (config.steps, config.batch_size, config.policy.dim_model, config.policy.n_heads) == (9, 3, 32, 2)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--policy.dim_modl=3"], "--policy.dim_modl: unknown flag; did you mean --policy.dim_model?"),
        (["--stepz=3"], "--stepz: unknown flag; did you mean --steps?"),
        (["--accelerator.fsdp.reshard_after_forwrd=true"], "did you mean --accelerator.fsdp.reshard_after_forward?"),
        (["--steps=abc"], "--steps: Input should be a valid integer"),
        (["--steps="], "--steps: Input should be a valid integer"),  # empty is a value, not JSON
        (["--accelerator.mixed_precision=fp8"], "--accelerator.mixed_precision: Input should be 'no', 'bf16' or 'fp16'"),
        (["--policy.type=actt"], "--policy.type: unknown policy 'actt'. Did you mean 'act'?"),
        (["--checkpoint_format=dcpp"], "Did you mean 'dcp'?"),
        (["--config_path=/nonexistent/x.json"], "--config_path=/nonexistent/x.json: missing"),
        (["--optimizer.lr=1e39"], "--optimizer.lr: Value error, 1e+39 is beyond float32's range (3.4e38)"),
        (["--optimizer.lr=nan"], "--optimizer.lr: Input should be a finite number"),
        (["--optimizer.betas=[0.9,1.5]"], "--optimizer.betas: Value error, each beta must lie in [0, 1), got [0.9, 1.5]"),
        (["--dataset.sampler.block_size=4"], "--dataset.sampler: Value error, block_size applies to "
         "type=episode_blocks only, so with type=random it would be ignored"),
    ],
)
def test_bad_input_is_one_line_per_problem_naming_the_flag(args, expected):
    with pytest.raises(ConfigError) as info:
        parse_train_config(args)
    assert expected in str(info.value)
    assert info.value.exit_code == 2


def test_a_recorded_config_of_a_random_sampler_loads_again(tmp_path):
    """A recorded config lists the block options at their defaults; that is not setting them."""
    recorded = tmp_path / "train_config.json"
    recorded.write_text(parse_train_config([]).model_dump_json())
    assert parse_train_config([f"--config_path={recorded}"]).dataset.sampler.block_size == 16


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as info:
        parse_train_config(["--steps=x", "--batch_size=y", "--policy.nope=1"])
    lines = str(info.value).splitlines()
    assert len(lines) == 3 and all(line.startswith("--") for line in lines)


def test_dataset_repo_id_selects_the_lerobot_format_type():
    config = build_train_config({"dataset": {"repo_id": "user/data"}})
    assert config.dataset.type == "lerobot"
