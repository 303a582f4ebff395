"""LeRobot's processor pipelines behind lerobot-kit's processor interface.

lerobot-kit calls a run's preprocessor on every batch and saves both processors into
each checkpoint's ``pretrained_model/`` under the names ``policy_preprocessor`` and
``policy_postprocessor`` — LeRobot's own default names. Saving through the pipeline's
``save_pretrained`` therefore writes exactly the files LeRobot's
``make_pre_post_processors(config, pretrained_path=...)`` loads.

LeRobot's pipelines keep only the batch keys LeRobot knows. What lerobot-kit's training
loader adds and the bridge reads after the pipeline is carried past it unchanged: the
epoch, for the per-sample draws (``flow_noise``); a mixture sample's member, for the
per-member metrics; its missing cameras' flags (``missing_key``), for the camera masks
(``camera_masks``). A language-conditioned policy's preprocessor refuses a batch without
task text in one line (LeRobot's tokenizer step would fail with a bare ``ValueError``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lerobot.processor import PolicyProcessorPipeline

from lerobot_kit.api import EPOCH_KEY, MEMBER_KEY, ConfigError, PolicyProcessor, missing_key

TASK_KEY = "task"
MISSING_SUFFIX = missing_key("")


def carried_keys(batch: dict[str, Any]) -> list[str]:
    """The keys of ``batch`` that lerobot-kit's loader added and its policies read after the pipeline."""
    return [key for key in batch if key in (EPOCH_KEY, MEMBER_KEY) or key.endswith(MISSING_SUFFIX)]


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
        if isinstance(batch, dict) and isinstance(processed, dict):
            processed.update({key: batch[key] for key in carried_keys(batch)})
        return processed

    def save(self, directory: Path, name: str) -> None:
        self.pipeline.save_pretrained(Path(directory), config_filename=f"{name}.json")
