"""Every layout trains from the CLI with real gloo processes, and agrees with one process.

The runs compared with each other run in rank pools (``tests/rank_pool.py``: real rank
processes in a real gloo group, started once, each run through the CLI's entry point);
the launchers (torchrun across two nodes, accelerate launch) start real processes. Every
wait has a watchdog, so a hang fails the test instead of blocking CI.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from _dist_util import free_port
from checkpoint_state import assert_same_state, crashed_copy, losses
from conftest import PARITY_ACT, TINY_ACT, built_once, launch_env, pool_train, run_cli, script, torchrun_train

STEPS = 4
GLOBAL_BATCH = 8
# A larger Adam eps keeps float-rounding noise in near-zero gradients from being blown up
# to full-size updates, so final weights are comparable across layouts, not just losses.
PARITY_OPTIM = ["--optimizer.eps=1e-3"]
LAYOUTS = {  # name: (processes, flags)
    "single": (1, []),
    "ddp2": (2, []),
    "fsdp2": (2, ["--parallelism.dp_shard=2"]),
    "fsdp4": (4, ["--parallelism.dp_shard=4"]),
    "hsdp2x2": (4, ["--parallelism.dp_replicate=2", "--parallelism.dp_shard=2"]),
}


@pytest.fixture(scope="module")
def layout_runs(tmp_path_factory, rank_pools) -> dict[str, Path]:
    """The same global batch of 8 per step in every layout."""

    def build(root: Path) -> None:
        for name, (nproc, flags) in LAYOUTS.items():
            result = pool_train(rank_pools, nproc, f"--output_dir={root / name}", *PARITY_ACT, *PARITY_OPTIM, *flags,
                                f"--steps={STEPS}", "--log_freq=1", f"--batch_size={GLOBAL_BATCH // nproc}",
                                f"--save_freq={STEPS}", "--checkpoint_format=safetensors_dcp", workdir=root)
            (root / f"{name}.stderr").write_text(result.stderr)

    root = built_once(tmp_path_factory, "layouts", build)
    return {name: root / name for name in LAYOUTS}


def test_every_layout_gives_the_one_process_losses(layout_runs):
    reference = losses(layout_runs["single"])
    assert len(reference) == STEPS
    for name, out in layout_runs.items():
        assert losses(out) == pytest.approx(reference, rel=1e-4), name


def test_resolved_topology_is_recorded_and_declared_degrees_kept(layout_runs):
    expected = {"single": (1, 1, "single"), "ddp2": (2, 1, "ddp"), "fsdp2": (1, 2, "fsdp"),
                "fsdp4": (1, 4, "fsdp"), "hsdp2x2": (2, 2, "hsdp")}
    for name, out in layout_runs.items():
        step = out / "checkpoints" / "last"
        info = json.loads((step / "training_state" / "training_step.json").read_text())
        topology = info["topology"]
        assert (topology["dp_replicate"], topology["dp_shard"], topology["layout"]) == expected[name]
        assert info["dp_world_size"] * info["batch_size"] == GLOBAL_BATCH
        declared = json.loads((step / "pretrained_model" / "train_config.json").read_text())["parallelism"]
        flags = dict(f.removeprefix("--parallelism.").split("=") for f in LAYOUTS[name][1])
        assert declared["dp_replicate"] == (int(flags["dp_replicate"]) if "dp_replicate" in flags else None)
        assert declared["dp_shard"] == (int(flags["dp_shard"]) if "dp_shard" in flags else None)


def test_sharded_runs_hold_one_shard_per_rank(layout_runs):
    """The DCP chunks are the shards the ranks held: every weight split in dp_shard row blocks,
    and under FSDP(N) each rank's file holds 1/N of the parameters."""
    import torch.distributed.checkpoint as dcp

    full = sum(t.numel() for t in
               load_file(layout_runs["single"] / "checkpoints/last/pretrained_model/model.safetensors").values())
    for name, shards in (("fsdp2", 2), ("fsdp4", 4), ("hsdp2x2", 2)):
        folder = layout_runs[name] / "checkpoints/last/pretrained_model/pytorch_model_fsdp_0"
        metadata = dcp.FileSystemReader(str(folder)).read_metadata()
        per_file: dict[str, int] = {}
        for fqn, entry in metadata.state_dict_metadata.items():
            filled = [c for c in entry.chunks if c.sizes.numel() > 0]
            rows = -(-entry.size[0] // shards)  # FSDP2 pads dim 0 to equal row blocks
            assert len(filled) == -(-entry.size[0] // rows), (name, fqn)
            for chunk in entry.chunks:
                key = next(k for k in metadata.storage_data if k.fqn == fqn and list(k.offset) == list(chunk.offsets))
                file = metadata.storage_data[key].relative_path
                per_file[file] = per_file.get(file, 0) + chunk.sizes.numel()
        assert sum(per_file.values()) == full, name
        if name.startswith("fsdp"):
            assert len(per_file) == shards
            for count in per_file.values():
                assert abs(count - full / shards) <= 0.1 * full / shards, (name, per_file, full)


def test_gathered_weights_agree_across_layouts(layout_runs):
    reference = load_file(layout_runs["single"] / "checkpoints/last/pretrained_model/model.safetensors")
    for name, out in layout_runs.items():
        weights = load_file(out / "checkpoints/last/pretrained_model/model.safetensors")
        assert weights.keys() == reference.keys()
        for key, value in weights.items():
            assert torch.allclose(value, reference[key], rtol=1e-4, atol=1e-5), (name, key)


def test_banner_states_the_effective_batch_and_layout(layout_runs):
    log = (layout_runs["hsdp2x2"].parent / "hsdp2x2.stderr").read_text()
    assert "layout hsdp | world 4 (dp_replicate 2 × dp_shard 2)" in log
    assert "effective batch 8 = batch_size 2 × dp_world_size 4 × gradient_accumulation 1" in log
    assert "wrap units: 3 from policy (ACTDecoderLayer, ACTEncoderLayer)" in log  # 2 encoder layers, 1 decoder
    assert f"checkpoints every {STEPS} steps and at the end | weights safetensors_dcp | synchronous" in log
    assert log.count("effective batch") == 1, "only the main process prints"


def test_gradient_accumulation_equals_a_bigger_batch_and_resumes_exactly(tmp_path, rank_pools):
    """FSDP(2): batch 4 × accumulation 1 and batch 2 × accumulation 2 make the same updates;
    the accumulating run, resumed from a checkpoint between two updates, is bitwise itself."""
    common = [*PARITY_ACT, *PARITY_OPTIM, "--parallelism.dp_shard=2", "--log_freq=1"]
    big, accumulated = tmp_path / "big", tmp_path / "acc"
    pool_train(rank_pools, 2, f"--output_dir={big}", *common, "--batch_size=4", "--steps=3", "--save_freq=3",
               workdir=tmp_path)
    result = pool_train(rank_pools, 2, f"--output_dir={accumulated}", *common, "--batch_size=2", "--steps=6",
                        "--accelerator.gradient_accumulation.steps=2", "--save_freq=2", workdir=tmp_path)
    assert "effective batch 8 = batch_size 2 × dp_world_size 2 × gradient_accumulation 2" in result.stderr
    a = load_file(big / "checkpoints/last/pretrained_model/model.safetensors")
    b = load_file(accumulated / "checkpoints/last/pretrained_model/model.safetensors")
    for key in a:
        assert torch.allclose(a[key], b[key], rtol=1e-4, atol=1e-6), key
    micro = losses(accumulated)
    pairs = [(micro[i] + micro[i + 1]) / 2 for i in range(0, 6, 2)]
    assert pairs == pytest.approx(losses(big), rel=1e-4)

    resumed = crashed_copy(accumulated, 4, tmp_path / "resumed")
    config = resumed / "checkpoints/last/pretrained_model/train_config.json"
    pool_train(rank_pools, 2, "--resume=true", f"--config_path={config}", workdir=tmp_path)
    assert losses(resumed, after=4) == losses(accumulated, after=4)
    assert_same_state(accumulated / "checkpoints/000006", resumed / "checkpoints/000006", tmp_path)


PRECISIONS = [("bf16", "ddp2"), ("bf16", "fsdp2"), ("fp16", "ddp2"), ("fp16", "fsdp2")]


@pytest.fixture(scope="module")
def precision_runs(tmp_path_factory, rank_pools) -> dict[tuple[str, str], Path]:
    """The ddp2 and fsdp2 layout runs again under bf16 and fp16, saving half-way too."""

    def build(root: Path) -> None:
        for precision, layout in PRECISIONS:
            nproc, flags = LAYOUTS[layout]
            pool_train(rank_pools, nproc, f"--output_dir={root / f'{precision}_{layout}'}", *PARITY_ACT,
                       *PARITY_OPTIM, *flags, f"--steps={STEPS}", "--log_freq=1",
                       f"--batch_size={GLOBAL_BATCH // nproc}", f"--save_freq={STEPS // 2}",
                       f"--accelerator.mixed_precision={precision}", workdir=root)

    root = built_once(tmp_path_factory, "precision", build)
    return {(precision, layout): root / f"{precision}_{layout}" for precision, layout in PRECISIONS}


@pytest.mark.parametrize(("precision", "layout"), PRECISIONS)
def test_mixed_precision_computes_in_low_precision_and_tracks_fp32(layout_runs, precision_runs, precision, layout):
    """Same weights, data and seed as the fp32 layout run: every loss differs from it (the
    compute really ran in bf16/fp16) yet stays within low-precision rounding of it."""
    low, full = losses(precision_runs[(precision, layout)]), losses(layout_runs[layout])
    assert len(low) == len(full) == STEPS
    assert all(a != b for a, b in zip(low, full)), (low, full)
    assert low == pytest.approx(full, rel=5e-2)
    scaler = precision_runs[(precision, layout)] / "checkpoints/last/training_state/scaler_state.json"
    assert scaler.is_file() == (precision == "fp16")


def test_fp16_resume_restores_the_loss_scaler(precision_runs, tmp_path, rank_pools):
    """The scaler's state at the half-way checkpoint is not a fresh scaler's, and the run
    resumed from there ends with the straight run's scaler, weights and optimizer, bitwise."""
    straight = precision_runs[("fp16", "fsdp2")]
    run = crashed_copy(straight, STEPS // 2, tmp_path / "run")
    saved = json.loads((run / f"checkpoints/{STEPS // 2:06d}/training_state/scaler_state.json").read_text())
    assert (saved["scale"], saved["growth_tracker"]) != (2.0**16, 0), saved  # what a fresh scaler starts from
    config = run / "checkpoints/last/pretrained_model/train_config.json"
    pool_train(rank_pools, 2, "--resume=true", f"--config_path={config}", workdir=tmp_path)
    final = f"checkpoints/{STEPS:06d}"
    assert (json.loads((run / final / "training_state/scaler_state.json").read_text())
            == json.loads((straight / final / "training_state/scaler_state.json").read_text()))
    assert losses(run, after=STEPS // 2) == losses(straight, after=STEPS // 2)
    assert_same_state(straight / final, run / final, tmp_path)


def test_accelerate_launch_starts_a_two_process_run(tmp_path):
    out = tmp_path / "acc"
    command = [script("accelerate"), "launch", "--multi_gpu", "--num_processes=2", "--num_machines=1",
               f"--main_process_port={free_port()}", "--mixed_precision=no", "--dynamo_backend=no", script("lerobot"),
               "train", f"--output_dir={out}",
               *TINY_ACT, "--parallelism.dp_shard=2", "--steps=2", "--save_freq=2"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=tmp_path,
                            env=launch_env(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "launcher accelerate" in result.stderr and "world 2" in result.stderr
    assert (out / "checkpoints/last/training_state/training_step.json").is_file()


def _two_nodes(commands: list[list[str]], workdir: Path) -> list[subprocess.CompletedProcess[str]]:
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=workdir,
                              env=launch_env(workdir)) for c in commands]
    results = []
    for proc in procs:
        try:
            stdout, stderr = proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            raise
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    return results


def test_two_torchrun_nodes_on_loopback_train_one_fsdp_job(tmp_path):
    port, out = free_port(), tmp_path / "multinode"
    train = ["train", f"--output_dir={out}", *TINY_ACT, "--parallelism.dp_shard=2", "--steps=2", "--save_freq=2"]
    # Node 0 starts the console script, node 1 the module (torchrun -m): the same command.
    programs = [[script("lerobot")], ["-m", "lerobot_kit.cli"]]
    commands = [[script("torchrun"), "--nnodes=2", f"--node-rank={rank}", "--nproc-per-node=1",
                 "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=lerobot-test",
                 *programs[rank], *train] for rank in (0, 1)]
    results = _two_nodes(commands, tmp_path)
    assert all(r.returncode == 0 for r in results), [r.stderr[-2000:] for r in results]
    log = results[0].stderr + results[1].stderr
    assert "layout fsdp | world 2" in log
    info = json.loads((out / "checkpoints/last/training_state/training_step.json").read_text())
    assert info["topology"]["world_size"] == 2


def test_two_accelerate_machines_on_loopback_train_one_fsdp_job(tmp_path):
    port, out = free_port(), tmp_path / "multinode"
    commands = [[script("accelerate"), "launch", "--multi_gpu", "--num_machines=2", f"--machine_rank={rank}",
                 "--num_processes=2", "--main_process_ip=127.0.0.1", f"--main_process_port={port}",
                 "--mixed_precision=no", "--dynamo_backend=no", script("lerobot"), "train", f"--output_dir={out}",
                 *TINY_ACT, "--parallelism.dp_shard=2", "--steps=2", "--save_freq=2"] for rank in (0, 1)]
    results = _two_nodes(commands, tmp_path)
    assert all(r.returncode == 0 for r in results), [r.stderr[-2000:] for r in results]
    assert "layout fsdp | world 2" in results[0].stderr + results[1].stderr


def test_degrees_that_do_not_multiply_to_the_world_are_refused(tmp_path):
    result = torchrun_train(2, f"--output_dir={tmp_path / 'x'}", *TINY_ACT, "--parallelism.dp_replicate=2",
                            "--parallelism.dp_shard=2", "--steps=1", workdir=tmp_path, check=False)
    assert result.returncode == 1, result.stderr[-2000:]  # torchrun's code for a failed rank
    assert "error: --parallelism.dp_replicate=2 × --parallelism.dp_shard=2 = 4" in result.stderr
    assert "world size of 2" in result.stderr
    # torchrun's agent prints its own ChildFailedError traceback; none comes from our code.
    assert "lerobot_kit" not in result.stderr.split("Traceback", 1)[-1]


def test_accelerate_engine_variables_are_refused(tmp_path):
    result = run_cli("train", f"--output_dir={tmp_path / 'x'}", *TINY_ACT, "--steps=1",
                     env={"ACCELERATE_USE_FSDP": "true", "FSDP_SHARDING_STRATEGY": "FULL_SHARD"})
    assert result.returncode == 2
    assert "ACCELERATE_USE_FSDP" in result.stderr and "--parallelism.dp_shard" in result.stderr
    assert "Traceback" not in result.stderr


def test_fsdp_with_ignored_modules_keeps_them_whole_and_trains_them(tmp_path, rank_pools):
    """The DCP checkpoint records how each parameter was held: an ignored module's weights
    as one whole tensor (never sharded), an FSDP unit's as one row block per rank."""
    import torch.distributed.checkpoint as dcp

    out = tmp_path / "ignored"
    pool_train(rank_pools, 2, f"--output_dir={out}", *TINY_ACT, "--parallelism.dp_shard=2",
               "--accelerator.fsdp.ignored_modules=vae_encoder.*", "--checkpoint_format=safetensors_dcp",
               "--steps=2", "--save_freq=1", workdir=tmp_path)
    folder = out / "checkpoints/000002/pretrained_model/pytorch_model_fsdp_0"
    metadata = dcp.FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    ignored = [fqn for fqn in metadata if fqn.startswith("vae_encoder.")]
    assert ignored and any(fqn.startswith("encoder.") for fqn in metadata)
    for fqn, entry in metadata.items():
        filled = [c for c in entry.chunks if c.sizes.numel() > 0]
        if fqn in ignored:
            assert [(list(c.offsets), c.sizes) for c in filled] == [([0] * len(entry.size), entry.size)], fqn
        elif fqn.startswith("encoder.") and entry.size[0] > 1:
            assert len(filled) == 2, fqn
    before = load_file(out / "checkpoints/000001/pretrained_model/model.safetensors")
    after = load_file(out / "checkpoints/000002/pretrained_model/model.safetensors")
    assert all(not torch.equal(before[fqn], after[fqn]) for fqn in ignored if fqn.endswith(".weight"))
