"""``python benchmarks/run.py --smoke``: every benchmark runs end to end at toy sizes, so
the benchmarks cannot rot between full runs. A suite of its own (``python -m pytest -q
benchmarks``, run by CI after the main suite): it tests the measuring scripts, not the
product, and takes about two and a half minutes on two cores. Numbers are not judged here
(a smoke run on a shared machine measures nothing); that each one is there and finite is.

One benchmark per test (``--only``), so each has its own time limit and test workers
can run them side by side; ``test_run_py_lists_every_benchmark`` checks that none is
left out."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

BENCHMARKS = ["loop_overhead", "memory", "dist_overhead", "checkpoints", "convert_dcp", "startup", "data_memory",
              "data", "fault_injection", "ac_compile", "eval_success", "mixture_scale"]
# Rows a benchmark must report whatever its figures (its other rows are checked generically).
EXPECTED_ROWS = {
    "memory": ["fsdp2 param+grad+optim", "fsdp4 param+grad+optim", "hsdp2x2 param+grad+optim"],
    "loop_overhead": ["act step time"],
    "checkpoints": ["save, training blocked (--async_checkpoint=true): dcp"],
    "mixture_scale": ["loader, random sampling", "loader, episode blocks sampling", "decode alone",
                      "lerobot train --dataset.mixture"],
}


def test_run_py_lists_every_benchmark() -> None:
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "run.py"), "--only", "nope"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert f"choose from {', '.join(BENCHMARKS)}" in result.stderr


@pytest.mark.timeout(420)
@pytest.mark.parametrize("name", BENCHMARKS)
def test_smoke_run_reports_the_benchmark(tmp_path: Path, name: str) -> None:
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "run.py"), "--smoke", "--only", name, "--json", str(out),
         "--workdir", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=400, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    report = json.loads(out.read_text())
    assert report["smoke"] is True and report["machine"]["torch_threads"] == 1
    assert list(report["benchmarks"]) == [name]
    bench = report["benchmarks"][name]
    assert bench["error"] is None, f"{name}: {bench['error']}"
    assert bench["rows"], f"{name} reported no rows"
    for row in bench["rows"]:
        assert math.isfinite(row["ours"]), row
        assert row["reference"] is None or math.isfinite(row["reference"]), row
        assert row["ratio"] is None or math.isfinite(row["ratio"]), row
        assert row["met"] in (True, False, None)
        assert (row["met"] is None) == (not row["goal"]), row
    names = [row["name"] for row in bench["rows"]]
    for prefix in EXPECTED_ROWS.get(name, []):
        assert any(r.startswith(prefix) for r in names), (prefix, names)
    # The printed table has one line per row, under a header and a rule.
    table = result.stdout.strip().splitlines()
    assert [cell.strip() for cell in table[0].split("|")][:3] == ["benchmark", "measure", "ours"]
    assert len(table) == 2 + len(bench["rows"])
