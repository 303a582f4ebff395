"""Training on a mixture of LeRobot datasets through the console script, on real ranks: exact
resume on the same topology, continuing on another, per-member metrics, the mixture refused
when it changes on resume, ``lerobot plan`` and ``inspect-checkpoint`` on a mixture."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from checkpoint_state import assert_same_state, crashed_copy, losses
from conftest import PARITY_ACT, built_once, pool_train, read_metrics, run_cli
from mixture_datasets import write_member

HIGH = "observation.images.high"


def _write(folder: Path) -> None:
    """Three robots' recordings: cameras under other names, 10 and 15 fps, other tasks."""
    write_member(folder / "a", [14, 10], camera="high", fps=10, tasks=("pick the cube",))
    write_member(folder / "b", [9, 12], camera="front", fps=15, seed=1, tasks=("stack the blocks",))
    write_member(folder / "c", [12], camera="high", fps=10, seed=2, tasks=("open the drawer",))


@pytest.fixture(scope="module")
def mixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A weighted mixture file over the three members (b's camera mapped onto a's)."""
    root = built_once(tmp_path_factory, "trained_mixture_members", _write)
    members = [
        {"repo_id": "lab/a", "root": str(root / "a"), "weight": 1.0},
        {"repo_id": "lab/b", "root": str(root / "b"), "weight": 2.0,
         "rename_map": {"observation.images.front": HIGH}},
        {"repo_id": "lab/c", "root": str(root / "c"), "weight": 1.0},
    ]
    file = root / "mixture.json"
    file.write_text(json.dumps(members))
    return file


def common(mixture: Path) -> list[str]:
    return [*PARITY_ACT, f"--dataset.mixture={mixture}", "--batch_size=6", "--log_freq=1", "--seed=3",
            "--optimizer.eps=1e-3", "--num_workers=0"]


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory, rank_pools, mixture: Path) -> Path:
    """The uninterrupted DDP(2) run: 6 steps, saved at 4 and 6."""

    def build(root: Path) -> None:
        pool_train(rank_pools, 2, f"--output_dir={root / 'run'}", *common(mixture), "--steps=6", "--save_freq=4",
                   workdir=root)

    return built_once(tmp_path_factory, "straight_mixture", build) / "run"


def test_a_mixture_run_resumes_bitwise_exactly(tmp_path: Path, straight: Path, rank_pools) -> None:
    run = crashed_copy(straight, 4, tmp_path / "run")
    config = run / "checkpoints/last/pretrained_model/train_config.json"
    result = pool_train(rank_pools, 2, "--resume=true", f"--config_path={config}", workdir=tmp_path)
    assert "steps 4→6" in result.stderr and "not sample-exact" not in result.stderr
    assert "mixture of 3 members" in result.stderr
    assert losses(run, after=4) == losses(straight, after=4)
    assert_same_state(straight / "checkpoints/000006", run / "checkpoints/000006", tmp_path)


def test_a_mixture_run_continues_on_another_number_of_ranks(tmp_path: Path, straight: Path, rank_pools) -> None:
    """One process with the same global batch: the same samples, so losses as the uninterrupted run's."""
    run = crashed_copy(straight, 4, tmp_path / "run")
    config = run / "checkpoints/last/pretrained_model/train_config.json"
    result = pool_train(rank_pools, 1, "--resume=true", f"--config_path={config}", "--batch_size=12",
                        workdir=tmp_path)
    assert "steps 4→6" in result.stderr
    assert losses(run, after=4) == pytest.approx(losses(straight, after=4), rel=1e-4)


def test_each_row_counts_the_samples_of_every_member(straight: Path) -> None:
    """Per-member keys name the members' repo_ids; the counts of a row add up to the global batch."""
    rows = [row for row in read_metrics(straight) if "loss" in row]
    assert len(rows) == 6
    for row in rows:
        counts = [row[f"member/lab/{name}/samples"] for name in "abc"]
        assert sum(counts) == 12
        for name, count in zip("abc", counts):
            assert (f"member/lab/{name}/loss" in row) == (count > 0)
    drawn = [sum(row[f"member/lab/{name}/samples"] for row in rows) for name in "abc"]
    assert drawn[1] > max(drawn[0], drawn[2])  # b weighs twice as much


def test_a_changed_mixture_is_refused_on_resume_and_a_moved_member_is_not(
    tmp_path: Path, straight: Path, mixture: Path, rank_pools
) -> None:
    run = crashed_copy(straight, 4, tmp_path / "run")
    config = run / "checkpoints/last/pretrained_model/train_config.json"
    members = json.loads(mixture.read_text())
    members[1]["weight"] = 5.0
    changed = tmp_path / "changed.json"
    changed.write_text(json.dumps(members))
    result = run_cli("train", "--resume=true", f"--config_path={config}", f"--dataset.mixture={changed}")
    assert result.returncode == 2, result.stderr
    assert "--dataset.mixture=" in result.stderr and "the dataset cannot change on resume" in result.stderr
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["000004", "last"]
    moved = tmp_path / "moved_b"
    shutil.copytree(members[1]["root"], moved)
    members[1].update(weight=2.0, root=str(moved))
    relocated = tmp_path / "relocated.json"
    relocated.write_text(json.dumps(members))
    result = pool_train(rank_pools, 2, "--resume=true", f"--config_path={config}",
                        f"--dataset.mixture={relocated}", workdir=tmp_path)
    assert losses(run, after=4) == losses(straight, after=4)


def test_inspect_and_plan_show_the_mixture(straight: Path, mixture: Path) -> None:
    result = run_cli("inspect-checkpoint", str(straight / "checkpoints/last"))
    assert result.returncode == 0, result.stderr
    assert "trained on: a mixture of 3 datasets, shares by weights" in result.stdout
    assert "lab/b weight 2 renames observation.images.front -> observation.images.high" in result.stdout
    report = json.loads(run_cli("inspect-checkpoint", "--json", str(straight / "checkpoints/last")).stdout)
    assert [m["repo_id"] for m in report["dataset"]["mixture"]] == ["lab/a", "lab/b", "lab/c"]
    plan = run_cli("plan", "--world_size=2", f"--dataset.mixture={mixture}", *PARITY_ACT, "--json")
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)


def test_a_bad_mixture_through_the_console_is_one_line_and_writes_nothing(tmp_path: Path, mixture: Path) -> None:
    members = json.loads(mixture.read_text())
    members[2]["rename_map"] = {"observation.images.side": HIGH}  # c has no such camera
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(members))
    out = tmp_path / "run"
    result = run_cli("train", f"--dataset.mixture={bad}", f"--output_dir={out}", "--steps=1")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: mixture member lab/c: rename_map renames 'observation.images.side', which the member lacks (it "
        "has ['action', 'next.done', 'observation.images.high', 'observation.state']); fix the key or remove it "
        "from rename_map"
    ]
    assert not out.exists()
