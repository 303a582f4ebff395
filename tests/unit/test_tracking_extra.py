"""Tracking in one process: the trackio extra is optional and named when missing."""

from __future__ import annotations

import sys

import pytest

from lerobot_kit.core.config.schema import TrainConfig
from lerobot_kit.core.errors import ConfigError
from lerobot_kit.core.run.tracking import NullTracker, make_tracker


def _single_process_ctx():
    import torch

    from lerobot_kit.core.distributed.process_group import DistContext

    return DistContext(0, 0, 1, torch.device("cpu"), "single", None)


def test_missing_trackio_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "trackio", None)  # as if the [trackio] extra were not installed
    config = TrainConfig(trackio={"enable": True})
    with pytest.raises(ConfigError, match=r"pip install 'lerobot-kit\[trackio\]'"):
        make_tracker(config, _single_process_ctx(), tmp_path)
    assert isinstance(make_tracker(TrainConfig(), _single_process_ctx(), tmp_path), NullTracker)
