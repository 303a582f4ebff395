"""A SmolVLA checkpoint LeRobot itself wrote (``save_pretrained``), fine-tuned with LoRA
under FSDP(2) with its frozen base sharded; the adapter then loads with
``PeftModel.from_pretrained`` on LeRobot's ``SmolVLAPolicy`` and acts."""

from __future__ import annotations

from pathlib import Path

import torch
from lerobot.datasets.lerobot_dataset import LeRobotDatasetMetadata
from lerobot.policies.factory import make_policy, make_policy_config, make_pre_post_processors
from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy
from peft import PeftModel
from safetensors.torch import load_file

from conftest import ACTION_DIM, REPO_ID, losses, train
from lerobot_side import act_on, observation


def write_lerobot_smolvla(dataset_root: Path, vlm: Path, target: Path) -> Path:
    """A ``pretrained_model/`` as lerobot-train saves it: LeRobot's SmolVLA and processors."""
    meta = LeRobotDatasetMetadata(REPO_ID, root=dataset_root)
    config = make_policy_config(
        "smolvla", vlm_model_name=str(vlm), num_vlm_layers=4, resize_imgs_with_padding=(64, 64), chunk_size=4,
        n_action_steps=4, max_state_dim=8, max_action_dim=8, tokenizer_max_length=24, expert_width_multiplier=0.5,
        device="cpu",
    )
    torch.manual_seed(0)
    policy = make_policy(config, ds_meta=meta)
    preprocessor, postprocessor = make_pre_post_processors(config, dataset_stats=meta.stats)
    policy.save_pretrained(target)
    preprocessor.save_pretrained(target)
    postprocessor.save_pretrained(target)
    return target


def test_lora_under_fsdp2_on_a_lerobot_smolvla_gives_an_adapter_peft_loads(
    work: Path, dataset_root: Path, vla_assets: Path
) -> None:
    base = write_lerobot_smolvla(dataset_root, vla_assets / "smolvlm", work / "lerobot_smolvla" / "pretrained_model")
    out = work / "smolvla_lora"
    result = train(work, "--policy.type=lerobot_smolvla", f"--policy.path={base}", "--peft.method_type=LORA",
                   "--peft.r=4", f"--output_dir={out}", "--parallelism.dp_shard=2", "--batch_size=4", "--steps=4",
                   "--save_freq=4", "--log_freq=1", "--optimizer.lr=3e-3", nproc=2, root=dataset_root)
    assert "layout fsdp" in result.stderr and "unit groups of the policy (run by joint_layer)" in result.stderr
    assert len(losses(out)) == 4

    adapter_dir = out / "checkpoints" / "000004" / "pretrained_model"
    saved = load_file(adapter_dir / "adapter_model.safetensors")
    assert saved and all(".lora_" in key for key in saved)
    assert any("lm_expert" in key for key in saved)  # LeRobot's default targets: the expert's q/v ...
    assert any("action_out_proj" in key for key in saved)  # ... and the action projections
    assert any(".lora_B." in key and tensor.abs().sum() > 0 for key, tensor in saved.items())  # it trained

    lerobot_base = SmolVLAPolicy.from_pretrained(base, strict=True)
    base_state = {k: v.clone() for k, v in lerobot_base.state_dict().items()}
    model = PeftModel.from_pretrained(lerobot_base, adapter_dir)
    state = model.state_dict()
    for key, tensor in saved.items():  # peft drops the adapter name when saving
        assert torch.equal(state[key.replace(".weight", ".default.weight").replace(".bias", ".default.bias")], tensor), key
    unchanged = {k.replace("base_model.model.", "").replace(".base_layer", ""): v for k, v in state.items()
                 if ".lora_" not in k}
    assert unchanged.keys() == base_state.keys()
    assert all(torch.equal(unchanged[k], v) for k, v in base_state.items())  # the base as LeRobot saved it

    preprocessor, postprocessor = make_pre_post_processors(lerobot_base.config, pretrained_path=str(adapter_dir))
    action = act_on(model, preprocessor, postprocessor, observation(dataset_root, 3))
    assert action.shape == (1, ACTION_DIM) and action.isfinite().all()
