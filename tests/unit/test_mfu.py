"""MFU: the model FLOPs per sample counted at start, the device peak table, the log row's figures.

The count traces a fake copy of the policy; it is checked against a hand count on a model
small enough to count by hand, and against torch's own counter around a real step of the
built-in policies on real batches.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from lerobot_kit.core.config.flags import parse_train_config
from lerobot_kit.core.config.schema import AcceleratorConfig
from lerobot_kit.core.data.dataset import EPOCH_KEY
from lerobot_kit.core.data.loader import collate
from lerobot_kit.core.errors import ConfigError
from lerobot_kit.core.model.policy import make_policy
from lerobot_kit.core.model.processor import make_processors
from lerobot_kit.core.run.reporting.mfu import Peak, Utilization, compute_precision, device_peak, known_peak_tflops
from lerobot_kit.core.run.reporting.model_flops import SampleFlops, count_sample_flops, training_flops_per_sample
from lerobot_kit.plugins.datasets.reach.data import make_reach_dataset
from lerobot_kit.plugins.datasets.reach.plugin import ReachDatasetConfig
from lerobot_kit.plugins.policies.act.configuration import ACTConfig
from lerobot_kit.plugins.policies.diffusion.configuration import DiffusionConfig

IN, HIDDEN, OUT = 6, 16, 4


class LinearStack(nn.Module):
    """Two linear layers and a squared-error loss: ``(loss, logs)`` from a batch, as a policy."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(IN, HIDDEN), nn.Linear(HIDDEN, OUT)
        self.calls = 0

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        self.calls += 1
        predicted = self.second(torch.relu(self.first(batch["x"])))
        return ((predicted - batch["y"]) ** 2).mean(), {}


def one_sample() -> dict[str, torch.Tensor]:
    return {"x": torch.randn(1, IN), "y": torch.randn(1, OUT)}


@pytest.mark.parametrize("batch_size", [1, 8])
def test_a_linear_stack_costs_its_hand_count_per_sample(batch_size: int) -> None:
    # A matrix product of [n, k] by [k, m] is 2nkm FLOPs. Forward: one per layer. Backward: the
    # weight gradient of each layer, and the input gradient of each layer but the first,
    # whose input is data (autograd computes no gradient for it): 2x the forward for the
    # first layer, 3x for the second. Biases and the element-wise loss are not counted.
    first, second = 2 * IN * HIDDEN, 2 * HIDDEN * OUT
    assert training_flops_per_sample(LinearStack(), one_sample(), batch_size) == 2 * first + 3 * second


def test_the_count_leaves_the_model_its_gradients_and_the_random_streams_as_they_were() -> None:
    model, sample = LinearStack(), one_sample()
    weights = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    model.eval()
    torch.manual_seed(3)
    training_flops_per_sample(model, sample, 4)
    drawn_after = torch.rand(3)
    torch.manual_seed(3)
    assert torch.equal(drawn_after, torch.rand(3))
    assert all(torch.equal(weights[name], tensor) for name, tensor in model.state_dict().items())
    assert all(param.grad is None for param in model.parameters())
    assert model.calls == 0 and not model.training  # a copy ran, in training mode


