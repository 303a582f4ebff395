"""Every table of measured figures is rendered from a committed result file, and equals
what ``benchmarks/render_docs.py`` renders from it now: no figure is typed in by hand."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import render_docs  # noqa: E402

RESULTS = sorted((REPO / "benchmarks" / "results").glob("*.json"))
# Pages whose every table is measured figures.
FIGURE_PAGES = [REPO / "docs" / "performance.md", REPO / "docs" / "gpu.md"]


def test_tables_equal_what_their_result_files_render() -> None:
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "render_docs.py"), "--check"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_a_table_edited_by_hand_is_caught(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    spec = "rows benchmarks/results/cpu-startup.json"
    rendered = f"<!-- figures: {spec} -->\n" + render_docs.render_block(spec, page) + "<!-- /figures -->\n"
    page.write_text(rendered)
    assert render_docs.render_page(page) == rendered
    edited = re.sub(r"\| yes \|", "| NO |", rendered, count=1)
    assert edited != rendered
    page.write_text(edited)
    assert render_docs.render_page(page) == rendered


@pytest.mark.parametrize("result", RESULTS, ids=lambda p: p.name)
def test_result_files_say_where_and_how_they_were_measured(result: Path) -> None:
    data = json.loads(result.read_text())
    assert {"date", "machine", "versions", "command"} <= data.keys()
    assert {"cpu", "cores", "memory_gib", "gpu"} <= data["machine"].keys()
    assert {"python", "torch", "lerobot_kit"} <= data["versions"].keys()
    assert data["command"].startswith(
        ("python benchmarks/run.py", "python benchmarks/gpu.py", "python benchmarks/vla_plan_table.py",
         "python contrib/lerobot-kit-lerobot/tools/benchmark.py"))
    figures = data.get("benchmarks") or {key: data.get(key) for key in ("checks", "speed", "plan", "comparison")}
    assert any(figures.values()), "no figures"
    if "transcribed_from" in data:  # copied from a page: says from where, and what was not kept
        assert "not kept" in data["transcribed_from"]
        return
    assert None not in (data["machine"]["cpu"], data["versions"]["python"], data["versions"]["lerobot_kit"])
    assert not data.get("smoke"), "a smoke run measures nothing"
    for name, bench in data.get("benchmarks", {}).items():
        assert bench["error"] is None, f"{name} failed in this run"
        assert bench["details"], f"{name}: the raw samples are missing"


def test_every_result_file_is_shown_and_every_shown_file_exists() -> None:
    used = render_docs.result_files_used()
    assert used == set(RESULTS)


@pytest.mark.parametrize("page", FIGURE_PAGES, ids=lambda p: p.name)
def test_no_table_of_figures_is_typed_in(page: Path) -> None:
    outside = render_docs.BLOCK.sub("", page.read_text())
    outside = re.sub(r"^```.*?^```", "", outside, flags=re.MULTILINE | re.DOTALL)
    assert not re.search(r"^\|", outside, re.MULTILINE), "a table outside <!-- figures --> markers"
