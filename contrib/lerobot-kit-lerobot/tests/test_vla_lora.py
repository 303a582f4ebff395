"""LoRA on LeRobot's VLA policies, each starting from a checkpoint LeRobot itself wrote
(``save_pretrained``), with the frozen base sharded: SmolVLA under FSDP(2), π0.5 (reduced
sizes) under HSDP(2x2). The adapter then loads with ``PeftModel.from_pretrained`` on
LeRobot's own policy class, equal to what the run saved, and acts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from lerobot.datasets.lerobot_dataset import LeRobotDatasetMetadata
from lerobot.policies.factory import make_policy, make_policy_config, make_pre_post_processors
from lerobot.policies.pi05.modeling_pi05 import PI05Policy
from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy
from peft import PeftModel
from safetensors.torch import load_file

from conftest import ACTION_DIM, PI_SIZES, REPO_ID, banner_parameters, losses, train
from lerobot_kit_lerobot.bridge_fields import PiSizes
from lerobot_kit_lerobot.modeling import LerobotSmolVLA
from lerobot_kit_lerobot.pi_overrides import pi_sizes, pi_tokenizer
from lerobot_side import act_on, observation

# The shapes LeRobot's config.json records for both checkpoints (the runs read them from there).
SHAPES = {"chunk_size": 4, "n_action_steps": 4, "max_state_dim": 8, "max_action_dim": 8, "tokenizer_max_length": 24,
          "device": "cpu"}
PI05_SIZES = PiSizes.model_validate_json(PI_SIZES)


def write_lerobot_smolvla(dataset_root: Path, vlm: Path, target: Path) -> Path:
    """A ``pretrained_model/`` as lerobot-train saves it: LeRobot's SmolVLA and processors."""
    meta = LeRobotDatasetMetadata(REPO_ID, root=dataset_root)
    config = make_policy_config("smolvla", vlm_model_name=str(vlm), num_vlm_layers=4, resize_imgs_with_padding=(64, 64),
                                expert_width_multiplier=0.5, **SHAPES)
    torch.manual_seed(0)
    policy = make_policy(config, ds_meta=meta)
    return save_as_lerobot_train(target, policy, *make_pre_post_processors(config, dataset_stats=meta.stats))


def write_lerobot_pi05(dataset_root: Path, tokenizer: Path, target: Path) -> Path:
    """The same for π0.5, built by LeRobot's classes at the tests' reduced sizes, its
    processors tokenizing with the local tokenizer."""
    meta = LeRobotDatasetMetadata(REPO_ID, root=dataset_root)
    config = make_policy_config("pi05", image_resolution=(64, 64), **SHAPES)
    torch.manual_seed(0)
    with pi_sizes("pi05", PI05_SIZES):
        policy = make_policy(config, ds_meta=meta)
    with pi_tokenizer("pi05", str(tokenizer)):
        processors = make_pre_post_processors(config, dataset_stats=meta.stats)
    return save_as_lerobot_train(target, policy, *processors)


def save_as_lerobot_train(target: Path, *parts: object) -> Path:
    """What lerobot-train writes into ``pretrained_model/``: the policy's and both processors' files."""
    for part in parts:
        part.save_pretrained(target)  # type: ignore[attr-defined]
    return target


def assert_peft_loads_the_adapter(
    lerobot_base: torch.nn.Module, adapter_dir: Path
) -> tuple[PeftModel, dict[str, torch.Tensor]]:
    """``PeftModel.from_pretrained`` on LeRobot's policy: the adapter tensors are the saved
    ones, trained (some ``lora_B``, zero at the start, is not), and the base is as LeRobot saved it."""
    saved = load_file(adapter_dir / "adapter_model.safetensors")
    assert saved and all(".lora_" in key for key in saved)
    assert any(".lora_B." in key and tensor.abs().sum() > 0 for key, tensor in saved.items())  # it trained
    base_state = {k: v.clone() for k, v in lerobot_base.state_dict().items()}
    model = PeftModel.from_pretrained(lerobot_base, adapter_dir)
    state = model.state_dict()
    for key, tensor in saved.items():  # peft drops the adapter name when saving
        named = key.replace(".weight", ".default.weight").replace(".bias", ".default.bias")
        loaded = state[re.sub(r"(\.lora_embedding_[AB])$", r"\1.default", named)]
        assert torch.equal(loaded, tensor), key
    unchanged = {k.replace("base_model.model.", "").replace(".base_layer", ""): v for k, v in state.items()
                 if ".lora_" not in k}
    assert unchanged.keys() == base_state.keys()
    assert all(torch.equal(unchanged[k], v) for k, v in base_state.items())
    return model, saved


