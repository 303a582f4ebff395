"""LeRobot's π0.5 and SmolVLA (reduced sizes, LeRobot's own classes) trained by ``lerobot train``
on a LeRobot v3 video dataset with task texts, tokenized by LeRobot's processors: sharded
by FSDP(2) for real (each joint layer pair one unit), equal to one process on the same
global batch, used by LeRobot alone, resumed on one process; π0.5 under HSDP(2x2)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint import FileSystemReader

from conftest import ACTION_DIM, banner_parameters, copy_crashed, losses, tiny_pi, tiny_smolvla, train
from lerobot_side import act_on, assert_same_weights, load_with_lerobot, observation, sharded_weights

STEPS = 16
RUN = ["--log_freq=1", "--optimizer.lr=3e-3", "--checkpoint_format=safetensors_dcp", f"--steps={STEPS}"]
FLAGS = {"pi05": tiny_pi, "smolvla": tiny_smolvla}
# The flag naming the folder LeRobot loads files from, and that folder in vla_assets.
FILES = {"pi05": ("tokenizer_name", "tokenizer"), "smolvla": ("vlm_model_name", "smolvlm")}
# Unit groups (joint layers) and units by class/path, as the banner counts them: π0.5 has 6
# pairs, 2 SigLIP layers + token embedding + two heads; SmolVLA 4 VLM layers (each with its
# expert layer), 2 vision layers + token embedding + head.
UNITS = {
    "pi05": "wrap units: 5 from policy (GemmaTextScaledWordEmbedding, Linear, SiglipEncoderLayer) + "
            "6 unit groups of the policy (run by joint_layer)",
    "smolvla": "wrap units: 4 from policy (Embedding, Linear, SmolVLMEncoderLayer) + "
               "4 unit groups of the policy (run by joint_layer)",
}


@pytest.fixture(scope="module", params=["pi05", "smolvla"])
def runs(request: pytest.FixtureRequest, work: Path, dataset_root: Path, vla_assets: Path) -> dict[str, object]:
    """One process on batch 8, and FSDP(2) on 4 + 4, each for 16 steps from the same seed."""
    kind = request.param
    flags = FLAGS[kind](vla_assets)
    single, fsdp = work / f"{kind}_single", work / f"{kind}_fsdp2"
    train(work, *flags, *RUN, f"--output_dir={single}", "--batch_size=8", "--save_checkpoint=false",
          root=dataset_root)
    result = train(work, *flags, *RUN, f"--output_dir={fsdp}", "--parallelism.dp_shard=2", "--batch_size=4",
                   "--save_freq=8", nproc=2, root=dataset_root)
    return {"kind": kind, "single": single, "fsdp": fsdp, "banner": result.stderr}


def test_fsdp2_shards_each_joint_layer_pair_and_equals_one_process(runs: dict) -> None:
    banner, kind = runs["banner"], runs["kind"]
    assert "layout fsdp" in banner and UNITS[kind] in banner
    total, trainable, local = banner_parameters(banner)
    assert local <= total / 2 * 1.01, banner  # every parameter sharded, frozen ones too
    if kind == "smolvla":  # LeRobot's defaults: the VLM frozen (train_expert_only, freeze_vision_encoder)
        assert trainable < total / 2
    one, two = losses(runs["single"]), losses(runs["fsdp"])
    assert len(one) == len(two) == STEPS
    # The same global batch, the same per-sample noise: the same losses, to float rounding,
    # also in the second epoch (96 frames: steps 13 to 16), where a frame is met on another rank.
    assert two == pytest.approx(one, rel=1e-4)
    # Flow matching's loss is noisy step to step (fresh noise and time per sample): it falls
    # from the untrained first step's and stays below.
    assert sum(two[-8:]) / 8 < 0.8 * two[0], two


def test_lerobot_loads_the_fsdp2_checkpoint_and_acts(runs: dict, work: Path, dataset_root: Path) -> None:
    kind = runs["kind"]
    pretrained = runs["fsdp"] / "checkpoints" / f"{STEPS:06d}" / "pretrained_model"
    policy, preprocessor, postprocessor = load_with_lerobot(pretrained, kind)
    assert type(policy).__name__ == {"pi05": "PI05Policy", "smolvla": "SmolVLAPolicy"}[kind]
    assert_same_weights(policy, sharded_weights(pretrained, work))
    action = act_on(policy, preprocessor, postprocessor, observation(dataset_root, 5))
    assert action.shape == (1, ACTION_DIM) and action.isfinite().all()


def test_fsdp2_run_resumes_on_one_process(runs: dict, work: Path, dataset_root: Path, vla_assets: Path) -> None:
    """Stopped after step 8 under FSDP(2), continued by one process on the same global batch:
    the same batches and per-sample noise as the uninterrupted run, so its losses. The run
    trained with the fused attention (the default) and resumes with LeRobot's eager one,
    which a resume may switch to (it changes no weight): the losses are the same to float
    rounding. Its tokenizer (π0.5) or VLM (SmolVLA) folder has moved: the resume takes it
    from the flag, holding the same files."""
    kind = runs["kind"]
    flag, assets = FILES[kind]
    moved = shutil.copytree(vla_assets / assets, work / f"{kind}_moved_{assets}")
    resumed = copy_crashed(runs["fsdp"], 8, work / f"{kind}_resumed")
    config = resumed / "checkpoints" / "last" / "pretrained_model" / "train_config.json"
    assert json.loads(config.read_text())["policy"]["attention"] == "sdpa"
    result = train(work, "--resume=true", f"--config_path={config}", "--parallelism.dp_shard=null",
                   "--batch_size=8", "--policy.attention=eager", f"--policy.{flag}={moved}", root=dataset_root)
    assert "layout single" in result.stderr and f"steps 8→{STEPS}" in result.stderr
    got, uninterrupted = losses(resumed), losses(runs["fsdp"])
    assert len(got) == STEPS
    assert got[8:] == pytest.approx(uninterrupted[8:], rel=1e-4)
    final = resumed / "checkpoints" / f"{STEPS:06d}" / "pretrained_model"
    assert json.loads((final / "train_config.json").read_text())["policy"]["attention"] == "eager"
    assert json.loads((final / "train_config.json").read_text())["policy"][flag] == str(moved)
    policy, _, _ = load_with_lerobot(final, kind)
    assert policy.config.chunk_size == 4


def test_hsdp_2x2_with_activation_checkpointing_equals_one_process(
    runs: dict, work: Path, dataset_root: Path, vla_assets: Path
) -> None:
    """Each joint layer pair recomputed in backward through its method, each vision layer
    through its forward, on two replicas of two shards: the one-process run's losses."""
    kind = runs["kind"]
    out = work / f"{kind}_hsdp_ac"
    result = train(work, *FLAGS[kind](vla_assets), *RUN[:3], "--steps=2", f"--output_dir={out}",
                   "--parallelism.dp_replicate=2", "--parallelism.dp_shard=2", "--batch_size=2",
                   "--accelerator.activation_checkpointing=true", nproc=4, root=dataset_root)
    assert "layout hsdp | world 4" in result.stderr and "effective batch 8" in result.stderr
    assert "(run by joint_layer), checkpointed" in result.stderr
    total, _, local = banner_parameters(result.stderr)
    assert local <= total / 2 * 1.01
    assert losses(out) == pytest.approx(losses(runs["single"])[:2], rel=1e-4)


