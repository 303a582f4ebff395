"""The package's layers, declared once and held: every import points down, never up, even inside a function.

``lerobot_kit.core`` is a stack of subpackages (``CORE_LAYERS``, bottom first); a module
may import its own subpackage and those below it, never one above. So the layers can be
drawn, read bottom-up, and changed one at a time: the checkpoint code does not know the
run, the model does not know the checkpoint code, the registry knows none of what it
registers, and no cycle can form. Above core sit the API (the plugin surface), the
built-in plugins (which use the API only, as a third party must) and the CLI.

An import inside a function ties two modules together as surely as one at the top, only
later, so every ``import`` and ``from ... import`` of a module counts, wherever it
stands; only those under ``if TYPE_CHECKING:`` (annotations, never run) do not. The
layer table of docs/architecture.md is checked against the same data, its torch column
included, and so is its table of the run's rooms, with each room's file count.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

from conftest import REPO

PACKAGES = {"core": "lerobot_kit.core", "plugins": "lerobot_kit.plugins", "cli": "lerobot_kit.cli",
            "api": "lerobot_kit.api"}

# Bottom first. ``errors`` and ``version`` are single modules under everything; the registry
# (plugin discovery and typed lookups, checked against contracts the layers above declare to
# it) sits below all it registers, config classes included.
CORE_LAYERS = ["errors", "version", "registry", "layout", "config", "distributed", "data", "parallel", "model",
               "checkpoint", "offline", "eval", "run", "plan"]
# Above core, bottom first: the API re-exports core; plugins build on the API; the CLI drives all.
TOP_LAYERS = ["api", "plugins", "cli"]

# Modules whose import imports torch.
TORCH_MODULES = ("torch", "safetensors.torch", "peft")
ARCHITECTURE = REPO / "docs" / "architecture.md"


@dataclass(frozen=True)
class Imported:
    """One name an import statement brings in, fully qualified; ``in_function`` when it runs only once called."""

    name: str
    in_function: bool


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(node: ast.AST, in_function: bool = False) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement under ``node``, anywhere but in an ``if TYPE_CHECKING:`` body."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node, in_function
        return
    children = node.orelse if isinstance(node, ast.If) and _is_type_checking(node.test) else ast.iter_child_nodes(node)
    inside = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
    for child in children:
        yield from _import_nodes(child, inside)


class Tree:
    """The modules of the packages under ``root`` (``{folder: dotted package}``; the one named ``core`` is
    layered by its subpackages) and what each imports."""

    def __init__(self, root: Path, packages: dict[str, str]) -> None:
        self.packages = packages
        self.core = packages["core"]
        self.modules: dict[str, Path] = {}
        for folder, package in packages.items():
            for file in (root / folder).rglob("*.py"):
                parts = [p for p in file.relative_to(root / folder).with_suffix("").parts if p != "__init__"]
                self.modules[".".join([package, *parts])] = file
        self.modules.pop(self.core, None)  # core's own __init__ belongs to no layer

    def imported_by(self, module: str) -> list[Imported]:
        """Every name ``module`` imports, relative imports resolved (``from a import b`` gives ``a`` and ``a.b``)."""
        file = self.modules[module]
        package = module if file.name == "__init__.py" else module.rpartition(".")[0]
        found = []
        for node, in_function in _import_nodes(ast.parse(file.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            found.extend(Imported(name, in_function) for name in names)
        return found

    def imports_of(self, module: str, top_level_only: bool = False) -> set[str]:
        """The tree's modules that ``module`` imports (at module level only, if asked)."""
        return {i.name for i in self.imported_by(module)
                if i.name in self.modules and i.name != module and not (top_level_only and i.in_function)}

    def layer_of(self, module: str) -> str:
        """``core.<layer>`` modules by their layer; the API, plugins and CLI by their top package."""
        if module.startswith(self.core + "."):
            return module[len(self.core) + 1:].split(".")[0]
        return next(folder for folder, package in self.packages.items()
                    if module == package or module.startswith(package + "."))

    def layer_imports(self) -> dict[tuple[str, str], list[str]]:
        """``{(importing layer, imported layer): ["a imports b", ...]}`` across layers, function-level included."""
        found: dict[tuple[str, str], list[str]] = {}
        for module in sorted(self.modules):
            for imported in sorted(self.imports_of(module)):
                pair = (self.layer_of(module), self.layer_of(imported))
                if pair[0] != pair[1]:
                    found.setdefault(pair, []).append(f"{module} imports {imported}")
        return found


