"""Plugin packages as pip leaves them on disk: a module and a ``.dist-info`` whose entry
point puts it in the ``lerobot_kit`` group. Put the folder on ``sys.path`` (or
``PYTHONPATH``) and ``importlib.metadata`` discovers it exactly as an installed package."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Any


def make_distribution(root: Path, name: str, module_source: str, entry_name: str | None = None) -> Path:
    """A minimal installed distribution ``name`` 1.2.3: ``name.py`` plus its entry point."""
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{name}.py").write_text(textwrap.dedent(module_source))
    info = root / f"{name}-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.2.3\n")
    (info / "entry_points.txt").write_text(f"[lerobot_kit]\n{entry_name or name} = {name}\n")
    return root


def env_with(*paths: Path, **extra: str) -> dict[str, str]:
    """Environment for a subprocess that sees the distributions in ``paths``."""
    pythonpath = os.pathsep.join([*map(str, paths), os.environ.get("PYTHONPATH", "")])
    return {"PYTHONPATH": pythonpath, **extra}


def fresh_registry(monkeypatch: Any) -> None:
    """Make this process discover plugins again on the next ``get_registry()`` (plugins installed
    at run time); the registry it had comes back when the test ends."""
    import importlib

    from lerobot_kit.core.registry import registry

    importlib.invalidate_caches()
    monkeypatch.setattr(registry, "_REGISTRY", None)
