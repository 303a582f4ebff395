"""``python benchmarks/run.py --smoke``: every benchmark runs end to end at toy sizes, so
the benchmarks cannot rot between full runs. Numbers are not judged here (a smoke run
on a shared machine measures nothing); that each one is there and finite is."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

BENCHMARKS = ["loop_overhead", "memory", "dist_overhead", "checkpoints", "convert_dcp", "startup", "data_memory",
              "data", "fault_injection", "ac_compile", "eval_success"]


@pytest.mark.timeout(420)
def test_smoke_run_reports_every_benchmark(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "run.py"), "--smoke", "--json", str(out),
         "--workdir", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=400, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    report = json.loads(out.read_text())
    assert report["smoke"] is True and report["machine"]["torch_threads"] == 1
    assert list(report["benchmarks"]) == BENCHMARKS
    for name, bench in report["benchmarks"].items():
        assert bench["error"] is None, f"{name}: {bench['error']}"
        assert bench["rows"], f"{name} reported no rows"
        for row in bench["rows"]:
            assert math.isfinite(row["ours"]), (name, row)
            assert row["reference"] is None or math.isfinite(row["reference"]), (name, row)
            assert row["ratio"] is None or math.isfinite(row["ratio"]), (name, row)
            assert row["met"] in (True, False, None)
            assert (row["met"] is None) == (not row["goal"]), (name, row)
    rows = {row["name"] for bench in report["benchmarks"].values() for row in bench["rows"]}
    for layout in ("fsdp2", "fsdp4", "hsdp2x2"):
        assert any(r.startswith(f"{layout} param+grad+optim") for r in rows), rows
    assert any(r.startswith("act step time") for r in rows)
    assert any(r.startswith("save, training blocked (--async_checkpoint=true): dcp") for r in rows), rows
    # The printed table has one line per row, under a header and a rule.
    table = result.stdout.strip().splitlines()
    assert [cell.strip() for cell in table[0].split("|")][:3] == ["benchmark", "measure", "ours"]
    assert len(table) == 2 + sum(len(b["rows"]) for b in report["benchmarks"].values())
