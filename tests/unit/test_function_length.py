"""No function of the package is longer than ``MAX_LINES``: a longer one does several jobs,
which read better, and are tested better, as helpers with names that say what each does.

A function's length runs from its ``def`` line to its last line, docstring and nested
functions included (a nested function counts on its own as well)."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from conftest import REPO

MAX_LINES = 60
PACKAGES = ("core", "cli", "plugins", "api")


def _functions() -> Iterator[tuple[str, int]]:
    """``(path:line name, length)`` of every function and method of the packages."""
    for package in PACKAGES:
        for file in sorted((REPO / package).rglob("*.py")):
            tree = ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    where = f"{file.relative_to(REPO)}:{node.lineno} {node.name}"
                    yield where, node.end_lineno - node.lineno + 1


def test_functions_are_at_most_sixty_lines() -> None:
    found = list(_functions())
    assert len(found) > 500  # the packages were walked
    too_long = [f"{where} ({length} lines)" for where, length in found if length > MAX_LINES]
    assert too_long == [], f"functions over {MAX_LINES} lines, split them into helpers: {too_long}"
