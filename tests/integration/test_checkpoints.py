"""Sharded checkpoints: exact resume in every format, resharding onto other topologies,
crash safety under kill -9, the layout-version guard. Real gloo processes, watchdogs on."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from conftest import TINY_ACT, launch_env, read_metrics, run_cli, script, torchrun_train

from lerobot_kit.core.checkpoint.training_state import load_full_optimizer

PROBE = Path(__file__).resolve().parents[1] / "probes" / "restore_probe.py"
# 40 samples, global batch 16: 2 steps per epoch, so 6 steps cross two epoch boundaries.
SMALL_DATA = ["--dataset.num_episodes=2", "--dataset.episode_length=20"]
COMMON = [*TINY_ACT, *SMALL_DATA, "--batch_size=8", "--log_freq=1", "--seed=5"]


def full_weights(pretrained: Path, workdir: Path) -> dict[str, torch.Tensor]:
    gathered = pretrained / "model.safetensors"
    if gathered.is_file():
        return load_file(gathered)
    target = workdir / f"weights_{abs(hash(str(pretrained)))}.pt"
    dcp_to_torch_save(str(pretrained / "pytorch_model_fsdp_0"), str(target))
    return torch.load(target, weights_only=True)


def full_optimizer(state_dir: Path, workdir: Path) -> dict[str, dict[str, torch.Tensor]]:
    shards = state_dir / "optimizer_0"
    if not shards.is_dir():
        return load_full_optimizer(state_dir)["state"]
    target = workdir / f"optim_{abs(hash(str(state_dir)))}.pt"
    dcp_to_torch_save(str(shards), str(target))
    return torch.load(target, weights_only=True)["state"]


def assert_same_state(a: Path, b: Path, workdir: Path) -> None:
    wa, wb = full_weights(a / "pretrained_model", workdir), full_weights(b / "pretrained_model", workdir)
    assert wa.keys() == wb.keys()
    for key in wa:
        assert torch.equal(wa[key], wb[key]), f"weight {key} differs"
    oa, ob = full_optimizer(a / "training_state", workdir), full_optimizer(b / "training_state", workdir)
    assert oa.keys() == ob.keys()
    for fqn in oa:
        for key in oa[fqn]:
            assert torch.equal(oa[fqn][key], ob[fqn][key]), f"optimizer {fqn}.{key} differs"


@pytest.fixture(scope="module")
def straight_fsdp2(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("straight")
    out = root / "run"
    torchrun_train(2, f"--output_dir={out}", *COMMON, "--parallelism.dp_shard=2", "--steps=6", "--save_freq=6",
                   "--checkpoint_format=safetensors_dcp", workdir=root)
    return out


@pytest.mark.parametrize("fmt", ["safetensors", "dcp", "safetensors_dcp"])
def test_fsdp_resume_is_bitwise_exact_in_every_format(tmp_path, straight_fsdp2, fmt):
    out = tmp_path / "split"
    flags = [*COMMON, "--parallelism.dp_shard=2", f"--checkpoint_format={fmt}"]
    torchrun_train(2, f"--output_dir={out}", *flags, "--steps=3", "--save_freq=3", workdir=tmp_path)
    pretrained = out / "checkpoints/000003/pretrained_model"
    assert (pretrained / "model.safetensors").is_file() == (fmt != "dcp")
    assert (pretrained / "pytorch_model_fsdp_0").is_dir() == (fmt != "safetensors")
    assert (out / "checkpoints/000003/training_state/optimizer_0").is_dir()
    assert not (out / "checkpoints/000003/training_state/optimizer_state.safetensors").exists()
    config = pretrained / "train_config.json"
    torchrun_train(2, "--resume=true", f"--config_path={config}", "--steps=6", "--save_freq=3", workdir=tmp_path)
    assert [m["loss"] for m in read_metrics(out)] == [m["loss"] for m in read_metrics(straight_fsdp2)]
    assert_same_state(straight_fsdp2 / "checkpoints/000006", out / "checkpoints/000006", tmp_path)
    info = json.loads((out / "checkpoints/000006/training_state/training_step.json").read_text())
    assert info["sampler"]["epoch"] >= 2
    inspected = run_cli("inspect-checkpoint", str(out / "checkpoints/000006"))
    assert inspected.returncode == 0, inspected.stdout + inspected.stderr


def test_gathered_weights_load_with_plain_safetensors_and_shards_with_torch_readers(tmp_path, straight_fsdp2):
    from lerobot_kit.core.model.policy import load_pretrained

    step = straight_fsdp2 / "checkpoints/000006/pretrained_model"
    gathered = load_file(step / "model.safetensors")
    assert all(t.dtype == torch.float32 for t in gathered.values())
    sharded = full_weights_from_dcp(step, tmp_path)
    assert gathered.keys() == sharded.keys() and all(torch.equal(gathered[k], sharded[k]) for k in gathered)
    policy, _, _ = load_pretrained(step)
    fresh = policy.state_dict()
    for key, value in fresh.items():
        assert torch.equal(value, gathered[key])


def full_weights_from_dcp(pretrained: Path, workdir: Path) -> dict[str, torch.Tensor]:
    target = workdir / "from_dcp.pt"
    dcp_to_torch_save(str(pretrained / "pytorch_model_fsdp_0"), str(target))
    return torch.load(target, weights_only=True)


def _source(root: Path, name: str, nproc: int, flags: list[str]) -> Path:
    out = root / name
    torchrun_train(nproc, f"--output_dir={out}", *COMMON, *flags, "--steps=4", "--save_freq=4",
                   "--checkpoint_format=safetensors_dcp", workdir=root)
    return out


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sources")
    return {
        "fsdp2": _source(root, "fsdp2", 2, ["--parallelism.dp_shard=2"]),
        "hsdp2x2": _source(root, "hsdp2x2", 4, ["--parallelism.dp_replicate=2", "--parallelism.dp_shard=2",
                                                 "--batch_size=4"]),
        "ddp2": _source(root, "ddp2", 2, []),
    }


UNSET = ["--parallelism.dp_replicate=null", "--parallelism.dp_shard=null"]


@pytest.mark.parametrize(
    ("source", "nproc", "flags", "sample_exact"),
    [
        ("fsdp2", 4, ["--parallelism.dp_replicate=null", "--parallelism.dp_shard=4"], False),
        ("fsdp2", 1, UNSET, False),
        ("hsdp2x2", 2, ["--parallelism.dp_replicate=null", "--parallelism.dp_shard=2"], False),
        ("ddp2", 2, ["--parallelism.dp_shard=2"], True),
        ("fsdp2", 2, UNSET, True),
    ],
    ids=["fsdp2-to-fsdp4", "fsdp2-to-one-process", "hsdp2x2-to-fsdp2", "ddp2-to-fsdp2", "fsdp2-to-ddp2"],
)
def test_resume_reshards_onto_another_topology(tmp_path, sources, source, nproc, flags, sample_exact):
    run = tmp_path / "run"
    shutil.copytree(sources[source], run, symlinks=True)
    config = run / "checkpoints/last/pretrained_model/train_config.json"
    dump = tmp_path / "restored"
    args = [str(PROBE), str(dump), "--resume=true", f"--config_path={config}", *flags, "--steps=6", "--save_freq=6"]
    if nproc == 1:
        command = [sys.executable, *args]
    else:
        command = [script("torchrun"), "--standalone", f"--nproc-per-node={nproc}", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=tmp_path,
                            env=launch_env(tmp_path))
    assert result.returncode == 0, result.stderr[-4000:]
    saved = run / "checkpoints/000004"
    weights = load_file(saved / "pretrained_model/model.safetensors")
    restored = load_file(dump / "model.safetensors")
    assert weights.keys() == restored.keys()
    for key in weights:
        assert torch.equal(weights[key], restored[key]), f"weight {key} changed on load"
    saved_optim = full_optimizer(saved / "training_state", tmp_path)
    restored_optim = load_full_optimizer(dump)["state"]
    assert saved_optim.keys() == restored_optim.keys()
    for fqn in saved_optim:
        for key in saved_optim[fqn]:
            assert torch.equal(saved_optim[fqn][key], restored_optim[fqn][key]), f"optimizer {fqn}.{key} changed"
    info = json.loads((run / "checkpoints/000006/training_state/training_step.json").read_text())
    assert info["step"] == 6 and info["topology"]["world_size"] == nproc
    # Same dp_world_size and batch size: the data order continues exactly; else one warning.
    assert result.stderr.count("not sample-exact") == (0 if sample_exact else 1)


@pytest.mark.parametrize("background", [False, True], ids=["sync", "async"])
def test_kill_9_during_a_save_leaves_the_last_checkpoint_resumable(tmp_path, straight_fsdp2, background):
    from _dist_util import start_ranks

    out = tmp_path / "killed"
    train = [script("lerobot"), "train", f"--output_dir={out}", *COMMON, "--parallelism.dp_shard=2", "--steps=6",
             "--save_freq=2", "--checkpoint_format=safetensors_dcp", "--parallelism.timeout_s=15",
             f"--async_checkpoint={str(background).lower()}"]
    ranks = start_ranks(train, 2, tmp_path)
    temp = out / "checkpoints" / "000004.tmp"
    deadline = time.monotonic() + 120
    while not temp.exists():
        assert time.monotonic() < deadline, "the save of step 4 never started"
        assert all(r.proc.poll() is None for r in ranks), [r.output()[-2000:] for r in ranks]
        time.sleep(0.001)
    ranks[0].proc.send_signal(signal.SIGKILL)  # the rank that publishes, mid-save
    for r in ranks:
        r.proc.wait(timeout=60)  # the survivor must give up within the collective timeout
    assert ranks[1].proc.returncode != 0
    root = out / "checkpoints"
    assert (root / "last").resolve().name == "000002"
    assert not (root / "000004").exists()
    inspected = run_cli("inspect-checkpoint", str(root / "last"))
    assert inspected.returncode == 0, inspected.stdout + inspected.stderr
    config = root / "last/pretrained_model/train_config.json"
    torchrun_train(2, "--resume=true", f"--config_path={config}", "--steps=6", "--save_freq=2",
                   "--parallelism.timeout_s=600", workdir=tmp_path)
    assert (root / "last").resolve().name == "000006"
    assert not any(p.name.endswith(".tmp") for p in root.iterdir())
    assert_same_state(straight_fsdp2 / "checkpoints/000006", root / "000006", tmp_path)


def test_old_gathered_optimizer_layout_is_refused_on_resume(tmp_path, straight_fsdp2):
    run = tmp_path / "old"
    shutil.copytree(straight_fsdp2, run, symlinks=True)
    state = run / "checkpoints/000006/training_state"
    shutil.rmtree(state / "optimizer_0")
    (state / "optimizer_state.safetensors").write_bytes(b"\0" * 16)  # LeRobot 0.6 wrote one gathered file
    config = run / "checkpoints/last/pretrained_model/train_config.json"
    result = torchrun_train(2, "--resume=true", f"--config_path={config}", "--steps=8", workdir=tmp_path,
                            check=False)
    assert result.returncode != 0
    assert "older gathered-optimizer layout" in result.stderr and "--policy.path" in result.stderr
    assert "lerobot_kit" not in result.stderr.split("Traceback", 1)[-1]


def test_unknown_layout_version_is_refused(tmp_path, straight_fsdp2):
    run = tmp_path / "future"
    shutil.copytree(straight_fsdp2, run, symlinks=True)
    info_file = run / "checkpoints/000006/training_state/training_step.json"
    info = json.loads(info_file.read_text())
    info["layout_version"] = 99
    info_file.write_text(json.dumps(info))
    config = run / "checkpoints/last/pretrained_model/train_config.json"
    result = run_cli("train", "--resume=true", f"--config_path={config}", "--steps=8", "--parallelism.dp_shard=null")
    assert result.returncode != 0
    assert "layout version 99" in result.stderr and "Traceback" not in result.stderr


def test_dcp_only_checkpoint_needs_conversion_before_policy_path(tmp_path, straight_fsdp2):
    run = tmp_path / "dcp_only"
    shutil.copytree(straight_fsdp2, run, symlinks=True)
    step = run / "checkpoints/000006"
    (step / "pretrained_model/model.safetensors").unlink()
    result = run_cli("train", f"--output_dir={tmp_path / 'finetune'}", f"--policy.path={step}", *SMALL_DATA,
                     "--steps=1")
    assert result.returncode != 0
    assert f"lerobot convert-dcp --checkpoint_dir={step}" in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    converted = run_cli("convert-dcp", f"--checkpoint_dir={step}")
    assert converted.returncode == 0, converted.stderr
    again = run_cli("train", f"--output_dir={tmp_path / 'finetune2'}", f"--policy.path={step}", *SMALL_DATA,
                    "--steps=1", "--batch_size=4")
    assert again.returncode == 0, again.stderr[-2000:]


def test_async_checkpoints_publish_in_order_and_resume_exactly(tmp_path, straight_fsdp2):
    """Shards written in the background while training goes on: the step-4 checkpoint is
    written during steps 5-6, yet resuming from it reproduces the straight run bitwise."""
    out = tmp_path / "background"
    flags = [*COMMON, "--parallelism.dp_shard=2", "--checkpoint_format=dcp", "--async_checkpoint=true"]
    result = torchrun_train(2, f"--output_dir={out}", *flags, "--steps=6", "--save_freq=2", workdir=tmp_path)
    assert "checkpoints every 2 steps and at the end | weights dcp | written in the background" in result.stderr
    assert [m["loss"] for m in read_metrics(out)] == [m["loss"] for m in read_metrics(straight_fsdp2)]
    root = out / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["000002", "000004", "000006", "last"]
    assert (root / "last").resolve().name == "000006"
    assert_same_state(straight_fsdp2 / "checkpoints/000006", root / "000006", tmp_path)

    shutil.rmtree(root / "000006")
    (root / "last").unlink()
    (root / "last").symlink_to("000004")
    config = root / "000004/pretrained_model/train_config.json"
    torchrun_train(2, "--resume=true", f"--config_path={config}", "--steps=6", "--save_freq=2", workdir=tmp_path)
    assert (root / "last").resolve().name == "000006"
    assert_same_state(straight_fsdp2 / "checkpoints/000006", root / "000006", tmp_path)


def test_deferred_shard_writes_stage_a_copy_and_write_later(tmp_path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    from lerobot_kit.core.checkpoint.shard_writes import deferred_shard_writes, save_shards, write_deferred

    state = {"w": torch.zeros(4096)}
    stager = DefaultStager(StagingOptions(
        use_pinned_memory=False, use_shared_memory=False, use_async_staging=False, use_non_blocking_copy=False
    ))
    with deferred_shard_writes(stager) as deferred:
        save_shards(state, tmp_path / "shards")
    assert not (tmp_path / "shards").exists()  # staged only
    state["w"].add_(1.0)  # training changes the live tensor before the write
    write_deferred(deferred.writes, None)
    loaded = {"w": torch.ones(4096)}
    dcp.load(loaded, checkpoint_id=str(tmp_path / "shards"))
    assert torch.equal(loaded["w"], torch.zeros(4096))
    stager.close()
