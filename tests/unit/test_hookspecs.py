"""Every plugin hook is a documented, supported extension point."""

from __future__ import annotations

import re

from conftest import REPO
from lerobot_kit.core.registry import hookspecs


def test_every_hookspec_is_documented_on_the_plugins_page():
    page = (REPO / "docs" / "plugins.md").read_text()
    specs = [name for name in dir(hookspecs) if re.fullmatch(r"lerobot_register_\w+", name)]
    assert set(specs) == set(hookspecs.HOOK_KINDS)
    for name in specs:
        assert f"`{name}" in page, f"{name} is not documented in docs/plugins.md"
