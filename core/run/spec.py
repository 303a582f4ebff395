"""The run spec: every decision about a run taken once, before anything is built.

A validated ``TrainConfig`` says what the user asked for; the spec adds what follows
from it and from the launched processes — the parallel degrees, the output folder and
the checkpoint to resume from, the PEFT base, the checkpoint format — and checks every
rule that spans several fields. ``lerobot train`` and ``lerobot plan`` both start from
``resolve_run``, so a plan refuses exactly what the run would refuse, and nothing after
this point changes the config: what differs from the flags (the chosen output folder,
the absolute PEFT base) lives in the spec, and ``recorded_config`` folds it back into
the config a checkpoint records.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lerobot_kit.core.config.schema import TrainConfig
from lerobot_kit.core.errors import ConfigError
from lerobot_kit.core.layout import paths
from lerobot_kit.core.layout.files import resume_advice
from lerobot_kit.core.layout.paths import later_steps
from lerobot_kit.core.layout.validate import check_loadable, check_resumable
from lerobot_kit.core.parallel.dims import ParallelDims
from lerobot_kit.core.run.output.choose_folder import FIRST_START, Restarts, choose_output_dir
from lerobot_kit.core.run.output.writable import check_writable
from lerobot_kit.core.run.resume.allowed_changes import check_resume_changes
from lerobot_kit.core.run.resume.choose_checkpoint import resume_point, step_number


@dataclass(frozen=True)
class RunSpec:
    config: TrainConfig  # as validated; never changed afterwards
    dims: ParallelDims
    output_dir: Path
    resume_from: Path | None  # the step folder a resumed run restores, else None
    peft_base: Path | None  # the absolute pretrained_model/ an adapter trains on, else None
    resume_note: str | None = None  # why the run resumes from where it does (or starts afresh on auto), for the log
    discarded: tuple[Path, ...] = ()  # later step folders that --resume_from replaces (removed before the first step)
    nothing_left: str | None = None  # the warning when the checkpoint resumed is at or past --steps: nothing to do

    @property
    def resuming(self) -> bool:
        return self.resume_from is not None

    @property
    def resume_step(self) -> int:
        """The step the run continues from (0 when it starts afresh)."""
        return 0 if self.resume_from is None else step_number(self.resume_from)

    @property
    def use_peft(self) -> bool:
        return self.peft_base is not None

    def recorded_config(self) -> dict[str, Any]:
        """``train_config.json``: the config with the decisions a reload must reproduce.

        The output folder is the one chosen (a default one carries a timestamp), and a
        PEFT run names its base by absolute path, so resuming through ``checkpoints/last``
        reloads the very base the adapter was trained on even after ``last`` moved on.
        """
        recorded = self.config.to_json_dict()
        recorded["output_dir"] = str(self.output_dir)
        recorded["resume"] = self.resuming
        if self.peft_base is not None:
            recorded["policy"]["path"] = str(self.peft_base)
        return recorded


def resolve_run(config: TrainConfig, world_size: int, restarts: Restarts = FIRST_START,
                claim_folder: Callable[[Path], None] | None = None) -> RunSpec:
    """The spec of ``config`` on ``world_size`` processes; one ``ConfigError`` or
    ``CheckpointError`` line for the first rule broken. Reads the disk and the clock, so
    in a multi-process run one process calls it and shares the result.

    ``claim_folder`` is called with the output folder as soon as it is chosen, before
    anything in it is read: ``lerobot train`` takes the folder's lock there
    (``core.run.output.lock``), so that what the spec decides from the folder's
    checkpoints cannot change under it; ``lerobot plan`` passes none and writes nothing.
    """
    dims = ParallelDims.resolve(config.parallelism, world_size)
    _check_save_schedule(config)
    peft_base = _peft_base(config)
    output_dir = choose_output_dir(config, restarts)
    check_writable(output_dir)
    if claim_folder is not None:
        claim_folder(output_dir)
    resume_from, note = resume_point(config, output_dir, restarts)
    discarded: tuple[Path, ...] = ()
    if config.policy.path and (peft_base is not None or resume_from is None):
        check_loadable(paths.find_pretrained_dir(Path(config.policy.path)))  # the weights the run starts from
    nothing_left = None
    if resume_from is not None:
        check_resumable(resume_from, resume_advice(resume_from))
        check_resume_changes(config, resume_from, output_dir, peft_base)
        nothing_left = _nothing_left(config, resume_from)
        if restarts.count == 0 and config.resume_from is not None and nothing_left is None:
            discarded = later_steps(output_dir, step_number(resume_from))
    return RunSpec(config, dims, output_dir, resume_from, peft_base, note, discarded, nothing_left)


def _nothing_left(config: TrainConfig, resume_from: Path) -> str | None:
    """The one line a resume prints instead of training when its checkpoint is at or past ``--steps``.

    Not an error: a scheduler that reruns a finished job (``--resume=auto``, a requeue, a
    launcher's restart after the last save) must see it succeed, or it reruns it forever.
    """
    step = step_number(resume_from)
    if step < config.steps:
        return None
    return (
        f"warning: nothing left to train: {resume_from} is step {step} and --steps={config.steps}, so no step was "
        f"run and nothing was written; to train on from it, pass --steps greater than {step} (the total number of "
        "steps, not the steps to add)"
    )


def _check_save_schedule(config: TrainConfig) -> None:
    accumulation = config.accelerator.gradient_accumulation.steps
    if config.save_checkpoint and config.save_freq % accumulation:
        raise ConfigError(
            f"--save_freq={config.save_freq} must be a multiple of --accelerator.gradient_accumulation.steps="
            f"{accumulation}, so that checkpoints fall between optimizer updates"
        )


def _peft_base(config: TrainConfig) -> Path | None:
    if config.peft.method_type is None:
        return None
    from lerobot_kit.core.model.peft import base_path_of, check_request

    check_request(config)
    assert config.policy.path is not None  # check_request refuses a PEFT run without one
    return base_path_of(config.policy.path)
