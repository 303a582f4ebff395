"""One JSON reader, one JSON writer and one byte formatter, held by a scan of the product packages.

A module that parses or writes JSON itself words its failures and lays out its files its own
way, and a second byte formatter drifts from the first (``MB`` beside ``MiB``); so each job has
one home (``core.layout.json_file``, ``core.layout.byte_size``), and the modules that must do
it themselves are listed below with why. The scan reads source, never imports it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from conftest import REPO

PACKAGES = ("core", "cli", "plugins", "api")
JSON_FILE = "core/layout/json_file.py"
BYTE_SIZE = "core/layout/byte_size.py"

# Modules that use json.load/json.loads themselves, each a read the one reader's one-line
# error would be wrong for.
PARSERS = {
    JSON_FILE: "the one reader",
    "core/config/json_input.py": "the strict decoder (finite numbers, bounded depth) the reader runs on configs",
    "core/run/reporting/metrics_log.py": "tolerant: the metrics log is cut at its first torn line",
    "core/run/output/lock.py": "tolerant: a lock record being written or damaged is no record",
    "core/layout/pretrained_config.py": "its own child process's answer on stdout, not a file",
}
# Modules that use json.dump, or json.dumps where they write to a file, themselves.
WRITERS = {
    JSON_FILE: "the one writer",
    "core/run/reporting/metrics_log.py": "appends one JSON line per row (JSON Lines, not a JSON file)",
    "core/run/reliability/fault_injection.py": "appends one JSON line per injected fault, for tests",
}
WRITE_METHODS = {"write", "write_text", "write_bytes"}
BYTE_UNIT = re.compile(r"\b[KMGT]i?B\b")


def _modules() -> Iterator[tuple[str, ast.Module]]:
    for package in PACKAGES:
        for file in sorted((REPO / package).rglob("*.py")):
            yield file.relative_to(REPO).as_posix(), ast.parse(file.read_text(encoding="utf-8"), filename=str(file))


def _scopes(tree: ast.Module) -> Iterator[list[ast.AST]]:
    """The nodes of each function (nested ones included), and those of the module outside them."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield list(ast.walk(node))
    top = [stmt for stmt in tree.body if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    yield [node for stmt in top for node in ast.walk(stmt)]


def _uses(nodes: list[ast.AST], module: str, names: set[str]) -> bool:
    """Whether ``module.<one of names>`` is called or handed on among ``nodes`` (``decode=json.loads``)."""
    return any(isinstance(n, ast.Attribute) and n.attr in names and isinstance(n.value, ast.Name)
               and n.value.id == module for n in nodes)


def _writes_file(nodes: list[ast.AST]) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in WRITE_METHODS
               for n in nodes)


def _units(nodes: list[ast.AST]) -> set[str]:
    """Byte units named by the scope's strings, docstrings and other bare strings aside."""
    bare = {id(n.value) for n in nodes if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    return {unit for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in bare
            for unit in BYTE_UNIT.findall(n.value)}


def _found() -> dict[str, set[str]]:
    """``{"parses": modules, "writes": modules, "formats bytes": modules}`` across the packages."""
    found: dict[str, set[str]] = {"parses": set(), "writes": set(), "formats bytes": set()}
    for path, tree in _modules():
        for nodes in _scopes(tree):
            if _uses(nodes, "json", {"load", "loads"}):
                found["parses"].add(path)
            if _uses(nodes, "json", {"dump"}) or (_uses(nodes, "json", {"dumps"}) and _writes_file(nodes)):
                found["writes"].add(path)
            if len(_units(nodes)) >= 2:  # a formatter picks among units; a message quoting a size names one
                found["formats bytes"].add(path)
    return found


FOUND = _found()


def test_the_scan_finds_the_one_reader_writer_and_formatter() -> None:
    assert JSON_FILE in FOUND["parses"] and JSON_FILE in FOUND["writes"]
    assert FOUND["formats bytes"] >= {BYTE_SIZE}


def test_json_is_parsed_by_the_one_reader_or_a_listed_module() -> None:
    assert FOUND["parses"] - set(PARSERS) == set(), "read through core.layout.json_file (read_json, decode_json_bytes)"


def test_json_files_are_written_by_the_one_writer_or_a_listed_module() -> None:
    assert FOUND["writes"] - set(WRITERS) == set(), "write through core.layout.json_file.write_json"


def test_the_lists_name_only_modules_that_still_need_to_be_there() -> None:
    assert set(PARSERS) - FOUND["parses"] == set() and set(WRITERS) - FOUND["writes"] == set()


def test_bytes_are_formatted_by_byte_size_alone() -> None:
    assert FOUND["formats bytes"] == {BYTE_SIZE}, "format byte counts with core.layout.byte_size.byte_size"


def test_a_second_formatter_or_writer_would_be_found(tmp_path: Path) -> None:
    source = '''
def size(n):
    """In KiB or MiB."""
    return f"{n / 2**20:.1f} MiB" if n > 2**20 else f"{n / 1024:.1f} KiB"

def save(path, data):
    text = json.dumps(data)
    path.write_text(text)
'''
    [function_nodes, save_nodes, _] = list(_scopes(ast.parse(source)))
    assert _units(function_nodes) == {"MiB", "KiB"}
    assert _uses(save_nodes, "json", {"dumps"}) and _writes_file(save_nodes)