def test_gradient_accumulation_under_fsdp2_equals_one_process(work: Path, dataset_root: Path, vla_assets: Path,
                                                              runs: dict) -> None:
    """Two micro-batches per step, of 2 per rank under FSDP(2) and of 4 in one process: the
    same micro-batches (the sampler's order follows the global micro-batch), the same losses;
    no gradient is reduced until the second (FSDP's no-sync micro-step)."""
    kind = runs["kind"]
    accumulate = [*FLAGS[kind](vla_assets), *RUN[:3], "--steps=2", "--accelerator.gradient_accumulation.steps=2"]
    one, two = work / f"{kind}_single_accum", work / f"{kind}_fsdp2_accum"
    train(work, *accumulate, f"--output_dir={one}", "--batch_size=4", "--save_checkpoint=false", root=dataset_root)
    result = train(work, *accumulate, f"--output_dir={two}", "--parallelism.dp_shard=2", "--batch_size=2",
                   "--save_checkpoint=false", nproc=2, root=dataset_root)
    assert "effective batch 8 = batch_size 2 × dp_world_size 2 × gradient_accumulation 2" in result.stderr
    assert losses(two) == pytest.approx(losses(one), rel=1e-4)


def test_train_expert_only_with_a_bf16_frozen_base_under_fsdp2(work: Path, dataset_root: Path, vla_assets: Path) -> None:
    """LeRobot's bf16 mode (``--policy.dtype=bfloat16``) with ``train_expert_only``: PaliGemma
    frozen and stored in bf16, sharded like everything else; the expert trainable, kept in
    fp32 under bf16 autocast; AdamW state for the expert only."""
    out = work / "pi05_bf16_expert_only"
    result = train(work, *tiny_pi(vla_assets), *RUN[:3], "--steps=3", f"--output_dir={out}",
                   "--parallelism.dp_shard=2", "--batch_size=4", "--policy.dtype=bfloat16",
                   "--policy.train_expert_only=true", "--accelerator.mixed_precision=bf16", nproc=2, root=dataset_root)
    total, trainable, local = banner_parameters(result.stderr)
    assert trainable < 0.3 * total and local <= total / 2 * 1.01, result.stderr
    assert len(losses(out)) == 3 and all(torch.isfinite(torch.tensor(losses(out))))
    step = out / "checkpoints" / "000003"
    weights = load_file(step / "pretrained_model" / "model.safetensors")
    layer = "model.paligemma_with_expert.{}.layers.2.mlp.up_proj.weight"
    assert weights[layer.format("paligemma.model.language_model")].dtype == torch.bfloat16  # frozen, stored bf16
    assert weights[layer.format("gemma_expert.model")].dtype == torch.float32  # trained in fp32
    optimizer = FileSystemReader(str(step / "training_state" / "optimizer_0")).read_metadata().state_dict_metadata
    assert any("gemma_expert.model.layers" in key for key in optimizer)
    assert not any("paligemma.model" in key for key in optimizer)  # frozen: no AdamW state


