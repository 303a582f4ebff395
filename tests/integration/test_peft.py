"""PEFT fine-tuning from the CLI, with real gloo processes on CPU.

The runs (in rank pools, ``tests/rank_pool.py``: real ranks started once) are trained
once per session. A tiny ACT base is trained first; every PEFT run starts from it with
``--policy.path``. Each layout saves at the half-way step and the end, which lets a test
check what no file holds directly: the loss logged right after the half-way checkpoint,
computed by the run's in-memory model, is reproduced from the *base file + the adapter
checkpoint* alone, so the frozen base the run trained with is exactly the one on disk.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import peft  # noqa: E402,F401  - part of the test extras; fail loudly if missing
import pytest
import torch
from conftest import built_once, launch_env, pool_train, read_metrics, run_cli
from safetensors.torch import load_file

BASE_ACT = ["--policy.dim_model=64", "--policy.dim_feedforward=128", "--policy.n_heads=2",
            "--policy.n_encoder_layers=2", "--policy.n_vae_encoder_layers=1", "--policy.chunk_size=5",
            "--policy.n_action_steps=5", "--policy.dropout=0", "--policy.use_vae=false"]
DATA = ["--dataset.num_episodes=4", "--dataset.episode_length=20"]  # 80 samples
STEPS, HALF, GLOBAL_BATCH = 20, 10, 8
LORA = ["--peft.method_type=LORA", "--peft.r=4", "--peft.lora_alpha=8", "--optimizer.lr=1e-2"]
# ACT's decoder starts from zero queries, so the value projection of the first decoder
# layer's self-attention only ever sees zeros and a LoRA there cannot learn. The runs
# target the other projections: by name (a list) or by a regex over module paths.
NAMED = '--peft.target_modules=["q_proj","k_proj","out_proj","linear1","linear2"]'
REGEX = r"--peft.target_modules=(?!decoder\.layers\.0\.self_attn\.v_proj$).*\.(q_proj|k_proj|v_proj|out_proj|linear1|linear2)"
LAYOUTS = {  # name: (processes, flags)
    "single": (1, [NAMED, "--checkpoint_format=safetensors"]),
    "ddp2": (2, [NAMED, "--checkpoint_format=safetensors"]),
    "fsdp2": (2, [REGEX, "--parallelism.dp_shard=2", "--checkpoint_format=dcp"]),
    "hsdp2x2": (4, [REGEX, "--parallelism.dp_replicate=2", "--parallelism.dp_shard=2",
                    "--checkpoint_format=safetensors_dcp", '--peft.full_training_modules=["action_head"]']),
}


@pytest.fixture(scope="module")
def base(tmp_path_factory, rank_pools) -> Path:
    """The pretrained policy every PEFT run fine-tunes: a step folder."""

    def build(root: Path) -> None:
        pool_train(rank_pools, 1, f"--output_dir={root / 'run'}", *BASE_ACT, *DATA, "--steps=2", "--batch_size=4",
                   workdir=root)

    return built_once(tmp_path_factory, "peft_base", build) / "run" / "checkpoints" / "000002"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, rank_pools, base: Path) -> dict[str, Path]:
    def build(root: Path) -> None:
        for name, (nproc, flags) in LAYOUTS.items():
            pool_train(rank_pools, nproc, f"--output_dir={root / name}", f"--policy.path={base}", *LORA, *DATA,
                       *flags, f"--steps={STEPS}", f"--save_freq={HALF}", "--log_freq=1",
                       f"--batch_size={GLOBAL_BATCH // nproc}", workdir=root)

    root = built_once(tmp_path_factory, "peft_runs", build)
    return {name: root / name for name in LAYOUTS}


def step_dir(run: Path, step: int) -> Path:
    return run / "checkpoints" / f"{step:06d}"


def adapter_tensors(step: Path) -> dict[str, torch.Tensor]:
    """The adapter a checkpoint holds: the gathered file, else its DCP shards read in one process."""
    pretrained = step / "pretrained_model"
    if (pretrained / "adapter_model.safetensors").is_file():
        return load_file(pretrained / "adapter_model.safetensors")
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    target = step.parent.parent / f"adapter_{step.name}.pt"
    dcp_to_torch_save(pretrained / "pytorch_model_fsdp_0", target)
    return torch.load(target, weights_only=True)


def expected_adapter_keys(step: Path) -> set[str]:
    """What peft itself would save for this run's settings: the saved names of a freshly wrapped base."""
    from lerobot_kit.core.checkpoint.pretrained import load_pretrained
    from lerobot_kit.core.config.flags import parse_train_config
    from lerobot_kit.core.model.peft import base_path_of, saved_key_map, wrap_policy

    config = parse_train_config([f"--config_path={step / 'pretrained_model' / 'train_config.json'}"])
    policy, _, _ = load_pretrained(Path(str(config.policy.path)))
    return set(saved_key_map(wrap_policy(policy, config.peft, base_path_of(str(config.policy.path)))).values())


