"""``logs/metrics.jsonl``: one JSON object per logged step (training and evaluation rows), for scripts.

A resumed or restarted run replays the steps after its checkpoint, and ``--resume_from``
abandons later ones; appending alone would leave the file with two rows for those steps,
the abandoned path's and the new one's. So a run that starts from step N first drops the
rows after N (rewriting the file atomically): the file then reads as one uninterrupted run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def metrics_path(output_dir: Path) -> Path:
    return output_dir / "logs" / "metrics.jsonl"


def append_row(output_dir: Path, row: dict[str, Any]) -> None:
    """Main process only."""
    path = metrics_path(output_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        handle.write(json.dumps(row) + "\n")


def drop_rows_after(output_dir: Path, step: int) -> None:
    """Main process only, before the first step of a run that starts at ``step``. A line
    that does not parse (a crash mid-write) is dropped with the rows after ``step``."""
    path = metrics_path(output_dir)
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), (int, float)) and row["step"] <= step:
            kept.append(line)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(f"{line}\n" for line in kept))
    os.replace(tmp, path)
