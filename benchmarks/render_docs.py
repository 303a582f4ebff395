"""Render the docs' tables of measured figures from the result files in benchmarks/results/.

    python benchmarks/render_docs.py [--check]

Every table of measured figures in the README and docs/ sits between two markers, and is
rewritten in place from the result file the first marker names:

    <!-- figures: KIND benchmarks/results/NAME.json [only=a,b] [compare=OTHER.json] -->
    (rendered: where and how the figures were measured, then the table)
    <!-- /figures -->

A result file is what ``benchmarks/run.py --json`` or ``benchmarks/gpu.py`` wrote: the
date, the machine, the versions, the exact command and the raw figures. Figures measured
before result files were kept are transcribed into files of the same shape with a
``transcribed_from`` entry saying where they were copied from; their tables say so: the
paragraph above says "unverified transcription from <source>", and every row (and a column
compared from such a file) is marked "unverified transcription".

KIND picks the renderer: ``rows`` (the table ``run.py`` prints; ``only=`` picks
benchmarks), ``trials`` (``fault_injection``'s trials), ``eval-line`` (the summary line of
``eval_success``'s ``lerobot eval``), ``gpu-checks`` and ``gpu-speed`` (``gpu.py``'s;
``compare=`` adds a column of another run's samples/s), ``plan-table`` (the rows of
``vla_plan_table.py --json``) and ``comparison`` (``tools/benchmark.py --json``: LeRobot's
``lerobot-train`` beside the bridge), both in the LeRobot bridge's README.

``--check`` writes nothing and exits 1 when a block differs from what its result file
renders, naming each (the test suite runs it: a table edited by hand, or a result file
replaced without rendering, fails). A block that cannot be rendered (a missing file, an
unknown kind, a benchmark the file lacks) is one line and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "contrib").glob("*/README.md"))]
BLOCK = re.compile(r"(<!-- figures: (?P<spec>[^>]*?) -->\n)(?P<body>.*?)(<!-- /figures -->)", re.DOTALL)


@dataclass(frozen=True)
class Spec:
    kind: str
    result: Path
    options: dict[str, str]

    @classmethod
    def parse(cls, text: str) -> Spec:
        kind, result, *rest = text.split()
        options = dict(item.split("=", 1) for item in rest)
        return cls(kind, REPO / result, options)


def _fmt(value: float | None) -> str:
    """Numbers as ``run.py`` prints them: three decimals below 10, one below 100,000."""
    if value is None:
        return "-"
    if value == 0 or 0.01 <= abs(value) < 100_000:
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return f"{value:.3g}"


def _range(values: list[float]) -> str:
    low, high = min(values), max(values)
    return f"{low:.1f}" if f"{low:.1f}" == f"{high:.1f}" else f"{low:.1f}–{high:.1f}"


def provenance(data: dict[str, Any], result: Path, page: Path, benchmarks: list[str] | None = None) -> str:
    """One paragraph: when, on what, with which versions, by which command, and the file itself.
    A transcribed file leaves unknown entries null; they are left out here and its
    ``transcribed_from`` says what was not recorded."""
    machine, versions = data["machine"], data["versions"]
    hardware = [f"{machine['cores']} cores"]
    if machine.get("memory_gib"):
        hardware.append(f"{machine['memory_gib']} GiB")
    hardware.append(machine.get("gpu") or "no GPU")
    listed = ", ".join(hardware)
    where = f"{machine['cpu']} ({listed})" if machine.get("cpu") else f"a machine with {listed}"
    software = [f"torch {versions['torch']}" + (f" (CUDA {versions['cuda']})" if versions.get("cuda") else "")]
    if versions.get("python"):
        software.insert(0, f"Python {versions['python']}")
    if versions.get("lerobot"):
        software.append(f"LeRobot {versions['lerobot']}")
    if versions.get("lerobot_kit"):
        software.append(f"lerobot-kit {versions['lerobot_kit']}")
    rel = Path(os.path.relpath(result, page.parent)).as_posix()
    link = f"[{result.name}]({rel})"
    date = str(data["date"]).replace("T", " ")
    notes = f" {data['notes'].rstrip('.')}." if data.get("notes") else ""
    command = _without_note(data["command"])
    if "transcribed_from" in data:
        return (f"Run on {date} on {where}; {', '.join(software)}; by `{command}`.{notes} "
                f"Kept in {link}; every row below is an {unverified(data)}.")
    loads = [v for name, bench in data.get("benchmarks", {}).items() if benchmarks is None or name in benchmarks
             for v in bench.get("load_average_1min", [])]
    load = f"; load average {_range(loads)} over the run" if loads else ""
    return (f"Measured {date} on {where}{load}; {', '.join(software)}; by `{command}`.{notes} "
            f"Raw figures: {link}.")


UNVERIFIED = "unverified transcription"


def unverified(data: dict[str, Any]) -> str:
    """How a transcribed file's figures are labelled wherever they are shown: copied by hand
    from a page, with no raw output behind them to check them against."""
    return f"{UNVERIFIED} from {data['transcribed_from']}"


def marked_rows(table: str) -> str:
    """A transcribed file's table with a last column saying so on every row."""
    cells = {0: " source |", 1: " --- |"}
    lines = table.split("\n")
    return "\n".join(line + cells.get(i, f" {UNVERIFIED} |") if line.startswith("|") else line
                     for i, line in enumerate(lines))


