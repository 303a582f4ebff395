"""``inspect-checkpoint``'s verdicts follow the layout table's rows and flags, not file names of its own.

A piece registered with a file of the pretrained folder blocks loading only when its row
says loading reads it (``for_loading``); a row marked ``essential`` is required when no
record says what the checkpoint holds; and without a record, how the weights and the
optimizer were stored (and whether they are an adapter) is read off the files the table
lists for each kind.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from checkpoint_files import write_checkpoint

from lerobot_kit.core.layout import paths as L
from lerobot_kit.core.layout import state_pieces
from lerobot_kit.core.layout.layout_file import ALWAYS, LayoutFile
from lerobot_kit.core.layout.state_pieces import StatePiece, register_state_piece
from lerobot_kit.core.offline.inspect import inspect_checkpoint

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

NOTES = f"{L.PRETRAINED_DIR}/notes.json"


@pytest.fixture
def table(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pieces registered by a test leave the table when it ends."""
    monkeypatch.setattr(state_pieces, "_PIECES", dict(state_pieces._PIECES))


@pytest.mark.parametrize("for_loading", [False, True])
def test_a_missing_file_blocks_loading_only_where_its_row_says_loading_reads_it(
    tmp_path: Path, table: None, for_loading: bool
) -> None:
    register_state_piece(StatePiece("notes", (LayoutFile(NOTES, for_loading=for_loading),)))
    report = inspect_checkpoint(write_checkpoint(tmp_path))
    assert report.problems == [f"{NOTES}: missing ({ALWAYS})"]
    assert report.resumable.ok is False
    assert report.loadable.ok is (not for_loading), report.loadable.why


def test_an_essential_row_is_required_where_no_record_says_what_the_checkpoint_holds(
    tmp_path: Path, table: None
) -> None:
    register_state_piece(StatePiece("notes", (LayoutFile(NOTES, essential=True),)))
    step_dir = write_checkpoint(tmp_path, checksums=False)
    (step_dir / L.TRAINING_STATE_DIR / L.TRAINING_STEP).unlink()
    problems = inspect_checkpoint(step_dir).problems
    assert problems == [f"{L.TRAINING_STATE_DIR}/{L.TRAINING_STEP}: missing ({ALWAYS})", f"{NOTES}: missing ({ALWAYS})"]


@pytest.mark.parametrize(
    ("options", "weights", "optimizer", "peft"),
    [
        ({}, "gathered", "safetensors", False),
        ({"peft": True}, "gathered", "safetensors", True),
        ({"weights": "dcp", "optimizer": "dcp", "dp_shard": 2}, "dcp", "dcp", False),
        ({"weights": "gathered+dcp", "optimizer": "dcp", "dp_shard": 2}, "gathered+dcp", "dcp", False),
    ],
)
def test_without_a_record_the_kinds_are_read_off_the_tables_files(
    tmp_path: Path, options: dict[str, object], weights: str, optimizer: str, peft: bool
) -> None:
    step_dir = write_checkpoint(tmp_path, checksums=False, **options)
    (step_dir / L.TRAINING_STATE_DIR / L.TRAINING_STEP).unlink()
    report = inspect_checkpoint(step_dir)
    assert (report.weights, report.optimizer, report.peft) == (weights, optimizer, peft)
    assert ("PEFT adapter" in report.loadable.why) is peft
