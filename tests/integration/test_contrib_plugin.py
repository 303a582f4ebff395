"""contrib/lerobot-kit-mlp, pip-installed as a user would, then listed, trained and resumed.

The package is built and installed by pip (a real wheel with its entry point) into a
private ``--target`` folder put on ``PYTHONPATH``: the test environment is left as it
was, and tests running alongside never see the plugin.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from checkpoint_state import crashed_copy, losses
from conftest import REPO, run_cli, torchrun_train
from plugin_dists import fresh_registry
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from lerobot_kit.core.layout.manifest import write_manifest

CONTRIB = REPO / "contrib" / "lerobot-kit-mlp"
PLUGIN = "lerobot_kit_mlp"
TINY_MLP = ["--policy.type=residual_mlp", "--dataset.type=pendulum", "--policy.width=64", "--policy.n_blocks=3",
            "--batch_size=16", "--optimizer.lr=1e-3", "--log_freq=5"]
FSDP2 = ["--parallelism.dp_shard=2", "--checkpoint_format=safetensors_fp16"]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The plugin installed by pip. Built from a copy: pip builds in the source tree."""
    root = tmp_path_factory.mktemp("contrib")
    source = root / "src"
    shutil.copytree(CONTRIB, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = root / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "--target", str(target), str(source)],
        check=True, capture_output=True, timeout=120,
    )
    return target


def with_plugin(site: Path, **extra: str) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])), **extra}


@pytest.fixture
def plugin(site, monkeypatch):
    """The installed plugin importable in this process, with a registry that includes it."""
    monkeypatch.syspath_prepend(str(site))
    fresh_registry(monkeypatch)
    yield


def test_listed_with_its_package_version_and_registrations(site):
    result = run_cli("plugins", "--json", env=with_plugin(site))
    assert result.returncode == 0, result.stderr
    row = next(r for r in json.loads(result.stdout) if r["plugin"] == PLUGIN)
    assert (row["package"], row["version"], row["builtin"]) == ("lerobot-kit-mlp", "0.1.0", False)
    assert {(i["kind"], i["name"]) for i in row["registered"]} == {
        ("policy", "residual_mlp"), ("dataset", "pendulum"), ("checkpoint_format", "safetensors_fp16")}
    blocked = run_cli("plugins", "--json", env=with_plugin(site, LEROBOT_DISABLE_PLUGINS=PLUGIN))
    assert blocked.returncode == 0, blocked.stderr
    assert PLUGIN not in {r["plugin"] for r in json.loads(blocked.stdout)}


def test_registration_module_imports_no_torch(site):
    code = f"import sys, {PLUGIN}; assert 'torch' not in sys.modules, 'the hook module imported torch'"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            env={**os.environ, **with_plugin(site)})
    assert result.returncode == 0, result.stderr


