"""Tracking in one process: the trackio extra is optional and named when missing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from lerobot_kit.core.config.schema import TrainConfig
from lerobot_kit.core.distributed.process_group import DistContext
from lerobot_kit.core.errors import ConfigError
from lerobot_kit.core.parallel.dims import ParallelDims
from lerobot_kit.core.run.reporting.tracking import NullTracker, make_tracker
from lerobot_kit.core.run.spec import RunSpec


def _single_process(config: TrainConfig, output_dir: Path) -> tuple[RunSpec, DistContext]:
    return RunSpec(config, ParallelDims(1, 1, 1), output_dir, None, None), DistContext(
        0, 0, 1, torch.device("cpu"), "single", None
    )


def test_missing_trackio_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "trackio", None)  # as if the [trackio] extra were not installed
    with pytest.raises(ConfigError, match=r"pip install 'lerobot-kit\[trackio\]'"):
        make_tracker(*_single_process(TrainConfig(trackio={"enable": True}), tmp_path))
    assert isinstance(make_tracker(*_single_process(TrainConfig(), tmp_path)), NullTracker)