def reproduced_loss(step: Path, scratch: Path) -> float:
    """The loss of the global batch that follows ``step``, from base file + adapter checkpoint in one process."""
    from lerobot_kit.core.checkpoint.pretrained import load_peft_model
    from lerobot_kit.core.config.flags import parse_train_config
    from lerobot_kit.core.data.build import build_dataset
    from lerobot_kit.core.data.sampler import DataPosition, ResumableBatchSampler
    from lerobot_kit.core.offline.convert import convert_dcp

    config = parse_train_config([f"--config_path={step / 'pretrained_model' / 'train_config.json'}"])
    info = json.loads((step / "training_state" / "training_step.json").read_text())
    pretrained = step / "pretrained_model"
    if not (pretrained / "adapter_model.safetensors").is_file():  # dcp only: convert a copy
        pretrained = Path(shutil.copytree(pretrained, scratch / "pretrained_model"))
        convert_dcp(pretrained)
    model, pre, _ = load_peft_model(pretrained)
    model.train()  # as in training (no dropout, no VAE sampling in these runs)
    dataset = build_dataset(config)
    sampler = ResumableBatchSampler(len(dataset), GLOBAL_BATCH, 1, 0, config.seed, start=DataPosition(**info["sampler"]))
    indices = next(iter(sampler))
    with torch.no_grad():
        loss, _ = model(pre(torch.utils.data.default_collate([dataset[i] for i in indices])))
    return loss.item()


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_only_the_adapter_trains_and_is_saved(runs, base, layout, tmp_path):
    out = runs[layout]
    losses = [m["loss"] for m in read_metrics(out)]
    print(f"{layout}: loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    assert losses[-1] < 0.5 * losses[0]

    half, last = adapter_tensors(step_dir(out, HALF)), adapter_tensors(step_dir(out, STEPS))
    assert set(half) == set(last) == expected_adapter_keys(step_dir(out, STEPS))
    assert all(".lora_A." in k or ".lora_B." in k or k.startswith("base_model.model.action_head.") for k in last)
    unchanged = [k for k in last if torch.equal(half[k], last[k])]
    assert not unchanged, f"adapter tensors that stopped training: {unchanged}"
    assert all(last[k].dtype == torch.float32 for k in last)

    # The frozen base the run computed with is the base file: the in-memory model's loss of
    # the step after the half-way checkpoint is what base file + that adapter give.
    assert reproduced_loss(step_dir(out, HALF), tmp_path) == pytest.approx(losses[HALF], rel=1e-5)

    pretrained = step_dir(out, STEPS) / "pretrained_model"
    assert not (pretrained / "model.safetensors").exists()
    adapter_config = json.loads((pretrained / "adapter_config.json").read_text())
    assert adapter_config["peft_type"] == "LORA" and adapter_config["r"] == 4 and adapter_config["lora_alpha"] == 8
    assert adapter_config["base_model_name_or_path"] == str((base / "pretrained_model").resolve())
    base_config = json.loads((base / "pretrained_model" / "config.json").read_text())
    run_config = json.loads((pretrained / "config.json").read_text())
    assert {k: v for k, v in run_config.items() if k != "path"} == {k: v for k, v in base_config.items() if k != "path"}
    train_config = json.loads((pretrained / "train_config.json").read_text())
    assert train_config["peft"]["method_type"] == "LORA"
    assert train_config["policy"]["path"] == adapter_config["base_model_name_or_path"]  # pinned: `last` may move

    adapter_bytes = sum(t.numel() * t.element_size() for t in last.values())
    base_bytes = sum(t.numel() * t.element_size() for t in load_file(base / "pretrained_model/model.safetensors").values())
    print(f"{layout}: adapter checkpoint {adapter_bytes} bytes, full model {base_bytes} bytes")
    assert adapter_bytes < 0.25 * base_bytes

    report = run_cli("inspect-checkpoint", "--json", str(step_dir(out, STEPS)))
    assert report.returncode == 0, report.stdout + report.stderr
    inspected = json.loads(report.stdout)
    assert inspected["peft"] is True and inspected["ok"]
    # A dcp-only checkpoint loads after convert-dcp, as for full models.
    assert inspected["loadable"]["ok"] == (layout != "fsdp2"), inspected["loadable"]
    optimizer_tensors = [t["name"] for f in inspected["files"] if f["path"].startswith("training_state/optimizer")
                         for t in f.get("tensors", [])]
    assert optimizer_tensors and all(".lora_" in n or ".modules_to_save." in n for n in optimizer_tensors)


def test_loading_the_adapter_gives_the_base_unchanged_and_peft_agrees(runs, base, tmp_path):
    """load_pretrained (merged), our unmerged loader, peft's own loader and merge_adapter agree."""
    from peft import PeftModel, get_base_model_state_dict

    from lerobot_kit.core.checkpoint.pretrained import load_peft_model, load_pretrained, merge_adapter

    pretrained = step_dir(runs["hsdp2x2"], STEPS) / "pretrained_model"
    ours, pre, _ = load_peft_model(pretrained)
    base_file = load_file(base / "pretrained_model/model.safetensors")
    base_now = get_base_model_state_dict(ours)
    assert set(base_now) == set(base_file) and all(torch.equal(base_now[k], base_file[k]) for k in base_file)

    theirs = PeftModel.from_pretrained(load_pretrained(base)[0], str(pretrained))
    merged, _, _ = load_pretrained(pretrained)
    merge_adapter(pretrained, tmp_path / "merged")
    assert (tmp_path / "merged" / "model.safetensors").is_file()
    reloaded, _, _ = load_pretrained(tmp_path / "merged")

    from lerobot_kit.plugins.datasets.reach.data import make_reach_dataset
    from lerobot_kit.plugins.datasets.reach.plugin import ReachDatasetConfig

    dataset = make_reach_dataset(ReachDatasetConfig(num_episodes=2, episode_length=20), merged.config.delta_indices())
    batch = pre(torch.utils.data.default_collate([dataset[i] for i in (0, 7, 23)]))
    observation = {k: v for k, v in batch.items() if k.startswith("observation.")}

    def first_action(model: torch.nn.Module) -> torch.Tensor:
        model.eval()
        model.reset()
        return model.select_action(observation)

    action = first_action(ours)
    assert torch.equal(first_action(theirs), action)
    merged_action = first_action(merged)
    torch.testing.assert_close(merged_action, action, rtol=1e-5, atol=1e-5)
    assert torch.equal(first_action(reloaded), merged_action)


def resume_from_half(pools, run: Path, copy: Path, nproc: int, *flags: str) -> None:
    """Resume a copy of ``run`` as if it had stopped right after the half-way checkpoint."""
    shutil.copytree(run, copy, symlinks=True)
    shutil.rmtree(step_dir(copy, STEPS))
    (copy / "checkpoints" / "last").unlink()
    (copy / "checkpoints" / "last").symlink_to(f"{HALF:06d}")
    (copy / "logs" / "metrics.jsonl").unlink()
    config = step_dir(copy, HALF) / "pretrained_model" / "train_config.json"
    pool_train(pools, nproc, "--resume=true", f"--config_path={config}", *flags, workdir=copy.parent)


def test_resume_restores_the_adapter_exactly_and_reshards(runs, tmp_path, rank_pools):
    straight = runs["fsdp2"]
    expected = adapter_tensors(step_dir(straight, STEPS))
    straight_losses = [m["loss"] for m in read_metrics(straight)][HALF:]

    resumed = tmp_path / "fsdp2_resumed"
    resume_from_half(rank_pools, straight, resumed, 2)
    got = adapter_tensors(step_dir(resumed, STEPS))
    assert set(got) == set(expected) and all(torch.equal(got[k], expected[k]) for k in expected)
    assert [m["loss"] for m in read_metrics(resumed)] == straight_losses

    resharded = tmp_path / "fsdp4_resumed"
    resume_from_half(rank_pools, straight, resharded, 4, "--parallelism.dp_shard=4", f"--batch_size={GLOBAL_BATCH // 4}")
    info = json.loads((step_dir(resharded, STEPS) / "training_state" / "training_step.json").read_text())
    assert info["topology"]["dp_shard"] == 4 and info["peft"] is True
    # Same global batches, split over four ranks: equal up to float summation order.
    assert [m["loss"] for m in read_metrics(resharded)] == pytest.approx(straight_losses, rel=1e-4)
    got = adapter_tensors(step_dir(resharded, STEPS))
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=0, atol=5e-3)