def test_fsdp_training_with_fp16_checkpoints_resumes(site, tmp_path):
    """FSDP(2) over the policy's own wrap units, saving fp16 weights.

    A resume from the fp16 checkpoint differs from the uninterrupted run only because the
    weights were rounded to fp16 at the save. So it is checked against a run resumed from
    the same checkpoint with those rounded weights widened to fp32 and stored by the
    built-in format: bitwise equal, which shows the format restores exactly what it stored
    and the toolkit the rest (optimizer, RNG, data position).
    """
    env = with_plugin(site)
    straight = tmp_path / "straight"
    first = torchrun_train(2, f"--output_dir={straight}", *TINY_MLP, *FSDP2, "--steps=50", "--save_freq=40",
                           workdir=tmp_path, env=env, timeout=180)
    assert "wrap units: 3 from policy (ResidualBlock)" in first.stderr
    uninterrupted = losses(straight)
    assert len(uninterrupted) == 10 and uninterrupted[7] < 0.4 * uninterrupted[0], uninterrupted

    step = straight / "checkpoints" / "000040"
    weights = step / "pretrained_model" / "model.safetensors"
    stored = load_file(weights)
    assert {t.dtype for t in stored.values()} == {torch.float16}
    assert weights.stat().st_size < 2.2 * sum(t.numel() for t in stored.values())  # fp32 would be ~4 bytes each
    assert json.loads((step / "training_state" / "training_step.json").read_text())["checkpoint_format"] == \
        "safetensors_fp16"
    inspected = run_cli("inspect-checkpoint", str(step), "--json", env=env)
    assert inspected.returncode == 0, inspected.stdout + inspected.stderr

    fp16 = crashed_copy(straight, 40, tmp_path / "fp16")
    widened = crashed_copy(straight, 40, tmp_path / "widened")
    widened_step = widened / "checkpoints" / "000040"
    widened_weights = {name: t.float() if t.dtype == torch.float16 else t for name, t in stored.items()}
    save_file(widened_weights, str(widened_step / "pretrained_model" / "model.safetensors"), metadata={"format": "pt"})
    info_file = widened_step / "training_state" / "training_step.json"
    info_file.write_text(json.dumps({**json.loads(info_file.read_text()), "checkpoint_format": "safetensors"}))
    write_manifest(widened_step)
    for run in (fp16, widened):
        config = run / "checkpoints" / "last" / "pretrained_model" / "train_config.json"
        resumed = torchrun_train(2, "--resume=true", f"--config_path={config}", workdir=tmp_path, env=env,
                                 timeout=120)
        assert "steps 40→50" in resumed.stderr
    assert len(losses(fp16, after=40)) == 2 and losses(fp16, after=40) == losses(widened, after=40)
    final = "checkpoints/000050/pretrained_model/model.safetensors"
    a, b = load_file(fp16 / final), load_file(widened / final)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_fp16_weights_load_through_policy_path(site, tmp_path, plugin):
    """What ``--policy.path`` does: a strict load that widens the fp16 file into fp32 parameters."""
    from lerobot_kit.api import load_pretrained

    result = run_cli("train", f"--output_dir={tmp_path / 'run'}", *TINY_MLP, "--checkpoint_format=safetensors_fp16",
                     "--steps=2", "--save_freq=2", env=with_plugin(site), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    pretrained = tmp_path / "run" / "checkpoints" / "last" / "pretrained_model"
    policy, _, _ = load_pretrained(pretrained)
    stored = load_file(pretrained / "model.safetensors")
    for name, param in policy.state_dict().items():
        assert param.dtype == torch.float32 and stored[name].dtype == torch.float16, name
        assert torch.equal(param, stored[name].float()), name


def test_its_policy_and_format_evaluate_on_the_reach_task(site, tmp_path):
    """The plugin's policy, trained on the built-in reach data and saved in the plugin's fp16
    format, goes through ``lerobot eval`` like a built-in one."""
    env = with_plugin(site)
    flags = [flag for flag in TINY_MLP if not flag.startswith("--dataset.type")]
    trained = run_cli("train", f"--output_dir={tmp_path / 'run'}", *flags, "--checkpoint_format=safetensors_fp16",
                      "--steps=2", env=env, cwd=tmp_path, timeout=240)
    assert trained.returncode == 0, trained.stderr[-3000:]
    result = run_cli("eval", f"--policy.path={tmp_path / 'run' / 'checkpoints' / 'last'}", "--eval.n_episodes=2",
                     "--eval.max_episodes_rendered=0", "--env.episode_length=20", "--output_dir=out", env=env,
                     cwd=tmp_path, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    info = json.loads((tmp_path / "out" / "eval_info.json").read_text())
    assert [row["seed"] for row in info["per_episode"]] == [1000, 1001] and info["expert"] is not None


def test_fp16_format_keeps_out_of_range_tensors_in_fp32(plugin, tmp_path):
    from lerobot_kit_mlp.configuration import PendulumDatasetConfig, ResidualMLPConfig
    from lerobot_kit_mlp.dataset import make_pendulum_dataset
    from lerobot_kit_mlp.format import NARROWED_KEY, Fp16SafetensorsFormat
    from lerobot_kit_mlp.modeling import ResidualMLPPolicy

    from lerobot_kit.api import model_weights

    config = ResidualMLPConfig(width=16, n_blocks=2)
    meta = make_pendulum_dataset(PendulumDatasetConfig(num_episodes=2), config.delta_indices()).meta
    torch.manual_seed(0)
    policy = ResidualMLPPolicy(config, meta)
    with torch.no_grad():
        policy.head.bias[0] = 1e6  # beyond float16's 65504
    fmt = Fp16SafetensorsFormat()
    assert fmt.save_weights(model_weights(policy), tmp_path, sharded=False, is_main=True) == "gathered"
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        dtypes = {name: f.get_slice(name).get_dtype() for name in f.keys()}
        narrowed = json.loads(f.metadata()[NARROWED_KEY])
    assert dtypes.pop("head.bias") == "F32" and set(dtypes.values()) == {"F16"}
    assert sorted(narrowed) == sorted(dtypes)

    torch.manual_seed(1)
    fresh = ResidualMLPPolicy(config, meta)
    fmt.load_weights(model_weights(fresh), tmp_path, distributed=False, is_main=True)
    for name, param in fresh.state_dict().items():
        expected = policy.state_dict()[name]
        tolerance = 0 if name == "head.bias" else 1e-3
        assert param.dtype == torch.float32
        assert torch.allclose(param, expected, rtol=tolerance, atol=1e-4), name


def test_fp16_format_stores_a_peft_adapter_with_no_code_of_its_own(plugin, tmp_path):
    """The format only encodes: the toolkit's writers pick the adapter's tensors, peft's names
    and ``adapter_model.safetensors``, which peft itself then loads."""
    from lerobot_kit_mlp.configuration import PendulumDatasetConfig, ResidualMLPConfig
    from lerobot_kit_mlp.dataset import make_pendulum_dataset
    from lerobot_kit_mlp.format import Fp16SafetensorsFormat
    from lerobot_kit_mlp.modeling import ResidualMLPPolicy
    from peft import PeftModel

    from lerobot_kit.api import model_weights
    from lerobot_kit.core.checkpoint.pretrained import save_pretrained
    from lerobot_kit.core.config.schema import PeftConfig
    from lerobot_kit.core.model.peft import saved_key_map, wrap_policy

    config = ResidualMLPConfig(width=16, n_blocks=2)
    dataset = make_pendulum_dataset(PendulumDatasetConfig(num_episodes=2), config.delta_indices())

    def wrapped() -> torch.nn.Module:
        torch.manual_seed(0)
        return wrap_policy(ResidualMLPPolicy(config, dataset.meta), PeftConfig(method_type="LORA", r=2), tmp_path)

    model = wrapped()
    batch = {k: torch.stack([dataset[i][k] for i in range(8)]) for k in dataset[0]}
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    model(batch)[0].backward()
    optimizer.step()
    fmt = Fp16SafetensorsFormat()
    save_pretrained(model, dataset.meta, None, None, None, tmp_path)
    assert fmt.save_weights(model_weights(model), tmp_path, sharded=False, is_main=True) == "gathered"

    assert not (tmp_path / "model.safetensors").exists()
    stored = load_file(tmp_path / "adapter_model.safetensors")
    assert set(stored) == set(saved_key_map(model).values())
    assert {t.dtype for t in stored.values()} == {torch.float16}

    adapter = {k: v for k, v in model.state_dict().items() if "lora_" in k}
    theirs = PeftModel.from_pretrained(ResidualMLPPolicy(config, dataset.meta), str(tmp_path))
    ours = wrapped()
    fmt.load_weights(model_weights(ours), tmp_path, distributed=False, is_main=True)
    for loaded in (theirs, ours):
        for name, tensor in adapter.items():
            assert loaded.state_dict()[name].dtype == torch.float32
            torch.testing.assert_close(loaded.state_dict()[name], tensor, rtol=1e-3, atol=1e-4)
    assert any(not torch.equal(ours.state_dict()[k], wrapped().state_dict()[k]) for k in adapter)


def test_policy_contract_meta_build_forward_and_action_queue(plugin):
    from lerobot_kit_mlp.configuration import PendulumDatasetConfig, ResidualMLPConfig
    from lerobot_kit_mlp.dataset import make_pendulum_dataset
    from lerobot_kit_mlp.modeling import ResidualMLPPolicy

    config = ResidualMLPConfig(width=16, n_blocks=2, chunk_size=6, n_action_steps=3)
    dataset = make_pendulum_dataset(PendulumDatasetConfig(num_episodes=3, episode_length=10), config.delta_indices())
    torch.manual_seed(7)
    eager = ResidualMLPPolicy(config, dataset.meta)
    torch.manual_seed(7)
    with torch.device("meta"):
        lazy = ResidualMLPPolicy(config, dataset.meta)
    lazy.to_empty(device="cpu")
    lazy.init_weights()
    for name, tensor in eager.state_dict().items():
        assert torch.equal(tensor, lazy.state_dict()[name]), name

    batch = {k: torch.stack([dataset[i][k] for i in range(4)]) for k in dataset[0]}
    loss, logs = eager(batch)
    assert loss.ndim == 0 and loss.requires_grad
    assert all(v.ndim == 0 and not v.requires_grad for v in logs.values())
    chunk = eager.predict_action_chunk(batch)
    assert chunk.shape == (4, 6, 1)
    actions = [eager.select_action(batch) for _ in range(3)]
    assert all(torch.equal(a, chunk[:, i]) for i, a in enumerate(actions))
    eager.reset()
    assert not eager._action_queue


def test_pendulum_frames_follow_the_expert_and_pad_at_episode_ends(plugin):
    from lerobot_kit_mlp.configuration import PendulumDatasetConfig
    from lerobot_kit_mlp.dataset import expert_torque, make_pendulum_dataset

    dataset = make_pendulum_dataset(PendulumDatasetConfig(num_episodes=2, episode_length=10), {"action": [0, 1, 2]})
    assert len(dataset) == 20
    states, actions = dataset.frames["observation.state"], dataset.frames["action"]
    np.testing.assert_allclose(actions[:, 0], expert_torque(*states.T), rtol=1e-5, atol=1e-5)
    last = dataset[9]
    assert last["action"].shape == (3, 1) and last["action_is_pad"].tolist() == [False, True, True]
    assert dataset[10]["episode_index"].item() == 1 and not dataset[10]["action_is_pad"].any()
