"""The README stays short and starts with what a newcomer needs; the reference lives in docs/."""

from __future__ import annotations

import re

from conftest import REPO

README = (REPO / "README.md").read_text()
TEST_COMMAND = (
    "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && "
    "pip install -e '.[test]' && python -m pytest -q"
)
PAGES = sorted((REPO / "docs").glob("*.md"))


def bash_blocks(text: str) -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


def test_the_readme_is_short() -> None:
    assert len(README.splitlines()) <= 300


def test_it_starts_by_saying_what_the_project_is_and_for_whom() -> None:
    title, first_paragraph = README.split("\n\n")[:2]
    assert title == "# lerobot-kit"
    for words in ("trains robot-learning policies", "LeRobot's `lerobot-train`", "CI pipelines"):
        assert words in first_paragraph


def test_then_the_two_commands_that_work_on_a_fresh_machine() -> None:
    """The first block installs and trains on the embedded data (benchmarks/eval_success.py
    runs it as written); the test command is the one CI runs."""
    blocks = bash_blocks(README)
    assert README.index("```bash") < README.index("\n## ")
    train = blocks[0].strip()
    assert train.startswith("python3 -m venv .venv && ") and "pip install torch==2.13.0" in train
    assert " && lerobot train " in train and "--dataset" not in train  # the default, embedded data
    assert TEST_COMMAND in [b.strip() for b in blocks]
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(r"^pip install (-q )?torch==2\.13\.0$", ci, re.MULTILINE)
    assert re.search(r"^pip install (-q )?-e '\.\[test\]'$", ci, re.MULTILINE)
    assert re.search(r"^python -m pytest -q\b", ci, re.MULTILINE)


def test_the_reference_is_in_docs_with_an_index() -> None:
    assert len(PAGES) >= 5
    index = (REPO / "docs" / "index.md").read_text()
    listed = set(re.findall(r"\]\(([\w-]+\.md)\)", index))
    assert listed == {p.name for p in PAGES} - {"index.md"}
    assert "(docs/index.md)" in README


def test_architecture_has_a_layers_section() -> None:
    assert re.search(r"^## Layers$", (REPO / "docs" / "architecture.md").read_text(), re.MULTILINE)
