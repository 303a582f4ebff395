"""ACT: shapes, gradients, precision, meta-device init, FSDP-safety, action queue, learning."""

from __future__ import annotations

import re
import sys
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from conftest import assert_meta_build_equals_cpu_build
from lerobot_kit.core.config.schema import PolicyConfig
from lerobot_kit.core.errors import ConfigError
from lerobot_kit.core.model.policy import PER_SAMPLE_LOSS, make_policy
from lerobot_kit.core.model.processor import make_processors
from lerobot_kit.plugins.datasets.reach.plugin import ReachDatasetConfig
from lerobot_kit.plugins.datasets.reach.data import make_reach_dataset
from lerobot_kit.plugins.policies.act.configuration import ACTConfig
from lerobot_kit.plugins.policies.act.modeling import ACTDecoderLayer, ACTEncoderLayer, ACTPolicy

TINY = dict(dim_model=32, n_heads=4, dim_feedforward=64, n_encoder_layers=2, n_vae_encoder_layers=1,
            latent_dim=8, chunk_size=6, n_action_steps=3, dropout=0.1)


def _setup(image: bool, **overrides: object):
    config = ACTConfig(**{**TINY, **overrides})
    dataset = make_reach_dataset(ReachDatasetConfig(num_episodes=3, episode_length=20, image=image, image_size=16),
                                 config.delta_indices())
    pre, _ = make_processors(config, dataset.meta)
    batch = pre(torch.utils.data.default_collate([dataset[i] for i in (0, 9, 17, 19, 35)]))
    return config, dataset, batch


@pytest.mark.parametrize("image", [False, True])
@pytest.mark.parametrize("use_vae", [False, True])
@pytest.mark.parametrize("pre_norm", [False, True])
def test_forward_backward_reaches_every_parameter(image: bool, use_vae: bool, pre_norm: bool) -> None:
    config, dataset, batch = _setup(image, use_vae=use_vae, pre_norm=pre_norm)
    torch.manual_seed(0)
    policy = make_policy(config, dataset.meta)
    assert isinstance(policy, ACTPolicy) and hasattr(policy, "backbone") == image
    loss, metrics = policy(batch)
    assert loss.shape == () and torch.isfinite(loss)
    assert set(metrics) == {"l1_loss", "kld_loss", PER_SAMPLE_LOSS}
    assert not any(m.requires_grad for m in metrics.values())
    assert (metrics["kld_loss"] > 0) == use_vae
    expected = metrics["l1_loss"] + config.kl_weight * metrics["kld_loss"]
    torch.testing.assert_close(loss.detach(), expected)
    loss.backward()
    missing = [n for n, p in policy.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing, f"no finite gradient for {missing}"
    policy.eval()
    chunk = policy.predict_action_chunk(batch)
    assert chunk.shape == (5, config.chunk_size, 2)


def test_padded_actions_do_not_count() -> None:
    config, dataset, batch = _setup(False, use_vae=False, dropout=0.0)
    torch.manual_seed(0)
    policy = make_policy(config, dataset.meta)
    assert batch["action_is_pad"].any()
    loss, _ = policy(batch)
    garbled = dict(batch, action=torch.where(batch["action_is_pad"][..., None], 1e6, batch["action"]))
    assert torch.equal(policy(garbled)[0], loss)


def test_bf16_autocast_runs_and_is_close_to_fp32() -> None:
    config, dataset, batch = _setup(True, dropout=0.0, use_vae=False)
    torch.manual_seed(0)
    policy = make_policy(config, dataset.meta)
    full, _ = policy(batch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        half, metrics = policy(batch)
    half.backward()
    assert half.dtype == torch.float32 and torch.isfinite(half)
    assert abs(half.item() - full.item()) < 0.05 * full.item()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in policy.parameters())


def test_same_seed_same_weights_and_loss() -> None:
    config, dataset, batch = _setup(True)
    losses = []
    for _ in range(2):
        torch.manual_seed(3)
        policy = make_policy(config, dataset.meta)
        losses.append(policy(batch)[0])  # training mode: dropout and the VAE sample draw from the RNG
    assert torch.equal(losses[0], losses[1])


def test_meta_device_build_then_init_weights_equals_a_cpu_build() -> None:
    config, dataset, _ = _setup(True)
    assert_meta_build_equals_cpu_build(lambda: make_policy(config, dataset.meta))


def test_wrap_units_are_disjoint_layers() -> None:
    config, dataset, _ = _setup(True)
    policy = make_policy(config, dataset.meta)
    assert ACTPolicy._fsdp_wrap_modules == ["ACTEncoderLayer", "ACTDecoderLayer"]
    units = [m for m in policy.modules() if isinstance(m, (ACTEncoderLayer, ACTDecoderLayer))]
    assert len(units) == config.n_encoder_layers + config.n_vae_encoder_layers + config.n_decoder_layers
    seen: set[int] = set()
    for unit in units:
        ids = {id(p) for p in unit.parameters()}
        assert not ids & seen, "a parameter is shared between two wrap units"
        seen |= ids
    linears = [name for name, m in policy.named_modules() if isinstance(m, torch.nn.Linear)]
    targeted = {name.rsplit(".", 1)[-1] for name in linears if re.fullmatch(ACTPolicy.default_peft_targets, name)}
    assert targeted == {"q_proj", "k_proj", "v_proj", "out_proj", "linear1", "linear2"}


def test_select_action_pops_a_queue_of_n_action_steps() -> None:
    config, dataset, batch = _setup(False)
    obs = {"observation.state": batch["observation.state"]}
    torch.manual_seed(0)
    policy = make_policy(config, dataset.meta)
    chunk = policy.predict_action_chunk(obs)
    other = {"observation.state": torch.randn_like(obs["observation.state"])}
    first = policy.select_action(obs)
    assert first.shape == (5, 2) and not policy.training
    torch.testing.assert_close(first, chunk[:, 0])
    # The queued actions come from the first chunk, whatever the new observation says.
    for k in range(1, config.n_action_steps):
        torch.testing.assert_close(policy.select_action(other), chunk[:, k])
    torch.testing.assert_close(policy.select_action(other), policy.predict_action_chunk(other)[:, 0])
    policy.reset()
    torch.testing.assert_close(policy.select_action(obs), chunk[:, 0])


def test_config_rejects_inconsistent_shapes() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="n_action_steps=21 exceeds chunk_size=20"):
        ACTConfig(chunk_size=20, n_action_steps=21)
    with pytest.raises(ValidationError, match="not divisible by n_heads=3"):
        ACTConfig(n_heads=3)


