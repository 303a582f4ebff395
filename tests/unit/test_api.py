"""``lerobot_kit.api``: light to import, complete, and enough for a notebook to go from flags to a reloaded policy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import lerobot_kit.api as api
from conftest import TINY_ACT

# The promised surface. Removing or renaming one of these breaks plugins: it has to be a
# deliberate change here, not a side effect of reorganising core.
STABLE = {
    "hookimpl", "TrainConfig", "PolicyConfig", "DatasetConfig", "parse_train_config", "build_dataset",
    "build_policy", "load_pretrained", "load_peft_model", "merge_adapter", "Policy", "PolicyProcessor", "PolicyDataset", "InMemoryDataset", "DatasetMeta", "FeatureSpec",
    "compute_stats", "STATE_KEY", "ACTION_KEY", "IMAGE_PREFIX", "pad_key", "INDEX_KEY", "EPOCH_KEY", "CheckpointFormat", "write_gathered",
    "write_shards", "load_any_weights", "read_safetensors", "is_peft_model", "MODEL_WEIGHTS", "ADAPTER_WEIGHTS",
    "DCP_MODEL_DIR", "ModelWeights", "model_weights", "gathered_state", "write_weights_file", "load_state",
    "Launcher", "LaunchEnv", "env_int", "LerobotError", "ConfigError", "CheckpointError",
    "PluginError", "EnvConfig", "VectorEnv", "WeightShapes",
    # What the built-in plugins need beyond the above (they import nothing else):
    "STAT_NAMES", "vector_stats", "PixelStats", "camera_to_float", "EpisodeWindows", "expand_delta_indices",
    "ALL_CAMERAS", "ALL_OBSERVATIONS",
    "DEFAULT_MASTER_PORT", "Observation", "Info", "feature_dims",
    "train",  # what `lerobot train` runs, for notebooks and sweeps (docs/parallelism.md)
    "UnitGroup",
    # Mixtures: the member of a sample, a missing camera's flag, a policy's per-sample losses.
    "MEMBER_KEY", "missing_key", "PER_SAMPLE_LOSS", "MixtureDataset", "MixtureMember", "member_delta_indices",
    # A plugin's JSON-valued flags (the LeRobot plugin's --dataset.mixture), read as the config's own.
    "decode_json", "read_json_file", "UnusableJson",
    # A plugin's own JSON files (the LeRobot plugin's dataset metadata): one line of its error each;
    # those it reads its own way or writes (its column cache's manifest), as the core's are;
    # byte counts in its messages, written as the core's are.
    "read_json", "decode_json_bytes", "write_json", "byte_size",
    # Files a plugin hands a library (the LeRobot bridge's tokenizer folders): never a named pipe.
    "open_regular", "NotRegularFile", "not_a_file_problem",
}

LAZY = {"Policy", "PolicyProcessor", "CheckpointFormat", "write_gathered", "write_shards", "load_any_weights", "read_safetensors",
        "is_peft_model", "ModelWeights", "model_weights", "gathered_state", "write_weights_file",
        "load_state", "feature_dims", "train", "PER_SAMPLE_LOSS"}
TORCH_FREE = f"""
import sys
from lerobot_kit.api import {", ".join(sorted(STABLE - LAZY))}
torch_modules = sorted(m for m in sys.modules if m.split(".")[0] == "torch")
from lerobot_kit.api import Policy
print(torch_modules, "torch" in sys.modules, Policy.__name__)
"""


def test_importing_the_api_imports_no_torch_until_a_torch_backed_name_is_used() -> None:
    result = subprocess.run([sys.executable, "-c", TORCH_FREE], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[]", "True", "Policy"]


def test_every_stable_name_is_exported_and_resolves() -> None:
    assert set(api.__all__) == STABLE
    assert dir(api) == sorted(STABLE)
    assert all(getattr(api, name) is not None for name in STABLE)
    assert issubclass(api.Policy, __import__("torch").nn.Module)
    with pytest.raises(AttributeError, match="has no attribute 'make_policy'"):
        api.make_policy  # noqa: B018 - internal names stay internal


def test_flags_to_dataset_to_policy_to_reloaded_policy(tmp_path: Path) -> None:
    import torch

    from lerobot_kit.core.checkpoint.pretrained import save_pretrained
    from lerobot_kit.core.model.processor import make_processors

    config = api.parse_train_config(
        ["--policy.type=act", *TINY_ACT, "--dataset.num_episodes=2", "--dataset.episode_length=12"]
    )
    dataset = api.build_dataset(config)
    assert isinstance(dataset, api.PolicyDataset) and len(dataset) == 24
    item = dataset[11]  # last frame of episode 0: the chunk runs past the end
    assert item[api.ACTION_KEY].shape[0] == config.policy.chunk_size == 5
    assert item[api.pad_key(api.ACTION_KEY)].tolist() == [False, True, True, True, True]

    torch.manual_seed(0)
    policy = api.build_policy(config.policy, dataset.meta)
    assert isinstance(policy, api.Policy) and policy.config is config.policy
    pre, post = make_processors(config.policy, dataset.meta)
    save_pretrained(policy, dataset.meta, pre, post, policy.state_dict(), tmp_path / "pretrained_model")

    loaded, _, _ = api.load_pretrained(str(tmp_path / "pretrained_model"))
    assert type(loaded) is type(policy)
    for name, tensor in policy.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name


def test_bad_flags_are_a_config_error() -> None:
    with pytest.raises(api.ConfigError, match="did you mean --policy.dim_model"):
        api.parse_train_config(["--policy.type=act", "--policy.dim_modle=3"])
