"""End-of-run publishing: the final ``pretrained_model/`` to the Hub.

Runs on the main process after training, when the final checkpoint is complete on disk.
By then the run has succeeded, so a failed upload (offline, no token, refused, no
huggingface_hub) is one warning line with the command to publish later, never an
exception: the exit code and the checkpoint are those of the training.
"""

from __future__ import annotations

import logging
import shlex
from pathlib import Path

from lerobot_kit.core.config.schema import TrainConfig
from lerobot_kit.core.distributed.process_group import DistContext
from lerobot_kit.core.layout.paths import PRETRAINED_DIR
from lerobot_kit.core.run.publishing.hub_upload import PUSH_IGNORE_PATTERNS, push_pretrained_dir

logger = logging.getLogger("lerobot_kit")


def publish_final(config: TrainConfig, final_checkpoint_dir: str | Path | None, ctx: DistContext) -> None:
    """Push ``<final_checkpoint_dir>/pretrained_model/`` to ``--policy.repo_id`` if asked to."""
    repo_id = config.policy.repo_id
    if not ctx.is_main or not repo_id or not config.policy.push_to_hub:
        return
    if final_checkpoint_dir is None:
        logger.warning(
            f"warning: --policy.repo_id={repo_id} was not pushed: this run wrote no final checkpoint "
            "(--save_checkpoint=false, or no step left to train)"
        )
        return
    pretrained = Path(final_checkpoint_dir) / PRETRAINED_DIR
    try:
        url = push_pretrained_dir(pretrained, repo_id, private=config.policy.private)
    except Exception as exc:  # the model is trained and saved: nothing here may fail the run
        logger.warning(
            f"warning: final model not pushed to the Hub: {exc}; to publish it later: "
            f"{_upload_command(pretrained, repo_id, config.policy.private)}"
        )
        return
    logger.info(f"pushed {pretrained} to the Hub: {url}")


def _upload_command(pretrained: Path, repo_id: str, private: bool) -> str:
    """The ``hf`` CLI line that uploads what ``push_pretrained_dir`` would have."""
    parts = ["hf", "upload", repo_id, str(pretrained)]
    for pattern in PUSH_IGNORE_PATTERNS:
        parts += ["--exclude", pattern]
    if private:
        parts.append("--private")
    return shlex.join(parts)
