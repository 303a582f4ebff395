"""No import cycles: weight I/O sits below the model code, and no module of the package
imports one that (directly or not) imports it back at load time.

A cycle hidden in function-level imports still ties modules together: it only fails
later, in whichever order a caller happens to import them. So the layering rules below
read every import statement of a file, function bodies included (``TYPE_CHECKING``
blocks excepted: they never run), and each module of the weight I/O is also imported
first in a fresh interpreter, the order that exposes a cycle among its module-level imports.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import REPO

PACKAGES = {"core": "lerobot_kit.core", "plugins": "lerobot_kit.plugins", "cli": "lerobot_kit.cli",
            "api": "lerobot_kit.api"}
# What the modules that read and write checkpoints may not import: the model code builds
# on them (naming adapters, pretrained folders), and the run drives them.
WEIGHT_IO = ["training_step", "stored_weights", "weights", "training_state", "shard_writes", "paths", "atomic"]
ABOVE_WEIGHT_IO = ("lerobot_kit.core.model", "lerobot_kit.core.run", "lerobot_kit.core.registry")


def _modules() -> dict[str, Path]:
    found = {}
    for folder, package in PACKAGES.items():
        for file in (REPO / folder).rglob("*.py"):
            parts = [p for p in file.relative_to(REPO / folder).with_suffix("").parts if p != "__init__"]
            found[".".join([package, *parts])] = file
    return found


MODULES = _modules()


def _statements(body: list[ast.stmt], top_level_only: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from _statements(node.orelse, top_level_only)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and top_level_only:
            continue
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                children = getattr(node, field, None)
                if isinstance(children, list):
                    yield from _statements([c for c in children if isinstance(c, ast.AST)], top_level_only)


def imports_of(module: str, top_level_only: bool = False) -> set[str]:
    """The package's modules that ``module`` imports (``from a import b`` counts ``a.b`` when it is one)."""
    file = MODULES[module]
    package = module if file.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in _statements(ast.parse(file.read_text()).body, top_level_only):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        found.update(name for name in names if name in MODULES and name != module)
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_the_checker_sees_function_level_and_relative_imports() -> None:
    assert "lerobot_kit.core.registry.registry" in imports_of("lerobot_kit.core.model.policy")  # inside make_policy
    assert "lerobot_kit.core.registry.registry" not in imports_of("lerobot_kit.core.model.policy", top_level_only=True)
    assert "lerobot_kit.core.checkpoint.weights" not in imports_of("lerobot_kit.core.registry.registry")  # TYPE_CHECKING
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_module_level_imports_form_no_cycle() -> None:
    graph = {module: imports_of(module, top_level_only=True) for module in MODULES}
    assert _cycle(graph) is None


@pytest.mark.parametrize("name", WEIGHT_IO)
def test_weight_io_imports_nothing_built_on_it(name: str) -> None:
    module = f"lerobot_kit.core.checkpoint.{name}"
    assert not sorted(m for m in imports_of(module) if m.startswith(ABOVE_WEIGHT_IO))


def test_weights_peft_and_policy_import_each_other_one_way_only() -> None:
    """policy builds on peft (adapter folders) and both on weights; nothing points back."""
    weights, peft, policy = (f"lerobot_kit.core.{m}" for m in ("checkpoint.weights", "model.peft", "model.policy"))
    assert peft in imports_of(policy) and weights in imports_of(peft)
    assert policy not in imports_of(peft)
    graph = {module: imports_of(module) for module in MODULES if module.startswith(("lerobot_kit.core.checkpoint",
                                                                                    "lerobot_kit.core.model",
                                                                                    "lerobot_kit.core.offline"))}
    graph = {module: {m for m in found if m in graph} for module, found in graph.items()}
    assert _cycle(graph) is None


@pytest.mark.parametrize("module", ["checkpoint.weights", "model.peft", "model.policy"])
def test_imports_first_in_a_fresh_interpreter(module: str) -> None:
    result = subprocess.run([sys.executable, "-c", f"import lerobot_kit.core.{module}"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
