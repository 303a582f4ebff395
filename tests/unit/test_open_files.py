"""The per-process table of open files the LeRobot reader's datasets share (``open_files``)."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys

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
