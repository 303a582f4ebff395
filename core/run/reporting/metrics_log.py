"""``logs/metrics.jsonl``: one JSON object per logged step (training and evaluation rows), for scripts.

A resumed or restarted run replays the steps after its checkpoint, and ``--resume_from``
abandons later ones; appending alone would leave the file with two rows for those steps,
the abandoned path's and the new one's. So a run that starts from step N first drops the
rows after N: the file then reads as one uninterrupted run.
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
    """Main process only, before the first step of a run that starts at ``step``.

    Rows are appended in step order, so the rows to drop are the file's tail, from the
    first row after ``step`` (or the first line that does not parse: a crash mid-write);
    the file is cut there in place, keeping it the same file for anyone following it.
    """
    path = metrics_path(output_dir)
    if not path.is_file():
        return
    offset = 0
    with path.open("rb") as handle:
        for line in handle:
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                break
            if not isinstance(row, dict) or not isinstance(row.get("step"), (int, float)) or row["step"] > step:
                break
            offset += len(line)
        else:
            return
    os.truncate(path, offset)
