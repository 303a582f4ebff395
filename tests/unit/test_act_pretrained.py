"""save_pretrained -> load_pretrained: bitwise weights, processors and actions; clear load errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lerobot_kit.core.layout import paths as L
from lerobot_kit.core.data.dataset import DatasetMeta
from lerobot_kit.core.errors import CheckpointError, PluginError
from lerobot_kit.core.model.policy import make_policy
from lerobot_kit.core.checkpoint.pretrained import load_pretrained, save_pretrained
from lerobot_kit.core.model.processor import make_processors
from lerobot_kit.plugins.datasets.reach.plugin import ReachDatasetConfig
from lerobot_kit.plugins.datasets.reach.data import make_reach_dataset
from lerobot_kit.plugins.policies.act.configuration import ACTConfig
from lerobot_kit.plugins.policies.act.modeling import ACTPolicy

CONFIG = ACTConfig(dim_model=32, dim_feedforward=64, n_encoder_layers=2, n_vae_encoder_layers=1, latent_dim=8,
                   chunk_size=6, n_action_steps=2, normalization="min_max")


@pytest.fixture(scope="module")
def trained():
    """A policy moved away from its init by a few steps, with its processors."""
    dataset = make_reach_dataset(ReachDatasetConfig(num_episodes=4, episode_length=20, image=True, image_size=16),
                                 CONFIG.delta_indices())
    pre, post = make_processors(CONFIG, dataset.meta)
    torch.manual_seed(0)
    policy = make_policy(CONFIG, dataset.meta)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    for start in range(0, 40, 8):
        loss, _ = policy(pre(torch.utils.data.default_collate([dataset[i] for i in range(start, start + 8)])))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return dataset, policy, pre, post


def _save(trained, directory: Path, weights: bool = True) -> None:
    dataset, policy, pre, post = trained
    save_pretrained(policy, dataset.meta, pre, post, policy.state_dict() if weights else None, directory)


def _rollout(policy, pre, post, observations) -> list[torch.Tensor]:
    policy.reset()
    return [post({"action": policy.select_action(pre(obs))})["action"] for obs in observations]


def test_round_trip_is_bitwise(trained, tmp_path: Path) -> None:
    dataset, policy, pre, post = trained
    step_dir = tmp_path / "checkpoints" / "000005"
    _save(trained, step_dir / L.PRETRAINED_DIR)
    names = {p.name for p in (step_dir / L.PRETRAINED_DIR).iterdir()}
    assert {L.POLICY_CONFIG, L.DATASET_META, L.MODEL_WEIGHTS, "policy_preprocessor.json",
            "policy_postprocessor.json"} <= names
    saved_config = json.loads((step_dir / L.PRETRAINED_DIR / L.POLICY_CONFIG).read_text())
    assert saved_config["type"] == "act" and ACTConfig.model_validate(saved_config) == CONFIG

    loaded, loaded_pre, loaded_post = load_pretrained(step_dir)  # a step folder works as well as pretrained_model/
    assert isinstance(loaded, ACTPolicy) and loaded.config == CONFIG
    original_sd, loaded_sd = policy.state_dict(), loaded.state_dict()
    assert original_sd.keys() == loaded_sd.keys()
    for key, tensor in original_sd.items():
        assert torch.equal(tensor, loaded_sd[key]), key
    assert loaded.meta.to_json() == dataset.meta.to_json()
    for a, b in ((pre, loaded_pre), (post, loaded_post)):
        for key, tensor in a.steps[0].state_dict().items():
            assert torch.equal(tensor, b.steps[0].state_dict()[key])

    raw = [{"observation.state": dataset[i]["observation.state"][None], "observation.images.top":
            dataset[i]["observation.images.top"][None]} for i in range(5)]
    expected = _rollout(policy, pre, post, raw)
    got = _rollout(loaded, loaded_pre, loaded_post, raw)
    assert all(torch.equal(a, b) for a, b in zip(expected, got)) and expected[0].shape == (1, 2)


def test_weights_are_contiguous_cpu_copies(trained, tmp_path: Path) -> None:
    dataset, policy, pre, post = trained
    state = {k: v.t() if v.dim() == 2 else v for k, v in policy.state_dict().items()}  # non-contiguous views
    save_pretrained(policy, dataset.meta, pre, post, state, tmp_path)
    from safetensors.torch import load_file

    for key, value in load_file(str(tmp_path / L.MODEL_WEIGHTS)).items():
        assert torch.equal(value, state[key])


def test_dcp_only_folder_asks_for_convert_dcp(trained, tmp_path: Path) -> None:
    step_dir = tmp_path / "000010"
    pretrained = step_dir / L.PRETRAINED_DIR
    _save(trained, pretrained, weights=False)
    (pretrained / L.DCP_MODEL_DIR).mkdir()
    with pytest.raises(CheckpointError, match="convert-dcp") as err:
        load_pretrained(pretrained)
    assert f"--checkpoint_dir={step_dir}" in str(err.value)
    policy, _, _ = load_pretrained(pretrained, load_weights=False)
    assert isinstance(policy, ACTPolicy)


def test_broken_folders_are_checkpoint_errors(trained, tmp_path: Path) -> None:
    dataset, policy, pre, post = trained
    _save(trained, tmp_path / "a", weights=False)
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        load_pretrained(tmp_path / "a")
    wrong = dict(policy.state_dict())
    wrong.pop("action_head.bias")
    save_pretrained(policy, dataset.meta, pre, post, wrong, tmp_path / "b")
    with pytest.raises(CheckpointError, match="action_head.bias"):
        load_pretrained(tmp_path / "b")
    _save(trained, tmp_path / "c")
    (tmp_path / "c" / L.DATASET_META).unlink()
    with pytest.raises(CheckpointError, match="dataset_meta.json: missing"):
        load_pretrained(tmp_path / "c")


def test_unknown_policy_type_is_a_plugin_error(trained) -> None:
    dataset = trained[0]
    with pytest.raises(PluginError, match="unknown policy 'actt'. Did you mean 'act'"):
        make_policy(ACTConfig(type="actt"), dataset.meta)


def test_meta_survives_json(trained, tmp_path: Path) -> None:
    _save(trained, tmp_path)
    meta = DatasetMeta.from_json(json.loads((tmp_path / L.DATASET_META).read_text()))
    assert meta.image_keys() == ["observation.images.top"]


def test_load_pretrained_weights_into_a_fresh_policy(trained, tmp_path: Path) -> None:
    from lerobot_kit.core.checkpoint.pretrained import load_pretrained_weights

    dataset, policy, _, _ = trained
    _save(trained, tmp_path / "000003" / L.PRETRAINED_DIR)
    fresh = make_policy(CONFIG, dataset.meta)
    load_pretrained_weights(fresh, tmp_path / "000003")
    assert all(torch.equal(a, b) for a, b in zip(policy.state_dict().values(), fresh.state_dict().values()))
    other = make_policy(CONFIG.model_copy(update={"dim_model": 16}), dataset.meta)
    with pytest.raises(CheckpointError, match="does not fit this ACTPolicy"):
        load_pretrained_weights(other, tmp_path / "000003")


def test_invalid_saved_config_is_a_checkpoint_error(trained, tmp_path: Path) -> None:
    _save(trained, tmp_path)
    saved = json.loads((tmp_path / L.POLICY_CONFIG).read_text())
    (tmp_path / L.POLICY_CONFIG).write_text(json.dumps({**saved, "chunk_size": 0}))
    with pytest.raises(CheckpointError, match="not a valid 'act' config"):
        load_pretrained(tmp_path)
