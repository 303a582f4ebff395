"""Training ACT from a LeRobot v3.0 dataset folder through the CLI (state + action + image)."""

from __future__ import annotations

from conftest import TINY_ACT, launch_env, read_metrics, run_cli
from lerobot_dataset_factory import write_lerobot_dataset


def test_act_learns_from_a_lerobot_dataset_folder(tmp_path):
    root = tmp_path / "user" / "pick"
    write_lerobot_dataset(root, [30, 25, 35, 30], image=True, image_size=16)
    out = tmp_path / "run"
    result = run_cli("train", "--dataset.repo_id=user/pick", f"--dataset.root={root}", "--policy.type=act",
                     *TINY_ACT, "--steps=120", "--log_freq=20", "--save_freq=120", "--batch_size=8",
                     "--optimizer.lr=1e-3", f"--output_dir={out}", env=launch_env(tmp_path), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "dataset lerobot (120 samples)" in result.stderr
    losses = [m["loss"] for m in read_metrics(out)]
    assert losses[-1] < 0.5 * losses[0], losses
    config = (out / "checkpoints/last/pretrained_model/config.json").read_text()
    assert '"type": "act"' in config or '"type":"act"' in config


def test_malformed_info_json_is_one_clear_line(tmp_path):
    root = tmp_path / "user" / "bad"
    write_lerobot_dataset(root, [10, 10])
    (root / "meta" / "info.json").write_text("{not json")
    result = run_cli("train", "--dataset.repo_id=user/bad", f"--dataset.root={root}", *TINY_ACT, "--steps=1",
                     f"--output_dir={tmp_path / 'out'}")
    assert result.returncode == 1, result.stderr
    assert "info.json" in result.stderr and "Traceback" not in result.stderr
