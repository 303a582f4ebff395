"""When the end-of-run push is attempted, and the warnings that replace a failed one."""

from __future__ import annotations

import logging
import sys

import pytest

from fake_hub import serve_fake_hub
from lerobot_kit.core.config.schema import TrainConfig
from lerobot_kit.core.run.publishing.end_of_run import publish_final


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


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """The real huggingface_hub client, in this process, talking to a local fake Hub."""
    from huggingface_hub import constants

    with serve_fake_hub() as fake:
        monkeypatch.setattr(constants, "ENDPOINT", fake.endpoint)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setenv("HF_TOKEN", "hf_test_token")
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
        yield fake


@pytest.fixture
def final_step(tmp_path):
    """A final checkpoint folder with a small ``pretrained_model/``."""
    pretrained = tmp_path / "000004" / "pretrained_model"
    pretrained.mkdir(parents=True)
    (pretrained / "config.json").write_text('{"type": "act"}')
    return pretrained.parent


@pytest.mark.parametrize(
    "policy, rank, pushed",
    [({"repo_id": "user/tiny"}, 0, True), ({"repo_id": "user/tiny"}, 1, False),
     ({"repo_id": "user/tiny", "push_to_hub": False}, 0, False), ({}, 0, False)],
    ids=["main-process", "other-rank", "push-disabled", "no-repo-id"],
)
def test_only_the_main_process_pushes_and_only_when_asked(hub, final_step, log_lines, policy, rank, pushed):
    publish_final(TrainConfig(policy=policy), final_step, _ctx(rank))
    if pushed:
        assert hub.uploaded("user/tiny") == {"config.json": b'{"type": "act"}'}
        assert len(log_lines) == 1 and log_lines[0].startswith(f"pushed {final_step / 'pretrained_model'} to the Hub")
    else:
        assert hub.requests == [] and log_lines == []


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