def test_a_resume_whose_files_folder_holds_other_files_is_refused(runs: dict, vla_assets: Path, work: Path) -> None:
    """The run records a digest of what its tokenizer or VLM folder held; a resume with a
    folder of other contents (wherever it is) is refused in one line naming the flag."""
    kind = runs["kind"]
    flag, assets = FILES[kind]
    changed = shutil.copytree(vla_assets / assets, work / f"{kind}_changed_{assets}")
    settings = json.loads((changed / "tokenizer_config.json").read_text())
    (changed / "tokenizer_config.json").write_text(json.dumps({**settings, "model_max_length": 77}))
    step = runs["fsdp"] / "checkpoints" / f"{STEPS:06d}"
    refused = _lerobot("train", "--resume=true", f"--config_path={step / 'pretrained_model' / 'train_config.json'}",
                       f"--policy.{flag}={changed}", "--parallelism.dp_shard=1")  # one process here
    assert refused.returncode == 2, refused.stderr[-3000:]
    line = refused.stderr.strip().splitlines()[-1].removeprefix("error: ")  # after LeRobot's own prints
    assert "\n" not in line and line.startswith(f"--policy.{flag}={changed} (files sha256:"), line
    assert f"(checkpoint: {vla_assets / assets} (files sha256:" in line and "differs from the checkpoint" in line


@pytest.mark.parametrize("edit", [{"type": "act"}, {"chunk_size": "four"}])
def test_inspect_and_policy_path_give_one_verdict_on_an_edited_lerobot_config(
    runs: dict, work: Path, edit: dict
) -> None:
    """A policy folder as LeRobot writes one (config.json, model.safetensors, processors)
    whose config.json was edited: another LeRobot type beside these weights, or a value of
    the wrong type. inspect-checkpoint's verdict and line are what --policy.path refuses the
    folder with (both read it through the same check); the folder as written is loadable."""
    from lerobot_kit.api import CheckpointError, load_pretrained

    kind = runs["kind"]
    source = runs["fsdp"] / "checkpoints" / f"{STEPS:06d}" / "pretrained_model"
    lerobot_only = shutil.ignore_patterns("train_config.json", "dataset_meta.json", "pytorch_model_fsdp_0")
    name = "_".join(edit)
    folder = shutil.copytree(source, work / f"{kind}_lerobot_folder_{name}", ignore=lerobot_only)
    assert _inspected(folder)["loadable"]["ok"] is not False
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **edit}))
    report = _inspected(folder)
    assert report["loadable"]["ok"] is False and not report["ok"]
    with pytest.raises(CheckpointError) as refused:
        load_pretrained(folder)
    why = report["loadable"]["why"]
    assert why in str(refused.value)
    expected = {
        "type": "config.json: model.safetensors is not the LeRobot 'act' policy this config describes: it lacks "
                "'model.action_head.bias'",
        "chunk_size": "config.json: not a valid 'lerobot_pi05' config: chunk_size: Input should be a valid integer"
        if kind == "pi05" else "config.json: not a valid 'lerobot_smolvla' config: chunk_size: Input should be a valid "
        "integer",
    }[name]
    assert why.startswith(f"{folder.name}/{expected}"), why


def _lerobot(*args: str) -> subprocess.CompletedProcess[str]:
    """The ``lerobot`` command of this environment, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "lerobot_kit.cli", *args], capture_output=True, text=True,
                          timeout=300)


def _inspected(folder: Path) -> dict:
    """``lerobot inspect-checkpoint --json`` of ``folder``: its verdicts as a CI pipeline reads them.
    The inspecting process never imports torch (the bridge's check of the folder runs in a
    child process), which is asserted in it."""
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from lerobot_kit.cli.main import cli\n"
        "done = CliRunner().invoke(cli, ['inspect-checkpoint', '--json', sys.argv[1]])\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:5]\n"
        "print(done.stdout)\n"
    )
    inspected = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, timeout=300)
    assert inspected.returncode == 0, inspected.stderr[-3000:]
    return json.loads(inspected.stdout)
