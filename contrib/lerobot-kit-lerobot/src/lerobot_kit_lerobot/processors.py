"""LeRobot's processor pipelines behind lerobot-kit's processor interface.

lerobot-kit calls a run's preprocessor on every batch and saves both processors into
each checkpoint's ``pretrained_model/`` under the names ``policy_preprocessor`` and
``policy_postprocessor`` — LeRobot's own default names. Saving through the pipeline's
``save_pretrained`` therefore writes exactly the files LeRobot's
``make_pre_post_processors(config, pretrained_path=...)`` loads.

LeRobot's pipelines keep only the batch keys LeRobot knows; the epoch lerobot-kit's
training loader adds to a batch is carried past them, for the per-sample draws
(``flow_noise``). A language-conditioned policy's preprocessor refuses a batch without
task text in one line (LeRobot's tokenizer step would fail with a bare ``ValueError``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lerobot.processor import PolicyProcessorPipeline

from lerobot_kit.api import EPOCH_KEY, ConfigError, PolicyProcessor

TASK_KEY = "task"


class LerobotProcessor(PolicyProcessor):
    """A ``PolicyProcessorPipeline`` (LeRobot's) as a ``PolicyProcessor`` (lerobot-kit's).

    The postprocessor, like LeRobot's, maps an action tensor, not a batch.
    ``task_needed_by`` names the policy whose pipeline tokenizes each frame's task text.
    """

    def __init__(self, pipeline: PolicyProcessorPipeline, task_needed_by: str | None = None) -> None:
        super().__init__([])
        self.pipeline = pipeline
        self.task_needed_by = task_needed_by

    def __call__(self, batch: Any) -> Any:
        if self.task_needed_by and isinstance(batch, dict) and TASK_KEY not in batch:
            raise ConfigError(
                f"{self.task_needed_by} tokenizes each frame's task text, and the dataset gives none (no "
                "meta/tasks.parquet, or frames without a task_index): give it its tasks as LeRobot records them"
            )
        processed = self.pipeline(batch)
        if isinstance(batch, dict) and EPOCH_KEY in batch and isinstance(processed, dict):
            processed[EPOCH_KEY] = batch[EPOCH_KEY]
        return processed

    def save(self, directory: Path, name: str) -> None:
        self.pipeline.save_pretrained(Path(directory), config_filename=f"{name}.json")
