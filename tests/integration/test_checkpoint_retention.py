"""``--keep_last_checkpoints=2`` over six saves of a real one-process run keeps the last two."""

from __future__ import annotations

import subprocess

from conftest import TINY_ACT, launch_env, run_cli, script


def test_keep_last_two_over_six_saves(tmp_path):
    run = tmp_path / "run"
    args = [*TINY_ACT, "--dataset.num_episodes=2", "--dataset.episode_length=20", "--batch_size=4", "--log_freq=2",
            "--steps=12", "--save_freq=2", "--keep_last_checkpoints=2", f"--output_dir={run}"]
    result = subprocess.run([script("lerobot"), "train", *args], capture_output=True, text=True, timeout=600,
                            cwd=tmp_path, env=launch_env(tmp_path))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["000010", "000012", "last"]
    assert (run / "checkpoints/last").resolve().name == "000012"
    for step in ("000010", "last"):
        inspected = run_cli("inspect-checkpoint", str(run / "checkpoints" / step))
        assert inspected.returncode == 0, inspected.stdout + inspected.stderr
