"""``core.checkpoint.retention.prune`` on real step folders: what stays, what goes, and in what order."""

from __future__ import annotations

from pathlib import Path

from lerobot_kit.core.checkpoint.retention import prune


def make_run(root: Path, steps: list[int], last: int, extra: tuple[str, ...] = ()) -> Path:
    checkpoints = root / "checkpoints"
    for step in steps:
        (checkpoints / f"{step:06d}" / "pretrained_model").mkdir(parents=True)
        (checkpoints / f"{step:06d}" / "pretrained_model" / "model.safetensors").write_bytes(b"x")
    for name in extra:
        (checkpoints / name).mkdir(parents=True)
    (checkpoints / "last").symlink_to(f"{last:06d}")
    return root


def entries(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "checkpoints").iterdir())


def test_keeps_the_newest_k_and_last(tmp_path):
    run = make_run(tmp_path, [2, 4, 6, 8, 10, 12], last=12)
    removed = prune(run, 12, keep=2)
    assert entries(run) == ["000010", "000012", "last"]
    assert sorted(p.name for p in removed) == ["000002", "000004", "000006", "000008"]


def test_never_deletes_the_folder_last_points_to_even_when_older(tmp_path):
    """A run resumed from step 10 while 20 and 30 exist from an abandoned attempt."""
    run = make_run(tmp_path, [10, 20, 30], last=10)
    prune(run, 10, keep=2)
    assert entries(run) == ["000010", "000030", "last"]
    prune(run, 10, keep=1)
    assert entries(run) == ["000010", "last"]


def test_zero_keeps_every_step_but_clears_dead_temporaries(tmp_path):
    """Temporaries below the published step belong to saves that died; one above may be
    a resumed run's next save; a `.deleting` folder is a deletion a crash interrupted."""
    run = make_run(tmp_path, [2, 4, 6], last=6, extra=("000003.tmp", "000008.tmp", "000001.deleting"))
    assert prune(run, 6, keep=0) == []
    assert entries(run) == ["000002", "000004", "000006", "000008.tmp", "last"]
