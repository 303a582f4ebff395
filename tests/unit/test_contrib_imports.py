"""Contrib plugins use lerobot-kit only through ``lerobot_kit.api``, the surface promised to stay.

Anything else (``lerobot_kit.core...``) is internal and moves between releases; a contrib
package that reaches into it would break on the next reorganisation, and would teach
plugin authors to do the same.
"""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

API = "lerobot_kit.api"


def internal_imports(source: str) -> list[str]:
    """Every import of a ``lerobot_kit`` module other than the API, as ``line: module``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from lerobot_kit import api` imports the API; `from lerobot_kit import core` does not.
            is_package = node.module == "lerobot_kit"
            modules = [f"{node.module}.{alias.name}" for alias in node.names] if is_package else [node.module]
        else:
            continue
        for module in modules:
            in_kit = module == "lerobot_kit" or module.startswith("lerobot_kit.")
            if in_kit and module != API and not module.startswith(API + "."):
                found.append(f"{node.lineno}: {module}")
    return found


def test_the_checker_flags_every_form_of_internal_import() -> None:
    source = (
        "import lerobot_kit\nimport lerobot_kit.core.errors\nfrom lerobot_kit.core import errors\n"
        "from lerobot_kit import core\nimport lerobot_kit_mlp.modeling\nfrom lerobot_kit import api\n"
        "from lerobot_kit.api import Policy\nimport lerobot_kit.api as kit\n"
        "def f():\n    from lerobot_kit.core.model.policy import Policy\n"
    )
    assert internal_imports(source) == [
        "1: lerobot_kit", "2: lerobot_kit.core.errors", "3: lerobot_kit.core", "4: lerobot_kit.core",
        "10: lerobot_kit.core.model.policy",
    ]


def test_contrib_imports_lerobot_kit_only_through_the_api() -> None:
    sources = sorted((REPO / "contrib").rglob("*.py"))
    assert len(sources) >= 5, sources  # the example plugin's modules are found
    problems = {
        str(path.relative_to(REPO)): found
        for path in sources
        if (found := internal_imports(path.read_text()))
    }
    assert not problems, f"import these names from {API} instead (add them there if missing): {problems}"
    uses_api = [path for path in sources if f"from {API} import" in path.read_text()]
    assert len(uses_api) >= 5, uses_api
