"""Run the benchmarks, print one table, write one result file.

    python benchmarks/run.py [--smoke] [--only NAME,...] [--json out.json] [--workdir DIR] [--note TEXT]

Every figure is a ratio of ours to a reference measured side by side in this run, so
that a noisy machine moves both sides together. ``--smoke`` runs the same code paths
at toy sizes (``python -m pytest -q benchmarks`` runs each benchmark that way, so the
benchmarks never rot; CI runs it after the main suite).

The result file holds what the docs' tables are rendered from
(``benchmarks/render_docs.py``): the date, the machine (CPU, cores, memory, GPU, load
average before and after each benchmark), the versions (Python, torch, the lerobot-kit
commit), the exact command, ``--note`` (what else the machine was doing), and each
benchmark's rows with its raw samples.

Each process of the benchmarks, this one included, runs torch with one thread (as the
test suite launches ranks): on a shared two-core machine, OpenMP's spinning worker
threads make two-thread timings swing tenfold with other people's load.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import Context, Result, Row, result_header  # noqa: E402

# Order matters: `checkpoints` leaves the large checkpoint that `convert_dcp` and `startup` reuse.
MODULES = {
    "loop_overhead": "loop_overhead",
    "memory": "memory_per_rank",
    "dist_overhead": "dist_overhead",
    "checkpoints": "checkpoint_io",
    "convert_dcp": "convert_dcp",
    "startup": "startup",
    "data_memory": "data_memory",
    "data": "data_throughput",
    "fault_injection": "fault_injection",
    "ac_compile": "ac_compile",
    "eval_success": "eval_success",
    "mixture_scale": "mixture_scale",
}


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="toy sizes: seconds, same code paths")
    parser.add_argument("--only", default="", help=f"comma-separated subset of: {', '.join(MODULES)}")
    parser.add_argument("--json", default="benchmarks.json", help="where to write the results (default %(default)s)")
    parser.add_argument("--workdir", default=None, help="scratch folder (default: a temporary one, deleted)")
    parser.add_argument("--note", default="", help="recorded in the result file: what else ran on the machine")
    args = parser.parse_args(argv)
    unknown = [n for n in args.only.split(",") if n and n not in MODULES]
    if unknown:
        parser.error(f"--only: unknown benchmark {', '.join(unknown)}; choose from {', '.join(MODULES)}")
    return args


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0 or 0.01 <= abs(value) < 100_000:
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return f"{value:.3g}"


def table(rows: list[tuple[str, Row]]) -> str:
    header = ("benchmark", "measure", "ours", "reference", "unit", "ratio", "goal", "met")
    lines = [header]
    for bench, row in rows:
        met = {True: "yes", False: "NO", None: "-"}[row.met]
        lines.append((bench, row.name, _fmt(row.ours), _fmt(row.reference), row.unit, _fmt(row.ratio),
                      row.goal or "reported", met))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = [" | ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in lines]
    out.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(out)


def main(argv: list[str]) -> int:
    args = _parse(argv)
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    selected = [n for n in MODULES if not args.only or n in args.only.split(",")]
    scratch = tempfile.TemporaryDirectory(prefix="lerobot-bench-") if args.workdir is None else None
    workdir = Path(args.workdir or scratch.name).resolve()  # type: ignore[union-attr]
    workdir.mkdir(parents=True, exist_ok=True)
    ctx = Context(smoke=args.smoke, workdir=workdir)
    report: dict[str, Any] = {
        **result_header("benchmarks/run.py", argv),
        "smoke": args.smoke,
        "notes": args.note,
        "benchmarks": {},
    }
    report["machine"].update(torch_threads=torch.get_num_threads(), load_average_start=os.getloadavg())
    rows: list[tuple[str, Row]] = []
    failed = False
    for name in selected:
        print(f"[{name}] running...", file=sys.stderr, flush=True)
        load_before = os.getloadavg()[0]
        start = time.perf_counter()
        try:
            result: Result = importlib.import_module(MODULES[name]).run(ctx)
            error = None
        except Exception:  # noqa: BLE001 - one broken benchmark must not hide the others' numbers
            result, error, failed = Result(), traceback.format_exc(), True
            print(error, file=sys.stderr)
        seconds = time.perf_counter() - start
        print(f"[{name}] {seconds:.1f}s", file=sys.stderr, flush=True)
        report["benchmarks"][name] = {
            "seconds": round(seconds, 2),
            "load_average_1min": [load_before, os.getloadavg()[0]],
            "error": error,
            "rows": [r.to_json() for r in result.rows],
            "details": result.details,
        }
        rows += [(name, r) for r in result.rows]
    report["machine"]["load_average_end"] = os.getloadavg()
    Path(args.json).write_text(json.dumps(report, indent=2))
    print(table(rows))
    print(f"\nresults: {args.json}", file=sys.stderr)
    if scratch is not None:
        scratch.cleanup()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
