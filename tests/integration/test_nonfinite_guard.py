"""A NaN in training, for real: the installed ``lerobot`` on real processes, the NaN put into a
batch or a gradient by the test-only ``LEROBOT_KIT_FAULT`` hooks, or into a dataset file.

- ``stop`` (default): exit 1 with one line before the update; `last` stays at the previous
  checkpoint, which inspect-checkpoint passes; under 2-rank FSDP both ranks say the same.
- A weight made NaN after an update is caught before its checkpoint is written.
- ``skip`` under fp16: NaN losses are skipped and counted, the schedule does not advance on
  them, the scaler's own overflow (a NaN gradient with a finite loss) is no skip.
- A NaN in a LeRobot dataset's actions: one line at load, before any training.
"""

from __future__ import annotations

import math
import os
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from safetensors.torch import load_file

from _dist_util import describe, start_ranks, wait_ranks
from conftest import TINY_ACT, launch_env, read_metrics, run_cli, script
from lerobot_dataset_factory import write_lerobot_dataset

TINY = [*TINY_ACT, "--dataset.num_episodes=2", "--dataset.episode_length=20", "--batch_size=2", "--num_workers=0"]


def train(workdir: Path, *args: str, fault: str) -> subprocess.CompletedProcess[str]:
    return run_cli("train", *TINY, *args, env=launch_env(workdir, {"LEROBOT_KIT_FAULT": fault}), timeout=300)


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("error:")]


def step_folders(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").iterdir() if p.name != "last")


def test_a_nan_loss_stops_before_the_update_and_last_stays_at_the_previous_checkpoint(tmp_path):
    run = tmp_path / "run"
    result = train(tmp_path, "--steps=4", "--save_freq=2", f"--output_dir={run}",
                   fault="point=forward,step=3,action=nan")
    assert result.returncode == 1, result.stderr[-3000:]
    [line] = error_lines(result.stderr)
    assert line.startswith("error: step 3: loss is nan (grad_norm nan); stopped before updating the weights"), line
    assert "Traceback" not in result.stderr and "done:" not in result.stderr
    assert step_folders(run) == ["000002"] and os.readlink(run / "checkpoints/last") == "000002"
    checked = run_cli("inspect-checkpoint", str(run / "checkpoints/last"))
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_non_finite_weight_is_never_saved(tmp_path):
    run = tmp_path / "run"
    result = train(tmp_path, "--steps=4", "--save_freq=2", f"--output_dir={run}",
                   fault="point=optimizer,step=4,action=nan")
    assert result.returncode == 1, result.stderr[-3000:]
    [line] = error_lines(result.stderr)
    assert line.startswith("error: step 4: a weight is not finite after the update; stopped without writing its "
                           "checkpoint"), line
    assert step_folders(run) == ["000002"] and os.readlink(run / "checkpoints/last") == "000002"


def test_skip_under_fp16_counts_nan_losses_and_leaves_the_scalers_overflows_to_it(tmp_path):
    run = tmp_path / "run"
    # Step 2: NaN gradients with a finite loss (what an fp16 overflow looks like); steps 3-4: NaN losses.
    faults = "point=backward,step=2,action=nan;point=forward,step=3,action=nan,count=2"
    result = train(tmp_path, "--steps=6", "--log_freq=1", "--save_freq=6", "--accelerator.mixed_precision=fp16",
                   "--nonfinite=skip", "--scheduler.num_warmup_steps=10", f"--output_dir={run}", fault=faults)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = read_metrics(run)
    assert [m["skipped_steps"] for m in metrics] == [0, 0, 1, 1, 0, 0]
    assert not math.isfinite(metrics[1]["grad_norm"]) and math.isfinite(metrics[1]["loss"])
    assert all(math.isnan(metrics[i]["loss"]) for i in (2, 3))  # every update of those windows was skipped
    # Warm-up lr = (scheduler steps + 1) / 10 * 1e-4: steps 3 and 4 did not advance the schedule.
    assert math.isclose(metrics[-1]["lr"], 5e-5)
    assert "step 3: loss is nan (grad_norm nan); update skipped (--nonfinite=skip)" in result.stderr
    weights = load_file(run / "checkpoints/last/pretrained_model/model.safetensors")
    assert all(bool(t.isfinite().all()) for t in weights.values())


def test_fsdp_ranks_stop_together_with_the_same_line_when_one_rank_sees_a_nan(tmp_path):
    run = tmp_path / "run"
    argv = [script("lerobot"), "train", *TINY, "--parallelism.dp_shard=2", "--steps=3", "--save_freq=1",
            f"--output_dir={run}"]
    ranks = start_ranks(argv, 2, tmp_path, {"LEROBOT_KIT_FAULT": "point=forward,step=2,rank=1,action=nan"})
    codes = wait_ranks(ranks, timeout=300)
    assert codes == [1, 1], describe(ranks)
    lines = [error_lines(r.output()) for r in ranks]
    assert lines[0] == lines[1] and len(lines[0]) == 1, describe(ranks)
    assert lines[0][0].startswith("error: step 2: loss is nan (grad_norm nan); stopped before updating"), lines
    assert not any("Traceback" in r.output() for r in ranks), describe(ranks)
    assert step_folders(run) == ["000001"] and os.readlink(run / "checkpoints/last") == "000001"


def test_a_nan_in_a_lerobot_dataset_is_one_line_at_load(tmp_path):
    root = tmp_path / "user" / "pick"
    write_lerobot_dataset(root, [10, 12])
    path = root / "data/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    actions = table.column("action").combine_chunks()
    rows = actions.flatten().to_numpy().reshape(len(actions), -1).copy()
    rows[10 + 4, 1] = float("nan")  # episode 1, frame 4
    pq.write_table(table.set_column(table.schema.get_field_index("action"), "action",
                                    pa.array(rows.tolist(), type=actions.type)), path)
    out = tmp_path / "run"
    result = run_cli("train", "--dataset.repo_id=user/pick", f"--dataset.root={root}", *TINY_ACT, "--steps=2",
                     f"--output_dir={out}", env=launch_env(tmp_path))
    assert result.returncode == 1, result.stderr[-3000:]
    assert error_lines(result.stderr) == [f"error: {path}: column 'action' episode 1 frame 4 holds nan; training on "
                                          "it would turn every weight into NaN. fix: clean the dataset (replace those "
                                          "values, or drop those frames or episodes and rewrite the file)"]
    assert "Traceback" not in result.stderr and not (out / "checkpoints").exists()
