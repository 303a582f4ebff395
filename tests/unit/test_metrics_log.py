"""``logs/metrics.jsonl`` reads as one uninterrupted run after a resume replays or abandons steps."""

from __future__ import annotations

import json
from pathlib import Path

from lerobot_kit.core.run.reporting.metrics_log import append_row, drop_rows_after, metrics_path


def steps(output_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in metrics_path(output_dir).read_text().splitlines()]


def test_a_run_starting_at_a_step_drops_the_rows_after_it(tmp_path: Path) -> None:
    for step in (10, 20, 20, 30, 40):  # step 20 has a training and an evaluation row
        append_row(tmp_path, {"step": step, "loss": 1.0 / step})
    with metrics_path(tmp_path).open("a") as handle:
        handle.write('{"step": 5')  # a crash in the middle of a write
    inode = metrics_path(tmp_path).stat().st_ino
    drop_rows_after(tmp_path, 20)
    assert steps(tmp_path) == [10, 20, 20]
    assert metrics_path(tmp_path).stat().st_ino == inode  # cut in place: a reader following the file keeps it
    append_row(tmp_path, {"step": 30, "loss": 0.5})
    assert steps(tmp_path) == [10, 20, 20, 30]


def test_a_fresh_run_and_a_resume_without_later_rows_change_nothing(tmp_path: Path) -> None:
    drop_rows_after(tmp_path, 0)
    assert not metrics_path(tmp_path).exists()
    append_row(tmp_path, {"step": 10, "loss": 1.0})
    before = metrics_path(tmp_path).read_bytes()
    drop_rows_after(tmp_path, 10)
    assert metrics_path(tmp_path).read_bytes() == before
