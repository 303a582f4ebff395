"""``lerobot eval``'s work: load a checkpoint as ``load_pretrained`` does, evaluate it in one process.

Every checkpoint ``load_pretrained`` reads evaluates: gathered weights, PEFT adapters
(merged into their base), plugin policies; a DCP-only one stops with the ``convert-dcp``
command that makes it loadable.

The output folder appears whole or not at all (``core.eval.output``): everything is
written into a hidden sibling that is renamed into place once complete, and removed when
anything fails (a policy whose actions are not finite, a video that cannot be encoded, a
full disk), so a rerun with the same ``--output_dir`` is never blocked by half of a
folder, and no evaluation ever replaces another.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from lerobot_kit.core.checkpoint.pretrained import load_pretrained
from lerobot_kit.core.distributed.process_group import DistContext
from lerobot_kit.core.eval.config import EvalRunConfig, output_dir_of
from lerobot_kit.core.eval.evaluate import Evaluator
from lerobot_kit.core.eval.output import written_whole


def evaluate_checkpoint(config: EvalRunConfig) -> tuple[dict[str, Any], Path]:
    """``(eval_info, output folder)``."""
    assert config.policy.path is not None  # parse_eval_config refuses a config without it
    output_dir = output_dir_of(config)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    ctx = DistContext(rank=0, local_rank=0, world_size=1, device=device, launcher="single", backend=None)
    policy, preprocessor, postprocessor = load_pretrained(Path(config.policy.path))
    evaluator = Evaluator(config.env, config.eval, config.seed, ctx, policy.meta)
    with written_whole(output_dir) as building:
        info = evaluator.run(policy.to(device), preprocessor, postprocessor, building,
                             {"policy_path": str(Path(config.policy.path).resolve())})
    assert info is not None  # the only process is the main one
    return info, output_dir
