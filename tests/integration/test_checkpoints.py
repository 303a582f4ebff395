"""Sharded checkpoints: exact resume in every format and layout, resharding onto other
topologies, crash safety under kill -9 and a hung rank, one background save at a time,
the layout-version guard. Real gloo processes, watchdogs on.

A resume is checked against the same run left uninterrupted: the run saves mid-way,
and a copy of it "crashed" right after that save (later checkpoints and metrics removed)
is resumed; from then on it must do what the uninterrupted run did. Those runs run in
rank pools (``tests/rank_pool.py``: real ranks, started once); the fault tests start
processes of their own, to kill or stop them.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from _dist_util import describe, start_ranks
from checkpoint_state import assert_same_state, crashed_copy, full_optimizer, losses
from conftest import PARITY_ACT, TINY_ACT, built_once, pool_script, pool_train, run_cli, script, torchrun_train
from inotify_watch import IN_CREATE, IN_MODIFY, IN_MOVED_FROM, IN_OPEN, Watch
from lerobot_kit.core.layout.manifest import read_manifest, saved_files, verify_manifest, write_manifest
from lerobot_kit.core.checkpoint.training_state import load_full_optimizer

PROBE = Path(__file__).resolve().parents[1] / "probes" / "restore_probe.py"
# 40 samples, global batch 16: 2 steps per epoch, so 6 steps cross two epoch boundaries.
SMALL_DATA = ["--dataset.num_episodes=2", "--dataset.episode_length=20"]
COMMON = [*TINY_ACT, *SMALL_DATA, "--batch_size=8", "--log_freq=1", "--seed=5"]
# Deterministic whatever the number of ranks (no dropout, no VAE noise), so that runs on
# different topologies that see the same global batches can be compared loss for loss.
PARITY = [*PARITY_ACT, *SMALL_DATA, "--optimizer.eps=1e-3", "--log_freq=1", "--seed=5"]


@pytest.fixture(scope="module")
def straight_fsdp2(tmp_path_factory, rank_pools) -> Path:
    """The uninterrupted FSDP(2) run the others are held to: 6 steps, saved at 3 and 6, both weight kinds."""

    def build(root: Path) -> None:
        pool_train(rank_pools, 2, f"--output_dir={root / 'run'}", *COMMON, "--parallelism.dp_shard=2", "--steps=6",
                   "--save_freq=3", "--checkpoint_format=safetensors_dcp", workdir=root)

    return built_once(tmp_path_factory, "straight_fsdp2", build) / "run"


def blank_tensor_data(weights: Path) -> None:
    """Zero every byte after a safetensors file's header: the header still checks, the tensors are gone."""
    data = bytearray(weights.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")
    data[start:] = bytes(len(data) - start)
    weights.write_bytes(bytes(data))


def as_format(step_dir: Path, fmt: str) -> None:
    """Make a ``safetensors_dcp`` checkpoint the one format ``fmt`` writes: keep only its weight kind."""
    pretrained = step_dir / "pretrained_model"
    if fmt == "safetensors":
        shutil.rmtree(pretrained / "pytorch_model_fsdp_0")
    elif fmt == "dcp":
        (pretrained / "model.safetensors").unlink()
    info_file = step_dir / "training_state/training_step.json"
    info = json.loads(info_file.read_text())
    info.update(checkpoint_format=fmt, weights={"safetensors": "gathered", "dcp": "dcp"}.get(fmt, "gathered+dcp"))
    info_file.write_text(json.dumps(info))
    write_manifest(step_dir)  # as that format's save records it


@pytest.mark.parametrize("fmt", ["safetensors", "dcp", "safetensors_dcp"])
def test_fsdp_resume_is_bitwise_exact_in_every_format(tmp_path, straight_fsdp2, rank_pools, fmt):
    """The straight run's step-3 checkpoint, holding only what ``fmt`` stores, resumed with
    ``fmt`` (so the resumed run's step-6 save is written in it) ends bitwise where it did."""
    out = crashed_copy(straight_fsdp2, 3, tmp_path / "split")
    as_format(out / "checkpoints/000003", fmt)
    inspected = run_cli("inspect-checkpoint", str(out / "checkpoints/000003"))
    assert inspected.returncode == 0, inspected.stdout + inspected.stderr
    pretrained = out / "checkpoints/000003/pretrained_model"
    gathered = pretrained / "model.safetensors"
    config = pretrained / "train_config.json"
    if fmt == "safetensors_dcp":  # the gathered tensors zeroed: were they read beside the shards, the end would differ
        blank_tensor_data(gathered)
    with Watch() as watch:  # every open of the gathered file, by any process
        if gathered.is_file():
            watch.add(gathered, IN_OPEN)
        pool_train(rank_pools, 2, "--resume=true", f"--config_path={config}", f"--checkpoint_format={fmt}",
                   workdir=tmp_path)
        opens = sum(1 for event in watch.events() if event.mask & IN_OPEN)
    # Gathered weights only: read once (by the main process) and broadcast to the shards.
    # With shards present, each rank reads its own shards; of the gathered file only the
    # header is read, by the check of every file before the resume (identical unread opens
    # of one file queue as one inotify event, so the count says whether it was opened).
    assert opens == {"safetensors": 1, "dcp": 0, "safetensors_dcp": 1}[fmt]
    final = out / "checkpoints/000006"
    assert (final / "pretrained_model/model.safetensors").is_file() == (fmt != "dcp")
    assert (final / "pretrained_model/pytorch_model_fsdp_0").is_dir() == (fmt != "safetensors")
    assert (final / "training_state/optimizer_0").is_dir()
    assert not (final / "training_state/optimizer_state.safetensors").exists()
    assert losses(out, after=3) == losses(straight_fsdp2, after=3)
    assert_same_state(straight_fsdp2 / "checkpoints/000006", final, tmp_path)
    info = json.loads((final / "training_state/training_step.json").read_text())
    assert info["checkpoint_format"] == fmt and info["sampler"]["epoch"] >= 2
    inspected = run_cli("inspect-checkpoint", str(final))
    assert inspected.returncode == 0, inspected.stdout + inspected.stderr


def test_gathered_weights_load_with_plain_safetensors_and_shards_with_torch_readers(tmp_path, straight_fsdp2):
    from lerobot_kit.core.checkpoint.pretrained import load_pretrained

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


SOURCES = {  # name: (processes, flags); the global batch is 16 in each
    "fsdp2": (2, ["--parallelism.dp_shard=2", "--batch_size=8"]),
    "hsdp2x2": (4, ["--parallelism.dp_replicate=2", "--parallelism.dp_shard=2", "--batch_size=4"]),
    "ddp2": (2, ["--batch_size=8"]),
}


@pytest.fixture(scope="module")
def sources(tmp_path_factory, rank_pools) -> dict[str, Path]:
    """Uninterrupted 6-step runs that saved at step 4 (and 6)."""

    def build(root: Path) -> None:
        for name, (nproc, flags) in SOURCES.items():
            pool_train(rank_pools, nproc, f"--output_dir={root / name}", *PARITY, *flags, "--steps=6",
                       "--save_freq=4", "--checkpoint_format=safetensors_dcp", workdir=root)

    root = built_once(tmp_path_factory, "sources", build)
    return {name: root / name for name in SOURCES}


@pytest.mark.parametrize("source", ["ddp2", "hsdp2x2"])
def test_same_topology_resume_is_bitwise_exact(tmp_path, sources, rank_pools, source):
    """FSDP's same-topology resume is checked in every format above; DDP and HSDP here."""
    run = crashed_copy(sources[source], 4, tmp_path / "run")
    config = run / "checkpoints/last/pretrained_model/train_config.json"
    result = pool_train(rank_pools, SOURCES[source][0], "--resume=true", f"--config_path={config}", workdir=tmp_path)
    assert "steps 4→6" in result.stderr and "not sample-exact" not in result.stderr
    assert losses(run, after=4) == losses(sources[source], after=4)
    assert_same_state(sources[source] / "checkpoints/000006", run / "checkpoints/000006", tmp_path)


UNSET = ["--parallelism.dp_replicate=null", "--parallelism.dp_shard=null"]


@pytest.mark.parametrize(
    ("source", "nproc", "flags", "sample_exact"),
    [
        ("fsdp2", 4, ["--parallelism.dp_replicate=null", "--parallelism.dp_shard=4", "--batch_size=4"], False),
        ("fsdp2", 1, [*UNSET, "--batch_size=16"], False),
        ("hsdp2x2", 2, ["--parallelism.dp_replicate=null", "--parallelism.dp_shard=2", "--batch_size=8"], False),
        ("ddp2", 2, ["--parallelism.dp_shard=2"], True),
        ("fsdp2", 2, UNSET, True),
    ],
    ids=["fsdp2-to-fsdp4", "fsdp2-to-one-process", "hsdp2x2-to-fsdp2", "ddp2-to-fsdp2", "fsdp2-to-ddp2"],
)
def test_resume_reshards_onto_another_topology(tmp_path, sources, rank_pools, source, nproc, flags, sample_exact):
    """The state restored on the new topology is bit for bit the saved one, and training
    goes on as the uninterrupted run did: each case keeps the global batch of 16, so the
    data order is the same, and only the order of float reductions differs."""
    run = crashed_copy(sources[source], 4, tmp_path / "run")
    config = run / "checkpoints/last/pretrained_model/train_config.json"
    dump = tmp_path / "restored"
    result = pool_script(rank_pools, nproc, PROBE, str(dump), "--resume=true", f"--config_path={config}", *flags,
                         "--steps=6", "--save_freq=6", workdir=tmp_path)
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
    assert info["sampler"]["samples_seen"] == 6 * 16
    after = losses(run, after=4)
    assert len(after) == 2 and after == pytest.approx(losses(sources[source], after=4), rel=1e-4)
    # Another dp_world_size or batch size: the run says once that it is not sample-exact.
    assert result.stderr.count("not sample-exact") == (0 if sample_exact else 1)


TIMEOUT_S = 15  # the runs' collective timeout in the fault tests


def _stop_rank_1_mid_save(ranks: list, checkpoints: Path, step: int) -> None:
    """Stop (SIGSTOP) rank 1 the moment the main process starts saving ``step``.

    The main process creates ``NNNNNN.tmp`` before the save's first barrier, and cannot
    publish it without rank 1 (every later part of the save is collective). With rank 1
    stopped, the save is held half-done for as long as the test needs, not raced.
    """
    deadline = time.monotonic() + 120
    while not (checkpoints / "000002").is_dir():  # the folder to watch exists once step 2 is saved
        assert time.monotonic() < deadline, f"step 2 was never saved:\n{describe(ranks)}"
        assert all(r.proc.poll() is None for r in ranks), f"a rank died early:\n{describe(ranks)}"
        time.sleep(0.05)
    with Watch() as watch:
        watch.add(checkpoints, IN_CREATE)
        target = checkpoints / f"{step:06d}.tmp"
        while not target.exists() and not any(e.path == target for e in watch.events(wait=0.5)):
            assert time.monotonic() < deadline, f"the save of step {step} never started:\n{describe(ranks)}"
            assert all(r.proc.poll() is None for r in ranks), f"a rank died early:\n{describe(ranks)}"
        ranks[1].proc.send_signal(signal.SIGSTOP)
    assert not (checkpoints / f"{step:06d}").exists(), "the save finished before rank 1 was stopped"


@pytest.mark.parametrize(
    ("fault", "background"), [("kill-9", False), ("kill-9", True), ("hung", False)],
    ids=["kill-9-sync", "kill-9-async", "hung-rank-sync"],
)
def test_a_fault_during_a_save_leaves_the_last_checkpoint_resumable(tmp_path, straight_fsdp2, rank_pools, fault,
                                                                    background):
    """kill -9 of the main process mid-save, or a rank that hangs mid-save (stopped, not
    killed): every rank exits non-zero within the collective timeout and ``last`` still
    names the previous, valid checkpoint. After the async kill (a background write cut
    short, the previous checkpoint itself written in the background) the run resumes over
    the stale ``.tmp`` to the uninterrupted run's state."""
    out = tmp_path / "faulty"
    train = [script("lerobot"), "train", f"--output_dir={out}", *COMMON, "--parallelism.dp_shard=2", "--steps=6",
             "--save_freq=2", "--checkpoint_format=safetensors_dcp", f"--parallelism.timeout_s={TIMEOUT_S}",
             f"--async_checkpoint={str(background).lower()}"]
    ranks = start_ranks(train, 2, tmp_path)
    try:
        _stop_rank_1_mid_save(ranks, out / "checkpoints", 4)
        faulted_at = time.monotonic()
        if fault == "kill-9":
            ranks[0].proc.send_signal(signal.SIGKILL)  # the rank that publishes
        # Hung: rank 0 waits in the save's collective until the timeout, then gives up.
        ranks[0].proc.wait(timeout=TIMEOUT_S + 30)
        main_gave_up_after = time.monotonic() - faulted_at
        ranks[1].proc.send_signal(signal.SIGCONT)  # the stopped rank wakes up to a dead peer
        resumed_at = time.monotonic()
        ranks[1].proc.wait(timeout=TIMEOUT_S + 30)
        survivor_gave_up_after = time.monotonic() - resumed_at
    finally:
        for r in ranks:
            if r.proc.poll() is None:
                r.proc.kill()
                r.proc.wait()
    assert ranks[0].proc.returncode != 0 and ranks[1].proc.returncode != 0, describe(ranks)
    if fault == "hung":
        assert TIMEOUT_S - 1 <= main_gave_up_after <= TIMEOUT_S + 30, describe(ranks)
    assert survivor_gave_up_after <= TIMEOUT_S + 30
    root = out / "checkpoints"
    assert (root / "last").resolve().name == "000002"
    assert not (root / "000004").exists()
    inspected = run_cli("inspect-checkpoint", str(root / "last"))
    assert inspected.returncode == 0, inspected.stdout + inspected.stderr
    if not background:
        return  # the resume of a half-done save is checked once, after the async kill below
    config = root / "last/pretrained_model/train_config.json"
    pool_train(rank_pools, 2, "--resume=true", f"--config_path={config}", "--steps=6", "--save_freq=2",
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
    (run / "checkpoints/000006/checksums.json").unlink()  # nor a checksum manifest
    config = run / "checkpoints/last/pretrained_model/train_config.json"
    result = torchrun_train(2, "--resume=true", f"--config_path={config}", "--steps=8", workdir=tmp_path,
                            check=False)
    assert result.returncode == 1, result.stderr[-2000:]  # torchrun's code for a failed rank
    assert "older gathered-optimizer layout" in result.stderr and "--policy.path" in result.stderr
    assert "lerobot_kit" not in result.stderr.split("Traceback", 1)[-1]


def test_unknown_layout_version_is_refused(tmp_path, straight_fsdp2):
    run = tmp_path / "future"
    shutil.copytree(straight_fsdp2, run, symlinks=True)
    info_file = run / "checkpoints/000006/training_state/training_step.json"
    info = json.loads(info_file.read_text())
    info["layout_version"] = 99
    info_file.write_text(json.dumps(info))
    write_manifest(info_file.parents[1])
    config = run / "checkpoints/last/pretrained_model/train_config.json"
    result = run_cli("train", "--resume=true", f"--config_path={config}", "--steps=8", "--parallelism.dp_shard=null")
    assert result.returncode == 1, result.stderr
    assert "layout version 99" in result.stderr and "Traceback" not in result.stderr


def test_dcp_only_checkpoint_needs_conversion_before_policy_path(tmp_path, straight_fsdp2):
    run = tmp_path / "dcp_only"
    shutil.copytree(straight_fsdp2, run, symlinks=True)
    step = run / "checkpoints/000006"
    (step / "pretrained_model/model.safetensors").unlink()
    result = run_cli("train", f"--output_dir={tmp_path / 'finetune'}", f"--policy.path={step}", *SMALL_DATA,
                     "--steps=1")
    assert result.returncode == 1, result.stderr
    assert f"lerobot convert-dcp --checkpoint_dir={step}" in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    converted = run_cli("convert-dcp", f"--checkpoint_dir={step}")
    assert converted.returncode == 0, converted.stderr
    again = run_cli("train", f"--output_dir={tmp_path / 'finetune2'}", f"--policy.path={step}", *SMALL_DATA,
                    "--steps=1", "--batch_size=4")
    assert again.returncode == 0, again.stderr[-2000:]


def test_async_checkpoints_publish_in_order_one_at_a_time(tmp_path, straight_fsdp2, rank_pools):
    """The straight run resumed from step 3 with DCP shards written in the background and a
    save after every step, watched by the kernel: each ``NNNNNN.tmp`` folder appears (a save
    starts), training logs steps while it is unpublished (the save returned at once), and
    it is renamed (published) before the next one appears. The result is bitwise the
    straight run's."""
    run = crashed_copy(straight_fsdp2, 3, tmp_path / "background")
    config = run / "checkpoints/last/pretrained_model/train_config.json"
    with Watch() as watch:
        watch.add(run / "checkpoints", IN_CREATE | IN_MOVED_FROM)
        watch.add(run / "logs" / "metrics.jsonl", IN_MODIFY)
        result = pool_train(rank_pools, 2, "--resume=true", f"--config_path={config}", "--checkpoint_format=dcp",
                            "--async_checkpoint=true", "--save_freq=1", workdir=tmp_path)
        events = watch.events()
    assert "checkpoints every 1 steps and at the end | weights dcp | written in the background" in result.stderr
    in_flight: list[str] = []
    published: list[str] = []
    steps_while_in_flight = 0
    for event in events:
        name = event.path.name
        if event.mask & IN_MODIFY:
            steps_while_in_flight += bool(in_flight)
        elif re.fullmatch(r"\d{6}\.tmp", name) and event.mask & IN_CREATE:
            assert not in_flight, f"{name} started while {in_flight} was still being written"
            in_flight.append(name)
        elif re.fullmatch(r"\d{6}\.tmp", name) and event.mask & IN_MOVED_FROM:
            assert in_flight == [name]
            published.append(in_flight.pop().removesuffix(".tmp"))
    assert published == ["000004", "000005", "000006"] and not in_flight
    assert steps_while_in_flight >= 2  # steps 5 and 6 ran while the previous save was unpublished
    assert (run / "checkpoints/last").resolve().name == "000006"
    assert losses(run, after=3) == losses(straight_fsdp2, after=3)
    assert_same_state(straight_fsdp2 / "checkpoints/000006", run / "checkpoints/000006", tmp_path)
    for step in published:  # written in the background by both ranks: every file is in the manifest and matches
        step_dir = run / "checkpoints" / step
        assert sorted(read_manifest(step_dir)) == saved_files(step_dir)
        assert verify_manifest(step_dir) == []
