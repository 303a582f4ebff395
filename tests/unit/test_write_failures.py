"""Refused writes of a checkpoint (``core.checkpoint.write_failures``), file modes
(``core.layout.file_modes``) and old checkpoints that cannot be deleted (``retention``),
on real file systems: tmpfs mounts remounted read-only (tests run as root)."""

from __future__ import annotations

import errno
import logging
import os
import stat
import subprocess
import traceback
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.distributed.checkpoint.api import CheckpointException

from conftest import tmpfs
from lerobot_kit.core.checkpoint import retention
from lerobot_kit.core.checkpoint.write_failures import (
    CheckpointWriteError,
    SaveFailed,
    cleaned_up,
    describe,
    held_until_phase_end,
    save_phase,
)
from lerobot_kit.core.distributed.process_group import DistContext
from lerobot_kit.core.errors import CheckpointError
from lerobot_kit.core.layout.file_modes import match_umask_tree, save_safetensors


@pytest.fixture
def disk(tmp_path):
    with tmpfs(tmp_path / "disk", "size=4m") as mount:
        yield mount


def remount(mount: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(mount)], check=True)


def one_process_state(output_dir: Path) -> SimpleNamespace:
    """What the save phases read of a ``CheckpointState``: the processes and the run's folder."""
    ctx = DistContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), launcher="single", backend=None)
    return SimpleNamespace(ctx=ctx, output_dir=output_dir)


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)])
def test_safetensors_files_get_the_umasks_mode(tmp_path, umask, mode):
    previous = os.umask(umask)
    try:
        path = save_safetensors({"w": torch.ones(2)}, tmp_path / "w.safetensors")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(path.stat().st_mode) == mode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.safetensors"]  # no writer's temporary left


def test_a_folder_written_by_any_writer_gets_the_umasks_mode_before_publishing(tmp_path):
    private = tmp_path / "shards" / "__0_0.distcp"
    private.parent.mkdir()
    os.close(os.open(private, os.O_CREAT | os.O_WRONLY, 0o600))  # as a writer with a private temp file would
    previous = os.umask(0o022)
    try:
        match_umask_tree(tmp_path)
    finally:
        os.umask(previous)
    assert stat.S_IMODE(private.stat().st_mode) == 0o644


def test_a_refused_safetensors_write_names_the_target_and_errno(disk):
    remount(disk, "ro")
    target = disk / "model.safetensors"
    with pytest.raises(OSError) as refused:
        save_safetensors({"w": torch.ones(2)}, target)
    assert refused.value.errno == errno.EROFS and refused.value.filename == str(target)


def test_a_held_write_lets_the_phase_finish_then_stops_it(disk):
    (disk / "run" / "checkpoints").mkdir(parents=True)
    remount(disk, "ro")
    state = one_process_state(disk / "run")
    after = []
    with pytest.raises(SaveFailed) as failed, save_phase(state):
        with held_until_phase_end():
            save_safetensors({"w": torch.ones(2)}, disk / "run" / "model.safetensors")
        after.append("the format's later collectives")
    assert after == ["the format's later collectives"]
    [failure] = failed.value.failures
    assert failure.what == f"{disk / 'run' / 'model.safetensors'}: Read-only file system (errno EROFS)"
    assert not failure.disk_full


def test_outside_a_save_a_held_write_raises_at_once(disk):
    remount(disk, "ro")
    with pytest.raises(OSError), held_until_phase_end():
        save_safetensors({"w": torch.ones(2)}, disk / "model.safetensors")


def test_a_bug_inside_a_phase_is_not_taken_for_a_refused_write(tmp_path):
    with pytest.raises(ValueError, match="a bug"), save_phase(one_process_state(tmp_path)):
        raise ValueError("a bug")


def test_what_counts_as_a_refused_write(tmp_path):
    refused = OSError(errno.EDQUOT, os.strerror(errno.EDQUOT), "/run/checkpoints/000004.tmp/x.distcp")
    dcp_failure = CheckpointException("save failed", {1: (refused, traceback.extract_stack())})  # as DCP wraps it
    wrapped = describe(dcp_failure, 0, tmp_path)
    assert wrapped is not None and wrapped.what == (
        "/run/checkpoints/000004.tmp/x.distcp: Disk quota exceeded (errno EDQUOT)")
    assert "quota" in wrapped.fix
    zip_writer = describe(RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 64 vs 0"), 0,
                          tmp_path)
    assert zip_writer is not None and zip_writer.what.startswith("RuntimeError: [enforce fail at inline_container")
    own_refusal = describe(CheckpointError("x: missing; nothing was published"), 0, tmp_path)
    assert own_refusal is not None and own_refusal.fix == ""
    assert describe(KeyError("a bug"), 0, tmp_path) is None


def test_the_unfinished_folder_is_removed_or_named_when_it_cannot_be(disk):
    run = disk / "run"
    tmp = run / "checkpoints" / "000004.tmp"
    (tmp / "pretrained_model").mkdir(parents=True)
    state = one_process_state(run)
    failure = describe(OSError(errno.EIO, os.strerror(errno.EIO), str(tmp / "pretrained_model" / "x")), 0, disk)
    remount(disk, "ro")
    with pytest.raises(CheckpointWriteError) as stays, cleaned_up(state, 4, needed_total=0):
        raise SaveFailed([failure])
    assert str(stays.value) == (
        f"checkpoint of step 4 not written: {tmp}/pretrained_model/x: Input/output error (errno EIO); the unfinished "
        f"{tmp} could not be removed (Read-only file system) and stays: resume ignores it, and the next checkpoint "
        "removes it; no checkpoint yet; fix what the system reports, then resume")
    remount(disk, "rw")
    with pytest.raises(CheckpointWriteError, match="; 000004.tmp is removed; no checkpoint yet;"):
        with cleaned_up(state, 4, needed_total=0):
            raise SaveFailed([failure])
    assert not tmp.exists()


def test_an_old_checkpoint_that_cannot_be_deleted_is_one_warning_and_stays(tmp_path):
    root = tmp_path / "run" / "checkpoints"
    (root / "000004").mkdir(parents=True)
    (root / "last").symlink_to("000004")
    records = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("lerobot_kit")
    logger.addHandler(handler)
    try:
        with tmpfs(root / "000002", "size=1m"):  # an older step folder that is a mount point: EBUSY
            assert retention.prune(tmp_path / "run", 4, keep=1) == []
    finally:
        logger.removeHandler(handler)
    [record] = records
    assert record.getMessage() == (
        f"warning: the old checkpoint 000002 is not removed ({root / '000002'} -> {root / '000002.deleting'}: "
        "Device or resource busy (errno EBUSY)); it stays on the disk, and the next checkpoint tries again")
    assert retention.prune(tmp_path / "run", 4, keep=1) == [root / "000002"]  # once it can go, it goes
