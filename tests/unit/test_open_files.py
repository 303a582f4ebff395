"""The per-process table of open files the LeRobot reader's datasets share (``open_files``)."""

from __future__ import annotations

import multiprocessing

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