def upward_imports(tree: Tree, order: list[str]) -> list[str]:
    """Each import of a layer from one above it in ``order`` (bottom first), or from no declared layer."""
    found = []
    for (mine, theirs), lines in tree.layer_imports().items():
        for layer in (mine, theirs):
            if layer not in order:
                found.append(f"{layer} is in no declared layer ({lines[0]}): add it to the declared order")
        if mine in order and theirs in order and order.index(theirs) > order.index(mine):
            found.extend(f"{line} ({mine} below {theirs})" for line in lines)
    return sorted(set(found))


def layer_cycles(tree: Tree) -> list[str]:
    """Each loop among core's subpackages, as ``a → b → ... → a`` with one import per step."""
    core = {tree.layer_of(module) for module in tree.modules if module.startswith(tree.core + ".")}
    imports = {(a, b): lines for (a, b), lines in tree.layer_imports().items() if a in core and b in core}
    graph: dict[str, list[str]] = {layer: sorted(b for a, b in imports if a == layer) for layer in core}

    def loop_through(start: str) -> list[str] | None:
        """A shortest chain of imports from ``start`` back to itself (breadth first)."""
        chains, seen = [[start]], {start}
        while chains:
            chain = chains.pop(0)
            for layer in graph[chain[-1]]:
                if layer == start:
                    return [*chain, layer]
                if layer not in seen:
                    seen.add(layer)
                    chains.append([*chain, layer])
        return None

    found: list[str] = []
    reported: set[frozenset[str]] = set()
    for layer in sorted(core):
        loop = loop_through(layer)
        if loop and frozenset(loop) not in reported:
            reported.add(frozenset(loop))
            steps = "; ".join(imports[(a, b)][0] for a, b in pairwise(loop))
            found.append(f"{' → '.join(loop)} ({steps})")
    return found


def torch_use(tree: Tree) -> dict[str, str]:
    """For each layer, whether its own modules import torch: ``yes`` (at import), ``in functions`` (only once a
    function runs), or ``no``."""
    levels = ["no", "in functions", "yes"]
    use: dict[str, str] = {}
    for module in tree.modules:
        torch = {i.in_function for i in tree.imported_by(module)
                 if any(i.name == t or i.name.startswith(t + ".") for t in TORCH_MODULES)}
        found = "yes" if False in torch else "in functions" if torch else "no"
        layer = tree.layer_of(module)
        use[layer] = max(use.get(layer, "no"), found, key=levels.index)
    return use


def layer_table(markdown: str) -> list[tuple[list[str], str]]:
    """The rows of the table under ``## Layers``: the layers each row names (in backticks), its torch cell."""
    section = markdown.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [(re.findall(r"`([^`]+)`", cells[1]), cells[3].strip())
            for cells in (row.split("|") for row in rows)]


REPO_TREE = Tree(REPO, PACKAGES)


