"""The repository's π0.5 sharding benchmark (benchmarks/vla_sharding.py), run as a user
runs it: FSDP(2) holds half of one process's bytes per rank and gathers no unit larger
than a small part of the model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import env

BENCHMARK = Path(__file__).resolve().parents[3] / "benchmarks" / "vla_sharding.py"


def test_fsdp2_pi05_bytes_per_rank_and_largest_all_gather(work: Path) -> None:
    out = work / "vla_bench.json"
    result = subprocess.run([sys.executable, str(BENCHMARK), "--workdir", str(work / "vla_bench"), "--json", str(out)],
                            capture_output=True, text=True, env=env(work), timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = {row["name"]: row for row in json.loads(out.read_text())["rows"]}
    held = rows["fsdp2 param+grad+optim bytes per rank vs one process / 2"]
    gathered = rows["fsdp2 largest all-gather vs the model's parameter bytes"]
    assert held["met"] and held["ratio"] <= 1.05 and held["ours"] > 0
    assert gathered["met"] and gathered["ratio"] <= 0.15
    assert "vla_sharding | fsdp2 param+grad+optim bytes per rank" in result.stdout  # the printed table
