"""LeRobot's processor pipelines behind lerobot-kit's processor interface.

lerobot-kit calls a run's preprocessor on every batch and saves both processors into
each checkpoint's ``pretrained_model/`` under the names ``policy_preprocessor`` and
``policy_postprocessor`` — LeRobot's own default names. Saving through the pipeline's
``save_pretrained`` therefore writes exactly the files LeRobot's
``make_pre_post_processors(config, pretrained_path=...)`` loads.

LeRobot's pipelines keep only the batch keys LeRobot knows; the epoch lerobot-kit's
training loader adds to a batch is carried past them, for the per-sample draws
(``flow_noise``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lerobot.processor import PolicyProcessorPipeline

from lerobot_kit.api import EPOCH_KEY, PolicyProcessor


class LerobotProcessor(PolicyProcessor):
    """A ``PolicyProcessorPipeline`` (LeRobot's) as a ``PolicyProcessor`` (lerobot-kit's).

    The postprocessor, like LeRobot's, maps an action tensor, not a batch.
    """

    def __init__(self, pipeline: PolicyProcessorPipeline) -> None:
        super().__init__([])
        self.pipeline = pipeline

    def __call__(self, batch: Any) -> Any:
        processed = self.pipeline(batch)
        if isinstance(batch, dict) and EPOCH_KEY in batch and isinstance(processed, dict):
            processed[EPOCH_KEY] = batch[EPOCH_KEY]
        return processed

    def save(self, directory: Path, name: str) -> None:
        self.pipeline.save_pretrained(Path(directory), config_filename=f"{name}.json")
