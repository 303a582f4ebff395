"""Code, comments and docs stand alone: none cites a design or requirements document
that is not in the repository (a rule worth keeping belongs in the docs instead)."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import REPO

CITATION = re.compile(r"\b" + "SPEC" + r"\b(?!_)|" + "DESIGN" + r"\.md|\(S\d+\.\d+\)")
SCANNED = ("core", "plugins", "cli", "api", "contrib", "benchmarks", "tests", "docs")


def _sources() -> list[Path]:
    files = [REPO / "README.md"]
    for top in SCANNED:
        files += [p for p in (REPO / top).rglob("*") if p.suffix in (".py", ".md", ".toml", ".sh", ".json")]
    own = Path(__file__).resolve()
    return [p for p in files if ".venv" not in p.parts and "build" not in p.parts and p.resolve() != own]


def test_no_citation_of_documents_outside_the_repository():
    hits = []
    for path in _sources():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if CITATION.search(line):
                hits.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not hits, "\n".join(hits)


def test_the_pattern_catches_citations():
    for cited in ("see " + "SPEC" + " S2.3", "as " + "DESIGN" + ".md says", "steps once (S2.5)"):
        assert CITATION.search(cited)
    assert not CITATION.search("worker OUTDIR SPEC_JSON")
