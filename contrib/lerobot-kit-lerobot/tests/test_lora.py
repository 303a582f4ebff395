"""A checkpoint LeRobot itself wrote, fine-tuned with LoRA under FSDP(2); the adapter then
loads with ``PeftModel.from_pretrained`` on LeRobot's own policy. And LeRobot's habit:
``--policy.path=<user>/<model>`` alone, from the Hub's cache."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import torch
from lerobot.datasets.lerobot_dataset import LeRobotDatasetMetadata
from lerobot.policies.act.configuration_act import ACTConfig
from lerobot.policies.act.modeling_act import ACTPolicy
from lerobot.policies.factory import make_policy, make_pre_post_processors
from peft import PeftModel
from safetensors.torch import load_file

from conftest import ACTION_DIM, REPO_ID, inspected, losses, train
from lerobot_side import act_on, observation


def write_lerobot_checkpoint(dataset_root: Path, target: Path) -> Path:
    """A ``pretrained_model/`` as lerobot-train saves it: LeRobot's policy and processors."""
    meta = LeRobotDatasetMetadata(REPO_ID, root=dataset_root)
    config = ACTConfig(dim_model=32, n_heads=2, dim_feedforward=64, n_encoder_layers=2, n_decoder_layers=1,
                       n_vae_encoder_layers=1, latent_dim=8, chunk_size=5, n_action_steps=5,
                       pretrained_backbone_weights=None, device="cpu")
    torch.manual_seed(0)
    policy = make_policy(config, ds_meta=meta)
    preprocessor, postprocessor = make_pre_post_processors(config, dataset_stats=meta.stats)
    policy.save_pretrained(target)
    preprocessor.save_pretrained(target)
    postprocessor.save_pretrained(target)
    return target


def test_lora_under_fsdp2_on_a_lerobot_checkpoint_gives_an_adapter_peft_loads_on_lerobots_policy(
    work: Path, dataset_root: Path
) -> None:
    base = write_lerobot_checkpoint(dataset_root, work / "lerobot_base" / "pretrained_model")
    report = inspected(base, work)  # what save_pretrained wrote: a policy folder, loadable, nothing to resume
    assert report["kind"] == "policy_folder" and report["resumable"]["ok"] is False, report
    out = work / "act_lora"
    # --policy.path alone, LeRobot's habit: its config.json (type "act") makes the run lerobot_act's.
    result = train(work, f"--policy.path={base}", "--peft.method_type=LORA", "--peft.r=4", f"--output_dir={out}",
                   "--parallelism.dp_shard=2", "--batch_size=8", "--steps=6", "--save_freq=6", "--log_freq=1",
                   "--optimizer.lr=1e-3", nproc=2, root=dataset_root)
    assert "layout fsdp" in result.stderr and "policy lerobot_act |" in result.stderr and len(losses(out)) == 6

    adapter_dir = out / "checkpoints" / "000006" / "pretrained_model"
    report = inspected(adapter_dir.parent, work)
    assert report["peft"] and report["resumable"]["ok"] and report["loadable"]["ok"], report["problems"]
    saved = load_file(adapter_dir / "adapter_model.safetensors")
    assert saved and all(".lora_" in key for key in saved)
    assert any(".lora_B." in key and tensor.abs().sum() > 0 for key, tensor in saved.items())  # it trained

    lerobot_base = ACTPolicy.from_pretrained(base, strict=True)
    base_state = {k: v.clone() for k, v in lerobot_base.state_dict().items()}
    model = PeftModel.from_pretrained(lerobot_base, adapter_dir)
    state = model.state_dict()
    for key, tensor in saved.items():  # peft drops the adapter name when saving
        loaded = state[key.replace(".weight", ".default.weight")]
        assert torch.equal(loaded, tensor), key
    for key, tensor in base_state.items():  # LoRA left LeRobot's weights as they were
        peft_key = "base_model.model." + key.replace("linear1.", "linear1.base_layer.").replace("linear2.", "linear2.base_layer.")
        assert torch.equal(state[peft_key], tensor), key

    preprocessor, postprocessor = make_pre_post_processors(lerobot_base.config, pretrained_path=str(adapter_dir))
    action = act_on(model, preprocessor, postprocessor, observation(dataset_root, 3))
    assert action.shape == (1, ACTION_DIM) and action.isfinite().all()


def into_hub_cache(folder: Path, hub_cache: Path, repo_id: str) -> Path:
    """``folder``'s files as the Hub's cache holds a downloaded snapshot of ``repo_id``: each
    file's content in ``blobs/``, linked from ``snapshots/<commit>/``, ``refs/main`` naming
    the commit (``huggingface_hub`` reads it so with ``HF_HUB_OFFLINE=1``, as the tests run)."""
    repo = hub_cache / f"models--{repo_id.replace('/', '--')}"
    commit = "0123456789abcdef" * 2 + "01234567"
    snapshot = repo / "snapshots" / commit
    for made in (repo / "blobs", repo / "refs", snapshot):
        made.mkdir(parents=True)
    for file in folder.iterdir():
        blob = hashlib.sha256(file.read_bytes()).hexdigest()
        shutil.copyfile(file, repo / "blobs" / blob)
        (snapshot / file.name).symlink_to(Path("../../blobs") / blob)
    (repo / "refs" / "main").write_text(commit)
    return snapshot


def test_policy_path_alone_of_a_hub_id_of_a_lerobot_checkpoint_picks_the_bridge_type(work: Path,
                                                                                     dataset_root: Path) -> None:
    """LeRobot's habit with a hub id: ``--policy.path=<user>/<model>`` and no ``--policy.type``,
    read from the snapshot in the Hub's cache (its files links into the repo's blobs)."""
    base = write_lerobot_checkpoint(dataset_root, work / "lerobot_base_alone" / "pretrained_model")
    snapshot = into_hub_cache(base, work / "hf_home" / "hub", "someone/act_base")
    report = inspected(snapshot, work)  # its files are links into the repo's blobs; their sizes are counted
    assert report["kind"] == "policy_folder" and report["size_on_disk"] > 1_000_000, report
    out = work / "act_lora_path_alone"
    result = train(work, "--policy.path=someone/act_base", "--peft.method_type=LORA", "--peft.r=4",
                   f"--output_dir={out}", "--batch_size=4", "--steps=2", "--log_freq=1", root=dataset_root)
    assert "policy lerobot_act |" in result.stderr and len(losses(out)) == 2
    recorded = json.loads((out / "checkpoints/000002/pretrained_model/train_config.json").read_text())
    assert recorded["policy"]["path"] == str(snapshot)
    assert (out / "checkpoints" / "000002" / "pretrained_model" / "adapter_model.safetensors").is_file()
