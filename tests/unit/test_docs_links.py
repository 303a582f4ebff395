"""Every relative link in the README, docs/ and the package READMEs resolves, and every
repository path the docs name in code exists: pages move and code moves, links rot silently."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "benchmarks" / "README.md"]
PACKAGE_READMES = sorted((REPO / "contrib").glob("*/README.md"))
FENCE = re.compile(r"^[ \t]*```.*?^[ \t]*```", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.MULTILINE)
TOP_LEVEL = ("api", "benchmarks", "cli", "contrib", "core", "docs", "plugins", "tests", ".ci")
REPO_PATH = re.compile(r"^(?:%s)/[\w./-]*$" % "|".join(re.escape(t) for t in TOP_LEVEL))


def prose(text: str) -> str:
    """The text outside fenced code blocks and code spans."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    result = set()
    for match in HEADING.finditer(FENCE.sub("", page.read_text())):
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return result


def broken_links(page: Path) -> list[str]:
    problems = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        path_part, _, fragment = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        if not resolved.exists():
            problems.append(f"{target}: no such file")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            problems.append(f"{target}: no heading with that anchor")
    return problems


def named_paths(page: Path) -> list[str]:
    """Repository paths in code spans and shell code blocks, e.g. `benchmarks/run.py`."""
    text = page.read_text()
    words = [span for _, span in CODE_SPAN.findall(FENCE.sub("", text))]
    for block in re.findall(r"^[ \t]*```(?:bash|sh|shell)\n(.*?)^[ \t]*```", text, re.MULTILINE | re.DOTALL):
        words += block.split()
    return [w for w in words if REPO_PATH.match(w) and "<" not in w]


@pytest.mark.parametrize("page", PAGES + PACKAGE_READMES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page: Path) -> None:
    assert broken_links(page) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_named_repository_paths_exist(page: Path) -> None:
    missing = [p for p in named_paths(page) if not (REPO / p).exists()]
    assert missing == []


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other page\n\n## Restarts and `--resume`\n\n## Other page\n")
    page.write_text(
        "[ok](other.md#restarts-and---resume) [gone](missing.md) [bad anchor](other.md#nothing)\n"
        "[second heading of that name](other.md#other-page-1) [self](#nowhere)\n"
        "`[not a link](missing.md)` [web](https://example.org/x)\n\n```bash\n[code](missing2.md)\n```\n"
    )
    assert broken_links(page) == [
        "missing.md: no such file", "other.md#nothing: no heading with that anchor",
        "#nowhere: no heading with that anchor",
    ]
    assert slug("On one GPU (NVIDIA H200)") == "on-one-gpu-nvidia-h200"
