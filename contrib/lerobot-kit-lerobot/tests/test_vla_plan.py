"""``lerobot plan`` for LeRobot's π0.5 (and π0) at its full default size (SigLIP + gemma_2b +
gemma_300m, 4.14 B parameters) and SmolVLA at its (SmolVLM2-500M's first 16 layers and an
expert, 0.45 B) on 8 ranks, offline, with no weights, no tokenizer and no network: the model
is built on the meta device by LeRobot's own constructor."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from lerobot.configs.types import FeatureType, PolicyFeature
from lerobot.policies.pi0.configuration_pi0 import PI0Config
from lerobot.policies.pi0.modeling_pi0 import PI0Policy
from lerobot.policies.pi05.configuration_pi05 import PI05Config
from lerobot.policies.pi05.modeling_pi05 import PI05Policy
from lerobot.policies.smolvla.configuration_smolvla import SmolVLAConfig
from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

from conftest import DATA, run
from lerobot_kit_lerobot.smolvlm_shipped import shipped
from vla_assets import write_shipped_smolvlm


def lerobots_own_count(config_class: type = PI05Config, policy_class: type = PI05Policy, **fields: str) -> int:
    """LeRobot's policy at its defaults (but ``fields``) for this dataset's features, built on meta."""
    config = config_class(**fields)
    config.device = "meta"
    config.input_features = {"observation.images.top": PolicyFeature(FeatureType.VISUAL, (3, 48, 64)),
                             "observation.state": PolicyFeature(FeatureType.STATE, (3,))}
    config.output_features = {"action": PolicyFeature(FeatureType.ACTION, (3,))}
    with torch.device("meta"):
        return sum(p.numel() for p in policy_class(config).parameters())


def test_plan_pi0_full_size_counts_lerobots_parameters(work: Path, dataset_root: Path) -> None:
    result = run(["plan", "--policy.type=lerobot_pi0", "--world_size=8", "--parallelism.dp_shard=8", "--json",
                  *DATA, f"--dataset.root={dataset_root}", "--batch_size=1"], work)
    plan = json.loads(result.stdout)
    assert plan["total_params"] == lerobots_own_count(PI0Config, PI0Policy)
    assert abs(plan["per_rank"]["params_bytes"] / plan["ddp_per_rank"]["params_bytes"] - 1 / 8) < 0.001
    assert plan["activations"]["not_traced"] is None


def test_plan_pi05_full_size_on_8_ranks_offline(work: Path, dataset_root: Path) -> None:
    # The default tokenizer (google/paligemma-3b-pt-224) is nowhere on this machine and the hub is off.
    result = run(["plan", "--policy.type=lerobot_pi05", "--world_size=8", "--parallelism.dp_shard=8", "--json",
                  *DATA, f"--dataset.root={dataset_root}", "--batch_size=2", "--plan.device_memory_gb=80"], work)
    plan = json.loads(result.stdout)
    assert plan["total_params"] == lerobots_own_count() == 4_143_404_816
    assert plan["layout"] == "fsdp" and plan["dp_shard"] == 8
    per_rank, ddp = plan["per_rank"], plan["ddp_per_rank"]
    assert abs(per_rank["params_bytes"] / ddp["params_bytes"] - 1 / 8) < 0.001
    assert per_rank["total_bytes"] < 1.01 * ddp["total_bytes"] / 8
    pairs = [u for u in plan["units"] if u["class"] == "_PiGemmaDecoderLayerBase+_PiGemmaDecoderLayerBase"]
    assert len(pairs) == 18 and plan["root_params"] < 0.005 * plan["total_params"]
    assert plan["largest_gather_bytes"] < 0.15 * 4 * plan["total_params"]
    activations = plan["activations"]
    assert activations["not_traced"] is None and activations["peak_bytes"] > activations["checkpointed_peak_bytes"] > 0
    assert activations["batch"]["observation.language.tokens"] == {"shape": [2, 200], "dtype": "int64"}
    assert activations["batch_fit"]["largest_batch_size"] >= 2


def test_plan_smolvla_full_size_on_8_ranks_offline(work: Path, dataset_root: Path, tmp_path: Path) -> None:
    # The default VLM (SmolVLM2-500M-Video-Instruct) is nowhere on this machine and the hub is off:
    # the bridge builds it from the architecture it ships.
    assert shipped()["hub_id"] == SmolVLAConfig().vlm_model_name
    result = run(["plan", "--policy.type=lerobot_smolvla", "--world_size=8", "--parallelism.dp_shard=8", "--json",
                  *DATA, f"--dataset.root={dataset_root}", "--batch_size=2"], work)
    plan = json.loads(result.stdout)  # LeRobot's "Reducing the number of VLM layers" line went to stderr
    # LeRobot itself, reading the same architecture from a local folder as its config.json.
    lerobots = lerobots_own_count(SmolVLAConfig, SmolVLAPolicy, vlm_model_name=str(write_shipped_smolvlm(tmp_path)))
    assert plan["total_params"] == lerobots == 450_046_176
    assert plan["layout"] == "fsdp" and plan["dp_shard"] == 8
    per_rank, ddp = plan["per_rank"], plan["ddp_per_rank"]
    assert abs(per_rank["params_bytes"] / ddp["params_bytes"] - 1 / 8) < 0.001
    pairs = [u for u in plan["units"] if u["class"] == "LlamaDecoderLayer+LlamaDecoderLayer"]
    assert len(pairs) == 16 and plan["root_params"] < 0.05 * plan["total_params"]
    activations = plan["activations"]
    assert activations["not_traced"] is None and activations["peak_bytes"] > activations["checkpointed_peak_bytes"] > 0
    assert activations["batch"]["observation.language.tokens"] == {"shape": [2, 48], "dtype": "int64"}
