"""The pieces behind what commands say about a checkpoint they cannot read, in process:
opening only regular files, the advice for a damaged step folder, and evaluation folders
that never replace one another."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lerobot_kit.core.errors import ConfigError
from lerobot_kit.core.eval.output import publish_step_eval, refuse_inside_run
from lerobot_kit.core.layout import paths as L
from lerobot_kit.core.layout.file_access import NotAFileError, open_checkpoint_file
from lerobot_kit.core.layout.files import resume_advice
from lerobot_kit.core.layout.json_file import read_json
from lerobot_kit.core.layout.regular_file import NotRegularFile, open_regular


def test_a_named_pipe_or_a_device_is_refused_without_blocking(tmp_path: Path) -> None:
    pipe = tmp_path / "config.json"
    os.mkfifo(pipe)  # no writer: a plain open would wait forever
    with pytest.raises(NotRegularFile) as raised:
        open_regular(pipe)
    assert raised.value.kind == "a named pipe"
    with pytest.raises(NotAFileError, match=r"^pretrained_model/config.json: a named pipe, not a file$"):
        read_json(pipe, label="pretrained_model/config.json")
    with pytest.raises(NotAFileError, match=r": a character device, not a file$"):
        open_checkpoint_file(Path("/dev/zero"))
    with pytest.raises(NotAFileError, match=r": a folder, not a file$"):
        open_checkpoint_file(tmp_path)


def _run(tmp_path: Path, *steps: int) -> Path:
    run = tmp_path / "run"
    for step in steps:
        for sub in (L.PRETRAINED_DIR, L.TRAINING_STATE_DIR):
            (run / L.CHECKPOINTS_DIR / L.step_dir_name(step) / sub).mkdir(parents=True)
    return run


def test_the_advice_for_a_damaged_step_names_the_step_to_resume_and_what_it_deletes(tmp_path: Path) -> None:
    run = _run(tmp_path, 2, 4, 6, 8)
    step = run / L.CHECKPOINTS_DIR
    assert resume_advice(step / "000008") == (
        "resume from step 6, the newest step folder before it, with --resume=true --resume_from=6, which deletes "
        "the step folders after it (000008)")
    assert resume_advice(step / "000004").endswith("--resume_from=2, which deletes the step folders after it "
                                                   "(000004, 000006, 000008)")
    assert resume_advice(step / "000002") == (
        f"{run} has no earlier step folder to resume from: start a new run in another --output_dir")


def test_an_evaluation_of_a_step_takes_the_next_free_name(tmp_path: Path) -> None:
    first = tmp_path / "eval" / "000008"
    first.mkdir(parents=True)
    (first / "eval_info.json").write_text("earlier")
    published = []
    for _ in range(2):
        building = tmp_path / "eval" / ".building"
        building.mkdir()
        (building / "eval_info.json").write_text("new")
        published.append(publish_step_eval(building, tmp_path, 8).name)
    assert published == ["000008.2", "000008.3"] and (first / "eval_info.json").read_text() == "earlier"


def test_an_eval_output_inside_a_training_run_is_refused(tmp_path: Path) -> None:
    run = _run(tmp_path, 2)
    with pytest.raises(ConfigError, match=f"inside the training run folder {run}, "):
        refuse_inside_run(run / "eval" / "000008")
    (tmp_path / "elsewhere").symlink_to(run)
    with pytest.raises(ConfigError):  # through a link too
        refuse_inside_run(tmp_path / "elsewhere" / "my_eval")
    refuse_inside_run(tmp_path / "evals" / "000008")  # beside the run: fine


def test_a_folder_named_checkpoints_alone_is_no_training_run(tmp_path: Path) -> None:
    (tmp_path / L.CHECKPOINTS_DIR / "notes").mkdir(parents=True)  # a user's own folder of that name
    refuse_inside_run(tmp_path / "evals" / "000008")