def test_lora_under_fsdp2_on_a_lerobot_smolvla_gives_an_adapter_peft_loads(
    work: Path, dataset_root: Path, vla_assets: Path
) -> None:
    """LeRobot's default targets and the token embedding, which peft wraps in a layer of its
    own (the bridge reads the vocabulary's size through it)."""
    base = write_lerobot_smolvla(dataset_root, vla_assets / "smolvlm", work / "lerobot_smolvla" / "pretrained_model")
    out = work / "smolvla_lora"
    targets = f"({LerobotSmolVLA.default_peft_targets}|.*\\.embed_tokens)"
    result = train(work, "--policy.type=lerobot_smolvla", f"--policy.path={base}", "--peft.method_type=LORA",
                   f"--peft.target_modules={targets}",
                   "--peft.r=4", f"--output_dir={out}", "--parallelism.dp_shard=2", "--batch_size=4", "--steps=4",
                   "--save_freq=4", "--log_freq=1", "--optimizer.lr=3e-3", nproc=2, root=dataset_root)
    assert "layout fsdp" in result.stderr and "unit groups of the policy (run by joint_layer)" in result.stderr
    assert len(losses(out)) == 4

    adapter_dir = out / "checkpoints" / "000004" / "pretrained_model"
    lerobot_base = SmolVLAPolicy.from_pretrained(base, strict=True)
    model, saved = assert_peft_loads_the_adapter(lerobot_base, adapter_dir)
    assert any("lm_expert" in key for key in saved)  # LeRobot's default targets: the expert's q/v ...
    assert any("action_out_proj" in key for key in saved)  # ... and the action projections
    assert any("text_model.embed_tokens.lora_embedding_A" in key for key in saved)  # the token embedding

    preprocessor, postprocessor = make_pre_post_processors(lerobot_base.config, pretrained_path=str(adapter_dir))
    action = act_on(model, preprocessor, postprocessor, observation(dataset_root, 3))
    assert action.shape == (1, ACTION_DIM) and action.isfinite().all()


def test_lora_under_hsdp_2x2_on_a_lerobot_pi05_shards_the_frozen_base_and_gives_an_adapter_peft_loads(
    work: Path, dataset_root: Path, vla_assets: Path
) -> None:
    """Two replicas of two shards: every parameter, the frozen base's included, is split
    between the two ranks of a replica; only the adapter trains. The shapes come from
    LeRobot's config.json; the sizes and the tokenizer, which LeRobot fixes in code, as flags."""
    base = write_lerobot_pi05(dataset_root, vla_assets / "tokenizer", work / "lerobot_pi05" / "pretrained_model")
    out = work / "pi05_lora_hsdp"
    result = train(work, "--policy.type=lerobot_pi05", f"--policy.tokenizer_name={vla_assets / 'tokenizer'}",
                   f"--policy.sizes={PI_SIZES}", f"--policy.path={base}", "--peft.method_type=LORA", "--peft.r=4",
                   f"--output_dir={out}", "--parallelism.dp_replicate=2", "--parallelism.dp_shard=2",
                   "--batch_size=2", "--steps=4", "--save_freq=4", "--log_freq=1", "--optimizer.lr=3e-3",
                   nproc=4, root=dataset_root)
    banner = result.stderr
    assert "layout hsdp | world 4 (dp_replicate 2 × dp_shard 2)" in banner, banner
    assert "effective batch 8" in banner and "6 unit groups of the policy (run by joint_layer)" in banner
    got = losses(out)
    assert len(got) == 4 and torch.isfinite(torch.tensor(got)).all(), got
    assert sum(got[1:]) / 3 < got[0], got  # the adapter alone lowers the loss from the base's

    with pi_sizes("pi05", PI05_SIZES):
        lerobot_base = PI05Policy.from_pretrained(base, strict=True)
    adapter_dir = out / "checkpoints" / "000004" / "pretrained_model"
    base_count = sum(p.numel() for p in lerobot_base.parameters())
    model, saved = assert_peft_loads_the_adapter(lerobot_base, adapter_dir)
    adapter_count = sum(tensor.numel() for tensor in saved.values())
    assert any("gemma_expert" in key for key in saved) and any("action_out_proj" in key for key in saved)

    # The banner's counts (rounded as printed): LeRobot's base plus the adapter, the adapter
    # alone trainable, and half of it all on this rank: the frozen base is sharded, not replicated.
    total, trainable, local = banner_parameters(banner)
    assert total == pytest.approx(base_count + adapter_count, rel=0.01)
    assert trainable == pytest.approx(adapter_count, rel=0.01) and trainable < 0.05 * total
    assert local == pytest.approx(total / 2, rel=0.02), banner

    preprocessor, postprocessor = make_pre_post_processors(lerobot_base.config, pretrained_path=str(adapter_dir))
    action = act_on(model, preprocessor, postprocessor, observation(dataset_root, 3))
    assert action.shape == (1, ACTION_DIM) and action.isfinite().all()
