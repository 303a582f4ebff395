"""When the end-of-run push is attempted, and the warnings that replace a failed one."""

from __future__ import annotations

import logging
import sys

import pytest

from lerobot_kit.core.config.schema import TrainConfig
from lerobot_kit.core.run.publish import publish_final


# ------------------------------------------------------------------ when not to push, and failures before any upload


@pytest.fixture
def log_lines():
    """Lines logged to ``lerobot_kit`` (the CLI's setup_logging may have detached it from the root logger)."""
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("lerobot_kit")
    previous = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield lines
    logger.removeHandler(handler)
    logger.setLevel(previous)


def _ctx(rank: int):
    import torch

    from lerobot_kit.core.distributed.process_group import DistContext

    return DistContext(rank, rank, 2, torch.device("cpu"), "torchrun", "gloo")


@pytest.mark.parametrize(
    "policy, rank",
    [({"repo_id": "user/tiny"}, 1), ({"repo_id": "user/tiny", "push_to_hub": False}, 0), ({}, 0)],
    ids=["other-rank", "push-disabled", "no-repo-id"],
)
def test_nothing_is_attempted_unless_asked_on_the_main_process(tmp_path, log_lines, policy, rank):
    # A missing folder: any attempt to push it would log a warning.
    publish_final(TrainConfig(policy=policy), tmp_path / "missing", _ctx(rank))
    assert log_lines == []


def test_a_run_without_final_checkpoint_says_nothing_was_pushed(log_lines):
    publish_final(TrainConfig(policy={"repo_id": "user/tiny"}), None, _ctx(0))
    assert len(log_lines) == 1 and "--policy.repo_id=user/tiny was not pushed" in log_lines[0]


def test_missing_huggingface_hub_is_a_warning_naming_the_extra(tmp_path, log_lines, monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # as if the [hub] extra were not installed
    publish_final(TrainConfig(policy={"repo_id": "user/tiny", "private": True}), tmp_path, _ctx(0))
    assert len(log_lines) == 1
    assert "pip install 'lerobot-kit[hub]'" in log_lines[0] and log_lines[0].endswith("--private")


def test_malformed_repo_id_is_a_warning(tmp_path, log_lines):
    publish_final(TrainConfig(policy={"repo_id": "no-namespace"}), tmp_path, _ctx(0))
    assert len(log_lines) == 1 and "expected a repo id of the form user/name" in log_lines[0]