def test_convert_dcp_gives_the_gathered_adapter(runs, tmp_path):
    step = tmp_path / "step"
    shutil.copytree(step_dir(runs["hsdp2x2"], STEPS), step)
    pretrained = step / "pretrained_model"
    gathered = load_file(pretrained / "adapter_model.safetensors")
    (pretrained / "adapter_model.safetensors").unlink()
    result = run_cli("convert-dcp", f"--checkpoint_dir={step}")
    assert result.returncode == 0, result.stdout + result.stderr
    converted = load_file(pretrained / "adapter_model.safetensors")
    assert set(converted) == set(gathered) and all(torch.equal(converted[k], gathered[k]) for k in gathered)
    assert any(k.startswith("base_model.model.action_head.") for k in converted)  # the fully trained module


# --- errors -------------------------------------------------------------------------------


def run_error(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> str:
    result = run_cli("train", f"--output_dir={tmp_path / 'run'}", *DATA, "--steps=2", *args,
                     env=launch_env(tmp_path, env))
    assert result.returncode == 2, result.stdout + result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    return result.stderr


def test_peft_without_a_pretrained_policy_is_refused(tmp_path):
    err = run_error(tmp_path, "--peft.method_type=LORA")
    assert "--policy.path" in err and "--peft.method_type=LORA" in err


def test_unknown_peft_method_lists_the_known_ones(tmp_path, base):
    err = run_error(tmp_path, f"--policy.path={base}", "--peft.method_type=PREFIX_TUNING")
    assert "PREFIX_TUNING" in err and "LORA, LOHA, LOKR, IA3" in err


def test_target_modules_matching_nothing_are_refused(tmp_path, base):
    err = run_error(tmp_path, f"--policy.path={base}", "--peft.method_type=LORA", '--peft.target_modules=["qproj"]')
    assert "--peft.target_modules: 'qproj' matches no module" in err and "q_proj" in err


def test_missing_peft_package_names_the_extra(tmp_path, base):
    blocker = tmp_path / "blocked"
    (blocker / "peft").mkdir(parents=True)
    (blocker / "peft" / "__init__.py").write_text("raise ImportError('peft is not installed here')\n")
    err = run_error(tmp_path, f"--policy.path={base}", "--peft.method_type=LORA", env={"PYTHONPATH": str(blocker)})
    assert "pip install 'lerobot-kit[peft]'" in err


def _bf16_base_with_trained_norms(base: Path, mixed_precision: str):
    """A bf16 base with its LayerNorms trained in full: peft keeps LoRA in fp32 beside bf16 norm copies."""
    from lerobot_kit.core.checkpoint.pretrained import load_pretrained
    from lerobot_kit.core.config.schema import PeftConfig, TrainConfig
    from lerobot_kit.core.model.peft import base_path_of, wrap_policy
    from lerobot_kit.core.parallel.dims import ParallelDims
    from lerobot_kit.core.parallel.trainable_dtypes import align_trainable_dtypes
    from lerobot_kit.core.parallel.wrap_units import resolve_wrap_units
    from lerobot_kit.plugins.policies.act.modeling import ACTPolicy

    policy, _, _ = load_pretrained(base)
    policy.to(torch.bfloat16)
    peft_config = PeftConfig(method_type="LORA", r=2, full_training_modules=["norm1"])
    model = wrap_policy(policy, peft_config, base_path_of(base))
    config = TrainConfig.model_validate({"accelerator": {"mixed_precision": mixed_precision}})
    dims = ParallelDims(dp_replicate=1, dp_shard=2, world_size=2)
    wrap = resolve_wrap_units(model, dims, config.accelerator, ACTPolicy._fsdp_wrap_modules)
    align_trainable_dtypes(model, config.accelerator, dims, wrap)
    return model


def test_trainable_dtype_conflict_in_an_fsdp_unit_is_refused(base):
    from lerobot_kit.core.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        _bf16_base_with_trained_norms(base, "no")
    message = str(err.value)
    assert "FSDP unit 'base_model.model.encoder.layers.0'" in message
    assert "bfloat16: base_model.model.encoder.layers.0.norm1.modules_to_save.default.weight" in message
    assert "float32: base_model.model.encoder.layers.0.self_attn.q_proj.lora_A.default.weight" in message
    assert "--accelerator.mixed_precision=bf16" in message


def test_mixed_precision_keeps_every_trainable_parameter_fp32(base):
    model = _bf16_base_with_trained_norms(base, "bf16")
    trainable = {n: p.dtype for n, p in model.named_parameters() if p.requires_grad}
    frozen = {p.dtype for p in model.parameters() if not p.requires_grad}
    assert any("norm1.modules_to_save" in n for n in trainable)
    assert set(trainable.values()) == {torch.float32} and frozen == {torch.bfloat16}


# --- other methods ------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["LOHA", "LOKR", "IA3"])
def test_other_methods_train_save_and_load(base, tmp_path, method):
    """One optimizer step, the adapter-only save every format uses, and a strict reload."""
    from lerobot_kit.core.checkpoint.pretrained import load_peft_model, load_pretrained, save_pretrained
    from lerobot_kit.core.checkpoint.weights import write_gathered
    from lerobot_kit.core.config.schema import PeftConfig
    from lerobot_kit.core.model.peft import base_path_of, model_weights, wrap_policy
    from lerobot_kit.plugins.datasets.reach.data import make_reach_dataset
    from lerobot_kit.plugins.datasets.reach.plugin import ReachDatasetConfig

    policy, pre, post = load_pretrained(base)
    frozen = {k: v.clone() for k, v in policy.state_dict().items()}
    model = wrap_policy(policy, PeftConfig(method_type=method, r=2), base_path_of(base))
    dataset = make_reach_dataset(ReachDatasetConfig(num_episodes=2, episode_length=20), policy.config.delta_indices())
    batch = pre(torch.utils.data.default_collate([dataset[i] for i in range(8)]))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model(batch)[0].backward()
    optimizer.step()

    pretrained = tmp_path / "pretrained_model"
    save_pretrained(model, policy.meta, pre, post, None, pretrained)
    write_gathered(model_weights(model), pretrained, sharded=False, is_main=True)
    assert json.loads((pretrained / "adapter_config.json").read_text())["peft_type"] == method
    saved = load_file(pretrained / "adapter_model.safetensors")
    assert len(saved) == sum(p.requires_grad for p in model.parameters())

    reloaded, _, _ = load_peft_model(pretrained)
    model.eval()
    observation = {k: v for k, v in batch.items() if k.startswith("observation.")}
    assert torch.equal(reloaded.select_action(observation), model.select_action(observation))
    from peft import get_base_model_state_dict

    base_now = get_base_model_state_dict(model)
    assert all(torch.equal(base_now[k], frozen[k]) for k in frozen)


def test_plan_counts_only_the_adapters_as_trainable(base, runs):
    """``lerobot plan`` with --peft.*: the frozen base holds no gradients nor AdamW state;
    the trainable count equals what the real run saved as its adapter."""
    from lerobot_kit.core.layout.dcp_metadata import read_dcp_metadata, tensor_entries

    adapter = load_file(runs["single"] / "checkpoints" / f"{STEPS:06d}" / "pretrained_model" / "adapter_model.safetensors")
    trained = sum(t.numel() for t in adapter.values())
    proc = run_cli("plan", "--world_size=1", "--json", f"--policy.path={base}", *LORA, *DATA, NAMED)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["policy"] == "PeftModel(ACTPolicy)"
    assert 0 < plan["trainable_params"] == trained < plan["total_params"]
    assert plan["per_rank"]["grads_bytes"] == 4 * trained
    assert plan["per_rank"]["optimizer_bytes"] == 2 * 4 * trained + 4 * len(adapter)

    shards = runs["fsdp2"] / "checkpoints" / f"{STEPS:06d}" / "pretrained_model" / "pytorch_model_fsdp_0"
    sharded = sum(math.prod(e.size) for e in tensor_entries(read_dcp_metadata(shards)).values())
    fsdp_flags = ["--world_size=2", "--json", f"--policy.path={base}", *LORA, *DATA, *LAYOUTS["fsdp2"][1]]
    proc = run_cli("plan", *fsdp_flags)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["layout"] == "fsdp" and plan["trainable_params"] == sharded
    assert plan["per_rank"]["grads_bytes"] < plan["ddp_per_rank"]["grads_bytes"] == 4 * sharded