def _without_note(command: str) -> str:
    """The command as shown: its ``--note`` is shown as the notes that follow it."""
    try:
        words = shlex.split(command)
    except ValueError:
        return command
    if "--note" not in words:
        return command
    at = words.index("--note")
    return shlex.join(words[:at] + words[at + 2:])


def render_rows(data: dict[str, Any], spec: Spec) -> str:
    only = spec.options["only"].split(",") if "only" in spec.options else list(data["benchmarks"])
    missing = [name for name in only if name not in data["benchmarks"]]
    if missing:
        raise ValueError(f"{spec.result.name} has no benchmark {', '.join(missing)}")
    lines = ["| benchmark | measure | ours | reference | unit | ratio | goal | met |",
             "|---|---|---|---|---|---|---|---|"]
    for name in only:
        for row in data["benchmarks"][name]["rows"]:
            met = {True: "yes", False: "NO", None: "-"}[row["met"]]
            lines.append(f"| {name} | {row['name']} | {_fmt(row['ours'])} | {_fmt(row['reference'])} | {row['unit']} | "
                         f"{_fmt(row['ratio'])} | {row['goal'] or 'reported'} | {met} |")
    return "\n".join(lines)


def render_trials(data: dict[str, Any], spec: Spec) -> str:
    trials = data["benchmarks"]["fault_injection"]["details"]["trials"]
    lines = ["| trial | killed at | rank | step | what the fault saw | restarted from | recovered | bit-identical |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for t in trials:
        lines.append(f"| {t['trial']} | {t['point']} | {t['rank']} | {t['step']} | {t['observed']} | "
                     f"{t['resumed_from']} | {'yes' if t['recovered'] else 'NO'} | "
                     f"{'yes' if t['bit_identical'] else 'NO'} |")
    return "\n".join(lines)


def render_eval_line(data: dict[str, Any], spec: Spec) -> str:
    return "```text\n" + data["benchmarks"]["eval_success"]["details"]["summary"] + "\n```"


def render_gpu_checks(data: dict[str, Any], spec: Spec) -> str:
    lines = ["| check, through `lerobot` on CUDA | result | detail |", "| --- | --- | --- |"]
    lines += [f"| {c['check']} | {'ok' if c['ok'] else 'FAILED'} | {c['detail']} |" for c in data["checks"]]
    return "\n".join(lines)


def render_gpu_speed(data: dict[str, Any], spec: Spec) -> str:
    compare: dict[tuple[str, int], dict[str, Any]] = {}
    header = "| setting | batch | workers | samples/s | data wait / step | peak GPU memory | MFU |"
    if "compare" in spec.options:
        other = json.loads((REPO / spec.options["compare"]).read_text())
        compare = {(r["setting"], r["batch"]): r for r in other["speed"]}
        label = f" ({UNVERIFIED})" if "transcribed_from" in other else ""
        header += f" samples/s in {Path(spec.options['compare']).name}{label} |"
    lines = [header, "|" + " --- |" * (header.count("|") - 1)]
    for r in data["speed"]:
        cells = [r["setting"], str(r["batch"]), str(r["workers"])]
        if "error" in r:
            cells += [f"failed: {r['error']}", "", "", ""]
        else:
            mfu = f"{r['mfu'] * 100:.1f}%" if r.get("mfu") is not None else "n/a"
            cells += [f"{r['samples_per_s']:.1f}", f"{r['data_share'] * 100:.1f}%", f"{r['peak_gpu_gb']:.2f} GB", mfu]
        if compare:
            before = compare.get((r["setting"], r["batch"]), {})
            cells.append(f"{before['samples_per_s']:.1f}" if "samples_per_s" in before else "-")
        lines.append("| " + " | ".join(cells) + " |")
    if compare and "transcribed_from" in other:
        lines += ["", f"Samples/s in {Path(spec.options['compare']).name}: an {unverified(other)}."]
    return "\n".join(lines)


PLAN_TABLE_HEADER = (
    "| ranks | layout | training | trainable | params+grads+AdamW per rank | activations at batch 1 (no AC / AC) "
    "| largest batch in 80 GiB (no AC / AC) | largest batch in 141 GiB (no AC / AC) |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- |"
)


def plan_table_row(row: dict[str, Any]) -> str:
    """A row of ``vla_plan_table.py`` (which prints its rows with this too)."""
    gib = 2**30
    activations, fits = row["activation_bytes_batch1"], row["largest_batch"]
    return (
        f"| {row['ranks']} | {row['layout'].upper()} {row['dp_replicate']}×{row['dp_shard']} | {row['training']} "
        f"| {row['trainable_params'] / 1e9:.3f} B | {row['per_rank_state_bytes'] / gib:.2f} GiB "
        f"| {activations['plain'] / gib:.2f} / {activations['checkpointed'] / gib:.2f} GiB "
        + "".join(f"| {fit['plain']} / {fit['checkpointed']} " for fit in fits.values()) + "|"
    )


def render_plan_table(data: dict[str, Any], spec: Spec) -> str:
    return "\n".join([PLAN_TABLE_HEADER, *map(plan_table_row, data["plan"]["rows"])])


COMPARISON_ROWS = (("samples/s", "samples_per_s", "{:.2f}"), ("MFU", "mfu", "{:.1%}"),
                   ("CPU time per sample, training process (s)", "cpu_s_per_sample", "{:.2f}"),
                   ("peak GPU memory, allocated (GiB)", "peak_gpu_gib", "{:.2f}"),
                   ("data-wait share", "data_wait_share", "{:.1%}"),
                   ("peak RSS, training process (GiB)", "peak_rss_gib", "{:.2f}"),
                   ("peak PSS, process tree (GiB)", "peak_pss_gib", "{:.2f}"),
                   ("activation memory of a step, planned (GiB)", "plan_activation_gib", "{:.2f}"),
                   ("activation memory of a step, measured (GiB)", "activation_gib", "{:.2f}"),
                   ("CPU time of a forward and backward, model alone (s)", "step_cpu_s", "{:.2f}"),
                   ("time to first step (s)", "first_step_s", "{:.1f}"))


def comparison_table(theirs: dict[str, float], ours: dict[str, float]) -> str:
    """LeRobot's ``lerobot-train`` beside the bridge (``tools/benchmark.py`` prints this too);
    the GPU's rows only where both runs have them."""
    lines = ["| | LeRobot `lerobot-train` | lerobot-kit `lerobot train` | ours / theirs |", "| --- | --- | --- | --- |"]
    for label, key, fmt in COMPARISON_ROWS:
        if key not in theirs or key not in ours:
            continue
        ratio = f"{ours[key] / theirs[key]:.2f}x" if theirs[key] else "-"
        lines.append(f"| {label} | {fmt.format(theirs[key])} | {fmt.format(ours[key])} | {ratio} |")
    return "\n".join(lines)


def render_comparison(data: dict[str, Any], spec: Spec) -> str:
    figures = data["comparison"]
    return comparison_table(figures["lerobot-train"], figures["lerobot train"])


RENDERERS: dict[str, Callable[[dict[str, Any], Spec], str]] = {
    "rows": render_rows,
    "trials": render_trials,
    "eval-line": render_eval_line,
    "gpu-checks": render_gpu_checks,
    "gpu-speed": render_gpu_speed,
    "plan-table": render_plan_table,
    "comparison": render_comparison,
}


class RenderError(Exception):
    """A figures block that cannot be rendered: its page, its marker and why."""


def render_block(spec_text: str, page: Path) -> str:
    """What belongs between a block's markers."""
    try:
        spec = Spec.parse(spec_text)
        if spec.kind not in RENDERERS:
            raise ValueError(f"unknown figures kind {spec.kind!r}; one of {', '.join(RENDERERS)}")
        data = json.loads(spec.result.read_text())
        only = spec.options["only"].split(",") if "only" in spec.options else None
        table = RENDERERS[spec.kind](data, spec)
        if "transcribed_from" in data:
            table = marked_rows(table)
        return f"{provenance(data, spec.result, page, only)}\n\n{table}\n"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        where = page.relative_to(REPO) if page.is_relative_to(REPO) else page
        raise RenderError(f"{where}: <!-- figures: {spec_text} -->: {type(exc).__name__}: {exc}") from exc


def render_page(page: Path) -> str:
    """The page's text with every figures block rendered."""
    text = page.read_text()
    return BLOCK.sub(lambda m: m.group(1) + render_block(m.group("spec"), page) + m.group(4), text)


def result_files_used(pages: list[Path] = DOCS) -> set[Path]:
    """Every result file a block renders from, or compares with."""
    specs = [Spec.parse(m.group("spec")) for page in pages for m in BLOCK.finditer(page.read_text())]
    return {s.result for s in specs} | {REPO / s.options["compare"] for s in specs if "compare" in s.options}


def stale_pages(pages: list[Path] = DOCS) -> list[Path]:
    """Pages whose figures blocks differ from what their result files render."""
    return [page for page in pages if render_page(page) != page.read_text()]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a table is out of date")
    args = parser.parse_args(argv)
    try:
        stale = stale_pages()
    except RenderError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.check:
        for page in stale:
            print(f"error: {page.relative_to(REPO)}: its figures differ from their result files; "
                  "run python benchmarks/render_docs.py", file=sys.stderr)
        return 1 if stale else 0
    for page in stale:
        page.write_text(render_page(page))
        print(f"rendered {page.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