def test_every_core_subpackage_is_declared() -> None:
    on_disk = {p.name for p in (REPO / "core").iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    on_disk |= {p.stem for p in (REPO / "core").glob("*.py") if p.stem != "__init__"}
    assert on_disk == set(CORE_LAYERS)


def test_the_checker_reads_imports_anywhere_but_under_type_checking() -> None:
    policy = "lerobot_kit.core.model.policy"
    assert "lerobot_kit.core.registry.registry" in REPO_TREE.imports_of(policy)  # inside make_policy
    assert "lerobot_kit.core.registry.registry" not in REPO_TREE.imports_of(policy, top_level_only=True)
    assert "lerobot_kit.core.checkpoint.weights" not in REPO_TREE.imports_of("lerobot_kit.core.registry.entries")


def test_imports_point_down_at_module_level_and_inside_functions() -> None:
    assert upward_imports(REPO_TREE, CORE_LAYERS + TOP_LAYERS) == []


def test_core_subpackages_form_no_cycle() -> None:
    assert layer_cycles(REPO_TREE) == []


def test_builtin_plugins_use_the_api_only() -> None:
    """The built-ins are plugins like any other: they prove the API is enough for one."""
    internal = [f"{module} imports {imported}" for module in sorted(REPO_TREE.modules)
                if REPO_TREE.layer_of(module) == "plugins" for imported in sorted(REPO_TREE.imports_of(module))
                if REPO_TREE.layer_of(imported) not in ("plugins", "api")]
    assert internal == []


SYNTHETIC = {
    "core/__init__.py": "",
    "core/low/__init__.py": "",
    "core/low/a.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from ..high.b import B\n\n\n"
                     "def helper():\n    from ..high import b\n\n    return b\n",
    "core/high/__init__.py": "",
    "core/high/b.py": "from pkg.core.low import a\n\n\nclass B:\n    def tensor(self):\n        import torch\n",
    "api/__init__.py": "from pkg.core.high.b import B\n",
}


def synthetic_tree(root: Path, files: dict[str, str]) -> Tree:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return Tree(root, {"core": "pkg.core", "api": "pkg.api"})


def test_the_checker_reports_an_upward_import_inside_a_function_and_its_cycle(tmp_path: Path) -> None:
    tree = synthetic_tree(tmp_path, SYNTHETIC)
    assert upward_imports(tree, ["low", "high", "api"]) == [
        "pkg.core.low.a imports pkg.core.high (low below high)",
        "pkg.core.low.a imports pkg.core.high.b (low below high)",
    ]
    assert layer_cycles(tree) == [
        "high → low → high (pkg.core.high.b imports pkg.core.low; pkg.core.low.a imports pkg.core.high)"]
    assert torch_use(tree) == {"low": "no", "high": "in functions", "api": "no"}


def test_the_checker_passes_the_same_tree_without_the_upward_import(tmp_path: Path) -> None:
    """Only the import under ``if TYPE_CHECKING:`` points up: it never runs, so it ties nothing."""
    files = {**SYNTHETIC, "core/low/a.py": SYNTHETIC["core/low/a.py"].split("\n\n\ndef helper")[0] + "\n"}
    tree = synthetic_tree(tmp_path, files)
    assert (upward_imports(tree, ["low", "high", "api"]), layer_cycles(tree)) == ([], [])
    assert upward_imports(tree, ["low", "high"]) == [
        "api is in no declared layer (pkg.api imports pkg.core.high.b): add it to the declared order"]


def test_the_architecture_layer_table_is_the_declared_order_with_the_torch_each_layer_imports() -> None:
    rows = layer_table(ARCHITECTURE.read_text())
    assert [layer for layers, _ in rows for layer in layers] == CORE_LAYERS
    use = torch_use(REPO_TREE)
    assert {layer: torch for layers, torch in rows for layer in layers} == {layer: use[layer] for layer in CORE_LAYERS}


# ``core/run``'s rooms, bottom first; "" is the run itself (``core/run/*.py``: the spec, assembly, the
# loop), which may use every room. A room imports its own modules and those of the rooms below it, so
# each can be read, and moved, without the loop.
RUN = "lerobot_kit.core.run"
RUN_ROOMS = ["output", "resume", "publishing", "reporting", "reliability", ""]


def run_room_of(module: str) -> str:
    """The room of a module of ``core/run``: its subpackage, or "" for the run's own modules."""
    first = module[len(RUN) + 1:].split(".")[0] if module != RUN else ""
    return first if first in RUN_ROOMS else ""


def test_every_room_of_the_run_is_declared() -> None:
    on_disk = {p.name for p in (REPO / "core" / "run").iterdir() if (p / "__init__.py").is_file()}
    assert on_disk | {""} == set(RUN_ROOMS)


def test_the_rooms_of_the_run_import_only_rooms_below_them() -> None:
    modules = [m for m in sorted(REPO_TREE.modules) if m == RUN or m.startswith(RUN + ".")]
    upward = [f"{module} imports {imported}" for module in modules for imported in sorted(REPO_TREE.imports_of(module))
              if imported.startswith(RUN + ".")
              and RUN_ROOMS.index(run_room_of(imported)) > RUN_ROOMS.index(run_room_of(module))]
    assert upward == []


def room_table(markdown: str) -> list[tuple[str, int]]:
    """The rows of the table under ``## The rooms of a run``: each room as ``RUN_ROOMS`` names it, its file count."""
    section = markdown.split("\n## The rooms of a run\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|") for line in section.splitlines() if line.startswith("| `")]
    return [(_room_named(re.findall(r"`([^`]+)`", cells[1])[0]), int(cells[3])) for cells in rows]


def _room_named(cell: str) -> str:
    """``output/`` is the room ``output``; ``core/run/*.py``, the run's own modules, is ``""``."""
    return "" if cell == "core/run/*.py" else cell.removesuffix("/")


def run_room_files(room: str) -> list[Path]:
    """The modules of a room (``__init__.py`` aside), or the run's own modules for ``""``."""
    return [p for p in (REPO / "core" / "run" / room).glob("*.py") if p.name != "__init__.py"]


def test_the_architecture_room_table_is_the_declared_order_with_each_rooms_file_count() -> None:
    """A module moved between rooms, or added to one, shows in the doc's count."""
    assert room_table(ARCHITECTURE.read_text()) == [(room, len(run_room_files(room))) for room in RUN_ROOMS]
