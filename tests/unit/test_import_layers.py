"""The package's layers, declared once and held: every import points down, never up.

``lerobot_kit.core`` is a stack of subpackages (``CORE_LAYERS``, bottom first); a module
may import its own subpackage and those below it, never one above. So the layers can be
drawn, read bottom-up, and changed one at a time: the checkpoint code does not know the
run, the model does not know the checkpoint code, and a cycle cannot form. Above core sit
the API (the plugin surface), the built-in plugins (which use the API only, as a third
party must) and the CLI.

Module-level imports are held strictly. Imports inside functions run later and can still
tie modules together, so they point down too, with the exceptions listed in
``UPWARD_AT_CALL_TIME`` (each one names why it must look up).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from conftest import REPO

PACKAGES = {"core": "lerobot_kit.core", "plugins": "lerobot_kit.plugins", "cli": "lerobot_kit.cli",
            "api": "lerobot_kit.api"}

# Bottom first. ``errors`` and ``version`` are single modules under everything.
CORE_LAYERS = ["errors", "version", "layout", "config", "registry", "distributed", "data", "parallel", "model",
               "checkpoint", "offline", "eval", "run", "plan"]
# Above core, bottom first: the API re-exports core; plugins build on the API; the CLI drives all.
TOP_LAYERS = ["api", "plugins", "cli"]

# (importing layer, imported layer): looked up when a function runs, never at import time.
UPWARD_AT_CALL_TIME = {
    # The flag parser asks the registry for the config class a plugin registered under --policy.type.
    ("config", "registry"),
    # The checkpoint check validates config.json as --policy.path does: by its policy type's config class.
    ("layout", "config"),
    # The registry checks a plugin's target against its contract (Policy, PolicyDataset, Launcher,
    # CheckpointFormat, VectorEnv) when the target is first used; importing the contract then keeps
    # the registry, and so `lerobot --help`, free of torch.
    ("registry", "distributed"), ("registry", "data"), ("registry", "model"), ("registry", "checkpoint"),
    ("registry", "eval"),
}


def _modules() -> dict[str, Path]:
    found = {}
    for folder, package in PACKAGES.items():
        for file in (REPO / folder).rglob("*.py"):
            parts = [p for p in file.relative_to(REPO / folder).with_suffix("").parts if p != "__init__"]
            found[".".join([package, *parts])] = file
    return found


MODULES = {name: file for name, file in _modules().items() if name != "lerobot_kit.core"}  # core/__init__ is empty


def layer_of(module: str) -> str:
    """``core.<layer>`` modules by their layer; the API, plugins and CLI by their top package."""
    parts = module.split(".")
    if parts[1] == "core":
        return parts[2]
    return parts[1]


def rank_of(layer: str) -> int:
    order = CORE_LAYERS + TOP_LAYERS
    assert layer in order, f"{layer} is in no declared layer: add it to CORE_LAYERS"
    return order.index(layer)


def _statements(body: list[ast.stmt], top_level_only: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from _statements(node.orelse, top_level_only)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and top_level_only:
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


def upward_imports(top_level_only: bool) -> list[str]:
    found = []
    for module in sorted(MODULES):
        mine = layer_of(module)
        for imported in sorted(imports_of(module, top_level_only)):
            theirs = layer_of(imported)
            if theirs != mine and rank_of(theirs) > rank_of(mine):
                found.append(f"{module} ({mine}) imports {imported} ({theirs})")
    return found


def test_every_core_subpackage_is_declared() -> None:
    on_disk = {p.name for p in (REPO / "core").iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    on_disk |= {p.stem for p in (REPO / "core").glob("*.py") if p.stem != "__init__"}
    assert on_disk == set(CORE_LAYERS)


def test_the_checker_sees_upward_imports() -> None:
    assert rank_of("checkpoint") > rank_of("model") > rank_of("layout")
    assert "lerobot_kit.core.registry.registry" in imports_of("lerobot_kit.core.model.policy")  # inside make_policy
    assert "lerobot_kit.core.registry.registry" not in imports_of("lerobot_kit.core.model.policy", top_level_only=True)
    assert "lerobot_kit.core.checkpoint.weights" not in imports_of("lerobot_kit.core.registry.registry")  # TYPE_CHECKING


def test_module_level_imports_point_down() -> None:
    assert upward_imports(top_level_only=True) == []


def test_call_time_imports_point_down_but_for_the_listed_lookups() -> None:
    unlisted = [line for line in upward_imports(top_level_only=False)
                if (line.split("(")[1].split(")")[0], line.rsplit("(", 1)[1].rstrip(")")) not in UPWARD_AT_CALL_TIME]
    assert unlisted == []


def test_every_listed_lookup_is_still_needed() -> None:
    seen = {(line.split("(")[1].split(")")[0], line.rsplit("(", 1)[1].rstrip(")"))
            for line in upward_imports(top_level_only=False)}
    assert UPWARD_AT_CALL_TIME <= seen, sorted(UPWARD_AT_CALL_TIME - seen)


def test_builtin_plugins_use_the_api_only() -> None:
    """The built-ins are plugins like any other: they prove the API is enough for one."""
    internal = [f"{module} imports {imported}" for module in sorted(MODULES) if layer_of(module) == "plugins"
                for imported in sorted(imports_of(module)) if layer_of(imported) not in ("plugins", "api")]
    assert internal == []