class RandomCrop(nn.Module):
    """Reads a random offset as a Python number, as torchvision's RandomCrop does."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, kernel_size=3)

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        image = batch["image"]
        top = int(torch.randint(0, image.shape[-2] - 8 + 1, (1,)).item())
        left = int(torch.randint(0, image.shape[-1] - 8 + 1, (1,)).item())
        crop = image[..., top:top + 8, left:left + 8]
        return self.conv(crop).mean(), {}


def test_a_value_read_from_a_tensor_is_traced_as_zero() -> None:
    flops = training_flops_per_sample(RandomCrop(), {"image": torch.empty(1, 3, 12, 12)}, 2)
    # Forward and the weight gradient of a 3x3 convolution 3 -> 4 channels over a 6x6 output;
    # no input gradient (the image is data).
    assert flops == 2 * (2 * 6 * 6 * 4 * 3 * 3 * 3)


class Refuses(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(2))

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        raise RuntimeError("this policy cannot be traced\nsecond line")


class NoProducts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(()))

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return (batch["observation.state"] * self.weight).mean(), {}


def reach(policy_config: ACTConfig | DiffusionConfig, image: bool = True):
    return make_reach_dataset(ReachDatasetConfig(num_episodes=2, episode_length=12, image=image, image_size=16),
                              policy_config.delta_indices())


def test_a_policy_the_trace_cannot_follow_goes_without_flops_and_says_why() -> None:
    dataset = reach(ACTConfig())
    refused = count_sample_flops(Refuses(), dataset, lambda batch: batch, 4)
    assert refused == SampleFlops(None, "RuntimeError: this policy cannot be traced")
    nothing = count_sample_flops(NoProducts(), dataset, lambda batch: batch, 4)
    assert nothing.per_sample is None and "no matrix product" in (nothing.not_counted or "")


@pytest.mark.parametrize("policy_config", [
    ACTConfig(dim_model=32, n_heads=4, dim_feedforward=64, n_encoder_layers=2, n_vae_encoder_layers=1, latent_dim=8,
              chunk_size=6, n_action_steps=3),
    DiffusionConfig(dim_model=32, n_heads=4, dim_feedforward=64, n_layers=2, horizon=6, n_action_steps=3,
                    n_obs_steps=2, image_keypoints=8, num_train_timesteps=20),
], ids=["act", "diffusion"])
def test_built_in_policies_count_what_torch_counts_in_a_real_step(policy_config: ACTConfig | DiffusionConfig) -> None:
    dataset = reach(policy_config)
    preprocessor, _ = make_processors(policy_config, dataset.meta)
    torch.manual_seed(0)
    policy = make_policy(policy_config, dataset.meta)
    counted = count_sample_flops(policy, dataset, preprocessor, batch_size=5)
    items = [dict(dataset[i], **{EPOCH_KEY: torch.tensor(0)}) for i in (0, 4, 9, 13, 20)]
    counter = FlopCounterMode(display=False)
    with counter:
        loss, _ = policy(preprocessor(collate(items)))
        loss.backward()
    assert counted == SampleFlops(counter.get_total_flops() // 5)


# ----------------------------------------------------------------------------- the peak


@pytest.mark.parametrize(("name", "precision", "tflops"), [
    ("NVIDIA H100 80GB HBM3", "bf16", 989.4),
    ("NVIDIA H100 PCIe", "fp16", 756.0),
    ("NVIDIA H100 NVL", "bf16", 835.5),
    ("NVIDIA H200", "tf32", 494.7),
    ("NVIDIA H200 NVL", "bf16", 835.5),
    ("NVIDIA GH200 480GB", "bf16", 989.4),
    ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
    ("NVIDIA A100 80GB PCIe", "fp32", 19.5),
    ("NVIDIA A10", "bf16", 125.0),
    ("NVIDIA L40S", "bf16", 362.05),
    ("NVIDIA L4", "tf32", 60.0),
    ("NVIDIA GeForce RTX 4090", "bf16", 165.2),
    ("NVIDIA GeForce RTX 3090", "fp32", 35.6),
])
def test_known_gpus_have_their_dense_peak(name: str, precision: str, tflops: float) -> None:
    assert known_peak_tflops(name, precision) == tflops


@pytest.mark.parametrize("name", ["NVIDIA A10G", "Tesla V100-SXM2-16GB", "NVIDIA H100 80GB HBM3 MIG 1g.10gb", "cpu"])
def test_other_devices_and_mig_slices_have_no_known_peak(name: str) -> None:
    assert known_peak_tflops(name, "bf16") is None


def test_the_precision_is_the_runs_autocast_else_fsdps_else_what_fp32_products_may_use() -> None:
    assert compute_precision(AcceleratorConfig(mixed_precision="bf16"), sharded=False) == "bf16"
    assert compute_precision(AcceleratorConfig(mixed_precision="fp16"), sharded=True) == "fp16"
    fsdp_bf16 = AcceleratorConfig.model_validate({"fsdp": {"mixed_precision_policy": {"param_dtype": "bfloat16"}}})
    assert compute_precision(fsdp_bf16, sharded=True) == "bf16"
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert compute_precision(AcceleratorConfig(), sharded=False) == "fp32"
        assert compute_precision(fsdp_bf16, sharded=False) == "fp32"  # the policy applies to FSDP only
        torch.set_float32_matmul_precision("high")
        assert compute_precision(AcceleratorConfig(), sharded=True) == "tf32"
    finally:
        torch.set_float32_matmul_precision(before)


def test_a_cpu_has_no_peak_unless_given() -> None:
    cpu = torch.device("cpu")
    assert device_peak(AcceleratorConfig(), cpu, sharded=False) == Peak(
        None, "no peak known for CPU; give --accelerator.peak_tflops")
    assert device_peak(AcceleratorConfig(peak_tflops=2.5), cpu, sharded=False) == Peak(2.5, "--accelerator.peak_tflops")


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_a_peak_must_be_a_positive_number(value: str) -> None:
    with pytest.raises(ConfigError, match="--accelerator.peak_tflops"):
        parse_train_config([f"--accelerator.peak_tflops={value}"])


# ----------------------------------------------------------------------------- the log row


def test_the_row_shares_the_throughput_out_over_the_devices() -> None:
    known = Utilization(SampleFlops(3 * 10**12), Peak(200.0, "--accelerator.peak_tflops"), devices=4)
    assert known.row(samples_per_s=80.0) == pytest.approx({"model_tflops": 60.0, "mfu": 0.3})
    assert "model FLOPs 3 TFLOP per sample (forward and backward) | peak 200 TFLOP/s per device" in known.describe()
    unknown = Utilization(SampleFlops(11_800_000), Peak(None, "no peak known for CPU; give --accelerator.peak_tflops"),
                          devices=1)
    assert unknown.row(samples_per_s=1000.0) == pytest.approx({"model_tflops": 0.0118})
    assert unknown.describe() == ("model FLOPs 11.8 MFLOP per sample (forward and backward) | MFU: no peak known "
                                  "for CPU; give --accelerator.peak_tflops")
    uncounted = Utilization(SampleFlops(None, "RuntimeError: no"), Peak(1.0, "--accelerator.peak_tflops"), devices=1)
    assert uncounted.row(samples_per_s=10.0) == {}
    assert uncounted.describe() == ("model FLOPs not counted (RuntimeError: no): model_tflops and MFU left out of "
                                    "the log")
