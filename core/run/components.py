"""Everything a running training job holds, passed as one object.

The trainer loop and the run's assembly need the same dozen pieces; bundling them keeps
signatures short. The checkpoint code gets only what it saves (``checkpoint_state``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from lerobot_kit.core.checkpoint.state import CheckpointState, PretrainedFiles, RunFacts
from lerobot_kit.core.checkpoint.stores import run_training_state
from lerobot_kit.core.checkpoint.training_state import DataCursor
from lerobot_kit.core.config.schema import TrainConfig
from lerobot_kit.core.data.dataset import DatasetMeta
from lerobot_kit.core.distributed.process_group import DistContext
from lerobot_kit.core.model.naming import ModelWeights
from lerobot_kit.core.model.peft import model_weights
from lerobot_kit.core.model.processor import PolicyProcessor
from lerobot_kit.core.parallel.dims import ParallelDims
from lerobot_kit.core.parallel.parallel_model import Parallelized
from lerobot_kit.core.run.optim import ScheduleState
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
    cursor: DataCursor = field(default_factory=DataCursor)  # where the data order stands; the trainer moves it

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

    @cached_property
    def checkpoint_state(self) -> CheckpointState:
        """What this run's checkpoints save and a resume restores, as named pieces."""
        config = self.config
        training = run_training_state(self.weights, self.optimizer, ScheduleState(self.scheduler), self.scaler,
                                      self.cursor)
        facts = RunFacts(
            checkpoint_format=config.checkpoint_format,
            topology=self.dims.topology,
            batch_size=config.batch_size,
            gradient_accumulation_steps=config.accelerator.gradient_accumulation.steps,
            mixed_precision=config.accelerator.mixed_precision,
            peft=self.spec.use_peft,
        )
        pretrained = PretrainedFiles(self.meta, self.preprocessor, self.postprocessor, self.spec.recorded_config())
        return CheckpointState(self.ctx, self.output_dir, training, pretrained, facts)
