"""``lerobot train`` on LeRobot v3.0 datasets that used to hang or poison the run.

- A video dataset without ``meta/stats.json``: the training process decodes camera frames
  for the stats, then forks DataLoader workers. They inherited its open decoders and
  deadlocked freeing them, so the run never reached step 1; now it trains.
- A NaN in ``meta/stats.json`` turned every weight into NaN at the first step; now the
  dataset is refused when it is opened, in one line naming the file, the entry and the fix.
"""

from __future__ import annotations

import json

from conftest import TINY_ACT, launch_env, read_metrics, run_cli
from lerobot_dataset_factory import write_lerobot_dataset


def test_a_video_dataset_without_stats_trains_with_workers(tmp_path):
    root = tmp_path / "user" / "video"
    write_lerobot_dataset(root, [20, 20], video=True, stats=False)
    out = tmp_path / "run"
    result = run_cli("train", "--dataset.repo_id=user/video", f"--dataset.root={root}", *TINY_ACT, "--num_workers=2",
                     "--steps=4", "--log_freq=1", "--batch_size=4", f"--output_dir={out}", env=launch_env(tmp_path),
                     timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [row["step"] for row in read_metrics(out)] == [1, 2, 3, 4]
    assert (out / "checkpoints/last/pretrained_model/model.safetensors").is_file()


def test_nan_in_stats_json_is_refused_when_the_dataset_is_opened(tmp_path):
    root = tmp_path / "user" / "nan"
    write_lerobot_dataset(root, [10, 10])
    stats_file = root / "meta/stats.json"
    stats = json.loads(stats_file.read_text())
    stats["action"]["std"][1] = float("nan")
    stats_file.write_text(json.dumps(stats))
    out = tmp_path / "run"
    result = run_cli("train", "--dataset.repo_id=user/nan", f"--dataset.root={root}", *TINY_ACT, "--steps=2",
                     f"--output_dir={out}", env=launch_env(tmp_path), timeout=120)
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stderr.splitlines() == [
        f"error: {stats_file}: action.std[1] is nan, not a finite float32; normalising with it would turn every "
        "weight into NaN. fix: correct it, or remove the 'action' entry from meta/stats.json to have its stats "
        "computed from the data"
    ]
    assert not out.exists()