def test_config_problems_are_config_errors() -> None:
    config, dataset, _ = _setup(False)
    with pytest.raises(ConfigError, match="n_action_steps=7 exceeds policy.chunk_size=6"):
        ACTPolicy(config.model_copy(update={"n_action_steps": 7}), dataset.meta)
    with pytest.raises(ConfigError, match="divisible"):
        ACTPolicy(config.model_copy(update={"n_heads": 5}), dataset.meta)
    with pytest.raises(ConfigError, match="ACTPolicy needs a ACTConfig"):
        ACTPolicy(PolicyConfig(type="other"), dataset.meta)  # type: ignore[arg-type]


def test_resnet18_without_torchvision_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchvision", None)  # `import torchvision` now raises ImportError
    config, dataset, _ = _setup(True)
    with pytest.raises(ConfigError, match=re.escape("needs torchvision: pip install torchvision")) as err:
        make_policy(config.model_copy(update={"vision_backbone": "resnet18"}), dataset.meta)
    assert "--policy.vision_backbone=conv" in str(err.value)


class _ResNetShape(nn.Module):
    """resnet18's outline as torchvision builds it: a stem and four stages ending in 512
    channels, then ``avgpool`` and ``fc`` (which a feature extractor must drop)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, stride=2, padding=1)
        self.relu = nn.ReLU()
        self.layer1, self.layer2 = nn.Conv2d(64, 128, 3, padding=1), nn.Conv2d(128, 256, 3, stride=2, padding=1)
        self.layer3, self.layer4 = nn.Conv2d(256, 512, 3, padding=1), nn.ReLU()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, 1000)


def test_resnet18_backbone_is_the_feature_stages_without_pretrained_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchvision is not a test dependency (each of its wheels pins one torch build), so a
    module with its ``models.resnet18`` interface stands in: what is checked is the kit's
    side, that no weights are requested (no download) and the pooling head is dropped."""
    requested = []

    def resnet18(*, weights: object) -> nn.Module:
        requested.append(weights)
        return _ResNetShape()

    monkeypatch.setitem(sys.modules, "torchvision", SimpleNamespace(models=SimpleNamespace(resnet18=resnet18)))
    config, dataset, batch = _setup(True)
    torch.manual_seed(0)
    policy = make_policy(config.model_copy(update={"vision_backbone": "resnet18"}), dataset.meta)
    assert requested == [None]
    assert [type(m) for m in policy.backbone] == [nn.Conv2d, nn.ReLU, nn.Conv2d, nn.Conv2d, nn.Conv2d, nn.ReLU]
    loss, _ = policy(batch)
    loss.backward()
    assert policy.backbone[0].weight.grad is not None and policy.backbone[0].weight.grad.abs().sum() > 0


@pytest.fixture
def one_thread():
    """One intra-op thread: on a busy 2-core runner, two spinning OpenMP threads run ~10x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_default_act_learns_the_reach_task(one_thread: None) -> None:
    """Default config, batch 8, 300 AdamW steps at the CLI's default lr (1e-4)."""
    config = ACTConfig()
    dataset = make_reach_dataset(ReachDatasetConfig(), config.delta_indices())
    pre, _ = make_processors(config, dataset.meta)
    torch.manual_seed(0)
    policy = make_policy(config, dataset.meta)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-4, weight_decay=1e-4)
    loader = torch.utils.data.DataLoader(dataset, batch_size=8, shuffle=True,
                                         generator=torch.Generator().manual_seed(0))
    losses, l1 = [], []
    batches = iter(loader)
    for _ in range(300):
        loss, metrics = policy(pre(next(batches)))
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 10.0)
        optimizer.step()
        losses.append(loss.item())
        l1.append(metrics["l1_loss"].item())
    assert sum(losses[-25:]) / 25 < 0.5 * losses[0]
    assert sum(l1[-50:]) / 50 < 0.6 * sum(l1[:10]) / 10  # the action error itself falls, not just the KL
