"""The per-process table of open files the LeRobot reader's datasets share (``open_files``), the
open-file limit it is sized by, and maps that hold no descriptor (``mapped``)."""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lerobot_kit.plugins.datasets.lerobot.mapped import map_read_only
from lerobot_kit.plugins.datasets.lerobot.open_files import OpenFiles

CHILD_TIMEOUT_S = 30


def test_the_least_recently_used_entry_is_closed_to_make_room() -> None:
    closed: list[str] = []
    table: OpenFiles[str] = OpenFiles(2, closed.append)
    assert table.get("a", lambda: "A") == "A" and table.get("b", lambda: "B") == "B"
    assert table.get("a", lambda: "never opened again") == "A"  # a is now the most recently used
    assert table.peek("b") == "B"  # peeking leaves b the least recently used
    table.get("c", lambda: "C")
    assert closed == ["B"] and len(table) == 2 and table.peek("b") is None
    table.discard("a")
    assert closed == ["B", "A"] and table.peek("c") == "C"
    table.close_all()
    assert closed == ["B", "A", "C"] and len(table) == 0


def test_entries_past_the_cost_bound_are_closed_but_never_the_most_recently_used() -> None:
    closed: list[str] = []
    table: OpenFiles[str] = OpenFiles(10, closed.append, max_cost=100, kept=2)
    for name, cost in (("a", 40), ("b", 40), ("c", 10)):
        table.get(name, lambda name=name: name.upper(), cost=cost)
    assert closed == [] and len(table) == 3
    table.get("d", lambda: "D", cost=30)  # 120 > 100: the least recently used goes
    assert closed == ["A"] and len(table) == 3
    table.get("e", lambda: "E", cost=500)  # far past the bound: all but the most recent one (kept=2) go
    assert closed == ["A", "B", "C"] and [table.peek(k) for k in "de"] == ["D", "E"]
    table.discard("e")
    table.get("f", lambda: "F", cost=60)  # 30 + 60: within the bound again
    assert closed == ["A", "B", "C", "E"] and len(table) == 2


def test_the_file_budget_is_a_share_of_the_open_file_limit() -> None:
    code = ("import resource; resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit("
            "resource.RLIMIT_NOFILE)[1])); from lerobot_kit.plugins.datasets.lerobot.open_files import file_budget; "
            "print(file_budget(1 / 2), file_budget(1 / 4), file_budget(0.001))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          check=True).stdout.split() == ["512", "256", "8"]


def _in_child(table: OpenFiles[str], results: multiprocessing.Queue) -> None:
    before = len(table)
    table.get("child", lambda: "opened in the child")
    results.put((before, len(table)))


def test_a_forked_child_starts_empty_and_leaves_the_parents_entries_open() -> None:
    closed: list[str] = []
    table: OpenFiles[str] = OpenFiles(4, closed.append)
    table.get("parent", lambda: "opened in the parent")
    fork = multiprocessing.get_context("fork")
    results = fork.Queue()
    child = fork.Process(target=_in_child, args=(table, results))
    child.start()
    child.join(CHILD_TIMEOUT_S)
    if child.is_alive():
        child.kill()
        child.join()
    assert child.exitcode == 0
    assert results.get(timeout=10) == (0, 1)
    assert closed == [] and table.peek("parent") == "opened in the parent"


def test_a_mapped_file_holds_no_descriptor_and_is_unmapped_with_its_last_view(tmp_path: Path) -> None:
    path = tmp_path / "arrays.bin"
    path.write_bytes(np.arange(1000, dtype=np.int64).tobytes())
    before = len(os.listdir("/proc/self/fd"))
    fd = os.open(path, os.O_RDONLY)
    data = map_read_only(fd, path.stat().st_size)
    os.close(fd)
    view = np.frombuffer(data, np.int64, 10, 8)
    del data
    assert len(os.listdir("/proc/self/fd")) == before
    assert view.tolist() == list(range(1, 11)) and not view.flags.writeable
    assert str(path) in Path("/proc/self/maps").read_text()
    del view
    gc.collect()
    assert str(path) not in Path("/proc/self/maps").read_text()


RAISE = r"""
import json, logging, resource, sys
logging.basicConfig(level=logging.INFO, format="%(message)s")
hard = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
from lerobot_kit.plugins.datasets.lerobot.open_files import FileBudget, raise_open_file_limit
budget = FileBudget(3 / 4)
before = budget()
raise_open_file_limit(500)
after_few = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
raise_open_file_limit(1500)
print(json.dumps([before, after_few, resource.getrlimit(resource.RLIMIT_NOFILE)[0], budget()]))
"""


@pytest.mark.parametrize(("hard", "expected"), [(4096, [768, 1024, 2000, 1500]), (1024, [768, 1024, 1024, 768])])
def test_a_soft_limit_below_what_the_decoders_want_is_raised_up_to_the_hard_limit(hard: int, expected: list[int]
                                                                                   ) -> None:
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < hard:
        pytest.skip(f"this machine's hard open-file limit is below {hard}")
    result = subprocess.run([sys.executable, "-c", RAISE, str(hard)], capture_output=True, text=True, timeout=60,
                            check=True)
    assert json.loads(result.stdout.splitlines()[-1]) == expected
    raised = [line for line in result.stderr.splitlines() if "open-file limit" in line]
    assert raised == ([f"raised this process's soft open-file limit from 1024 to 2000 (hard limit {hard}) so that "
                       "1500 of the 1500 video files stay open; see docs/mixtures.md"] if hard > 1024 else [])
