"""Everything a running training job holds, passed as one object.

The trainer loop and the checkpoint code both need the same dozen pieces; bundling
them keeps signatures short without giving either module knowledge of the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from lerobot_kit.core.checkpoint.weights import ModelWeights
from lerobot_kit.core.config.schema import TrainConfig
from lerobot_kit.core.data.dataset import DatasetMeta
from lerobot_kit.core.distributed.process_group import DistContext
from lerobot_kit.core.parallel.parallelized import Parallelized
from lerobot_kit.core.model.peft import model_weights
from lerobot_kit.core.model.processor import PolicyProcessor
from lerobot_kit.core.parallel.dims import ParallelDims
from lerobot_kit.core.run.spec import RunSpec


@dataclass
class RunComponents:
    spec: RunSpec
    ctx: DistContext
    parallel: Parallelized
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: Any | None
    preprocessor: PolicyProcessor
    postprocessor: PolicyProcessor
    meta: DatasetMeta

    @property
    def config(self) -> TrainConfig:
        return self.spec.config

    @property
    def dims(self) -> ParallelDims:
        return self.spec.dims

    @property
    def output_dir(self) -> Path:
        return self.spec.output_dir

    @cached_property
    def weights(self) -> ModelWeights:
        """The model with the naming its weights are stored under, chosen once for the run."""
        return model_weights(self.parallel.model)
