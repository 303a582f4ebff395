"""Evaluation during training: a step hook the trainer calls after every step.

At each ``--eval_freq`` step (and the last) every rank evaluates its share of the
episodes on a plain copy of the policy built from the *gathered* weights, the very
weights ``model.safetensors`` of that step holds. Sharded forward passes would need
every rank to call the model the same number of times, and episodes end at different
steps on different ranks; a gathered copy lets each rank run its episodes alone, and
its numbers equal ``lerobot eval`` on the checkpoint of that step. The cost is one full
fp32 copy of the model per rank while evaluating.

Training is not disturbed: the copy is new (the trained model's mode, action queues
and parameters are never touched), and the torch RNG is forked around everything that
draws from it (building the copy seeds it; a diffusion policy samples noise), so a run
with evaluation trains bit-identically to one without and resumes exactly.

Each evaluation is written into a hidden folder and renamed to ``eval/<step>/`` once
whole (``core.eval.output``); when that folder holds an earlier evaluation of the step
(made before the run was interrupted and resumed from an earlier checkpoint), the new
one becomes ``eval/<step>.2/`` and a warning names both: no evaluation replaces another.
"""

from __future__ import annotations

import logging
import shutil

import torch

from lerobot_kit.core.distributed.process_group import broadcast_object
from lerobot_kit.core.eval.evaluate import Evaluator
from lerobot_kit.core.eval.metrics import metrics_row, summary
from lerobot_kit.core.eval.output import building_folder, new_token, publish_step_eval, step_eval_folder
from lerobot_kit.core.model.peft import is_peft_model
from lerobot_kit.core.model.policy import Policy
from lerobot_kit.core.run.assemble import build_model
from lerobot_kit.core.run.components import RunComponents

logger = logging.getLogger("lerobot_kit")


class TrainingEvaluation:
    """``hook(step)``: evaluates at the configured steps; returns one metrics row per evaluation,
    which the trainer logs beside its own rows (main process; None elsewhere)."""

    def __init__(self, run: RunComponents) -> None:
        config = run.config
        self.run = run
        # Built at start-up, so an environment that does not fit stops the run before step 1.
        self.evaluator = Evaluator(config.env, config.eval, config.seed, run.ctx, run.meta)

    def __call__(self, step: int) -> dict[str, float] | None:
        config = self.run.config
        if step % config.eval_freq and step != config.steps:
            return None
        run, wanted = self.run, step_eval_folder(self.run.output_dir, step)
        # Every rank writes its videos into one hidden folder, named by the main process.
        building = building_folder(wanted, broadcast_object(run.ctx, new_token() if run.ctx.is_main else None))
        try:
            info = self.evaluator.run(self._policy_copy(), run.preprocessor, run.postprocessor, building,
                                      {"step": step})
            if info is None:
                return None
            output_dir = publish_step_eval(building, run.output_dir, step)  # all ranks' videos are written
        finally:
            if run.ctx.is_main:
                shutil.rmtree(building, ignore_errors=True)  # gone already when it was published
        if output_dir != wanted:
            logger.warning(f"eval step {step}: {wanted} holds an earlier evaluation of this step (from before the "
                           f"run resumed); this one is {output_dir}, and nothing was overwritten")
        logger.info(f"eval step {step} | {summary(info)} | {output_dir}")
        return metrics_row(info, step)

    def _policy_copy(self) -> Policy:
        """Collective when sharded: the trained policy, unsharded, unwrapped, with PEFT adapters merged."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        run = self.run
        model = run.parallel.model
        if run.dims.sharded:
            state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
        else:
            state = model.state_dict()
        devices = [run.ctx.device] if run.ctx.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            copy = build_model(run.spec, run.meta, torch.device("meta")).model
        copy.to_empty(device=run.ctx.device)
        copy.load_state_dict(state, strict=True)
        del state
        policy = copy.merge_and_unload() if is_peft_model(copy) else copy
        assert isinstance(policy, Policy)
        return policy


def evaluation_hooks(run: RunComponents) -> list[TrainingEvaluation]:
    """The trainer's step hooks: one evaluation when ``--eval_freq`` is set, else none."""
    return [TrainingEvaluation(run)] if run.config.eval_freq else []
