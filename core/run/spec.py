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

import datetime
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lerobot_kit.core.config.schema import TrainConfig
from lerobot_kit.core.errors import CheckpointError, ConfigError
from lerobot_kit.core.layout import paths
from lerobot_kit.core.layout.files import resume_advice
from lerobot_kit.core.layout.paths import later_steps, resumable_steps
from lerobot_kit.core.layout.validate import check_loadable, check_resumable
from lerobot_kit.core.parallel.dims import ParallelDims
from lerobot_kit.core.run.output.lock import LOCK_FILE
from lerobot_kit.core.run.output.writable import check_writable
from lerobot_kit.core.run.resume.allowed_changes import check_resume_changes

DEFAULT_OUTPUT_ROOT = Path("outputs/train")


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
        return 0 if self.resume_from is None else _step_number(self.resume_from)

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


@dataclass(frozen=True)
class Restarts:
    """What the launcher says about restarts (``LaunchEnv``): how many so far, how many left."""

    count: int = 0
    allowed: int = 0


def resolve_run(config: TrainConfig, world_size: int, restarts: Restarts = Restarts(),
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
    output_dir = _output_dir(config, restarts)
    check_writable(output_dir)
    if claim_folder is not None:
        claim_folder(output_dir)
    resume_from, note = _resume_point(config, output_dir, restarts)
    discarded: tuple[Path, ...] = ()
    if config.policy.path and (peft_base is not None or resume_from is None):
        check_loadable(paths.find_pretrained_dir(Path(config.policy.path)))  # the weights the run starts from
    nothing_left = None
    if resume_from is not None:
        check_resumable(resume_from, resume_advice(resume_from))
        check_resume_changes(config, resume_from, output_dir, peft_base)
        nothing_left = _nothing_left(config, resume_from)
        if restarts.count == 0 and config.resume_from is not None and nothing_left is None:
            discarded = later_steps(output_dir, _step_number(resume_from))
    return RunSpec(config, dims, output_dir, resume_from, peft_base, note, discarded, nothing_left)


def _nothing_left(config: TrainConfig, resume_from: Path) -> str | None:
    """The one line a resume prints instead of training when its checkpoint is at or past ``--steps``.

    Not an error: a scheduler that reruns a finished job (``--resume=auto``, a requeue, a
    launcher's restart after the last save) must see it succeed, or it reruns it forever.
    """
    step = _step_number(resume_from)
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


def _continuing(config: TrainConfig, restarts: Restarts) -> bool:
    """``--resume=auto``, or a launcher's restart: continue the run in its folder, from ``last`` if any.

    A launcher's restart (torchrun after a failed rank, SLURM after a requeue) reruns the
    very command that started the run, so it must find the run by itself: it continues
    from ``checkpoints/last`` of the run's folder whatever ``--resume`` says, like
    ``--resume=auto`` (for schedulers that simply rerun a command) — or starts afresh in
    that folder when no checkpoint was published yet.
    """
    return config.resume == "auto" or restarts.count >= 1


def _why_continuing(restarts: Restarts) -> str:
    return f"restart {restarts.count} of this run" if restarts.count >= 1 else "--resume=auto"


def _output_dir(config: TrainConfig, restarts: Restarts) -> Path:
    """Where the run writes: the folder of the run it continues, or a new one.

    A run that continues (``--resume``, ``--resume=auto``, a restart) is found from the
    step folder ``--config_path`` names, else from ``--output_dir``.
    """
    if config.resume_from is not None and config.resume is not True:
        raise ConfigError(
            f"--resume_from={config.resume_from} picks the step a --resume=true run continues from; "
            f"--resume={config.resume} {'continues from last' if config.resume == 'auto' else 'starts a new run'}: "
            "pass --resume=true, or remove --resume_from"
        )
    continuing = _continuing(config, restarts)
    if continuing or config.resume:
        step_dir = _step_dir_of(config.config_path)
        if step_dir is not None:
            return step_dir.parent.parent
        if config.output_dir is not None:
            return Path(config.output_dir)
        if continuing:
            raise ConfigError(
                f"{_why_continuing(restarts)} continues the run in its --output_dir, and none was given (the default folder is a new "
                "timestamped one at each start): pass --output_dir"
            )
        raise ConfigError(
            "--resume=true needs a run to resume: pass --config_path=<output_dir>/checkpoints/last/"
            "pretrained_model/train_config.json (or --output_dir of the run)"
        )
    if config.output_dir is None and restarts.allowed >= 1:
        raise ConfigError(
            f"torchrun --max-restarts={restarts.allowed} restarts this run in its output folder, but the default "
            "--output_dir is a new timestamped folder at each start, so a restart would not find its checkpoints: "
            "pass --output_dir"
        )
    if config.output_dir is None:
        stamp = datetime.datetime.now().strftime("%Y-%m-%d/%H-%M-%S")
        job = config.job_name or f"{config.policy.type}_{config.dataset.type}"
        return DEFAULT_OUTPUT_ROOT / f"{stamp}_{job}"
    return Path(config.output_dir)


def _resume_point(config: TrainConfig, output_dir: Path, restarts: Restarts) -> tuple[Path | None, str | None]:
    """The step folder the run resumes from (None: step 0), and why, for the log; refuses to overwrite a run."""
    if _continuing(config, restarts):
        return _continue_run(output_dir, restarts)
    if config.resume:
        return _resume_requested(config, output_dir)
    # The lock (this run's, or a dead run's it took over) is not content of the folder.
    if output_dir.is_dir() and any(not p.name.startswith(LOCK_FILE) for p in output_dir.iterdir()):
        raise ConfigError(
            f"--output_dir={output_dir} already exists and is not empty; pass --resume=true to continue "
            "that run (or --resume=auto), or choose another --output_dir (nothing was changed)"
        )
    return None, None


def _continue_run(output_dir: Path, restarts: Restarts) -> tuple[Path | None, str]:
    """``--resume=auto`` or a restart: the run folder's ``last`` checkpoint if any."""
    why = _why_continuing(restarts)
    last, missing = _newest_checkpoint(output_dir)
    if last is None:
        return None, f"{why}: no checkpoint in {output_dir} yet, starting from step 0"
    return last, f"{why}: continuing from {last} (step {_step_number(last)}){missing}"


def _resume_requested(config: TrainConfig, output_dir: Path) -> tuple[Path, str]:
    """``--resume=true``: the step ``--config_path`` names, or ``--resume_from``'s, or the newest.

    Resuming an older step than the newest would overwrite the later checkpoints one save
    at a time and leave the rest beside a ``last`` that no longer points to the newest,
    so it is refused unless ``--resume_from`` says so (the run then removes them first).
    """
    given = _step_dir_of(config.config_path)
    steps = resumable_steps(output_dir)
    missing = ""
    if config.resume_from is not None:
        step_dir = steps.get(config.resume_from)
        if step_dir is None:
            known = ", ".join(str(s) for s in sorted(steps)) or "none"
            raise CheckpointError(
                f"--resume_from={config.resume_from}: {output_dir} has no complete step folder "
                f"{paths.step_dir_name(config.resume_from)} (resumable steps: {known}); pass one of those"
            )
    elif given is not None:
        step_dir = given
    else:
        step_dir, missing = _newest_checkpoint(output_dir)
        if step_dir is None:
            raise CheckpointError(
                f"--resume=true: {output_dir} has no checkpoint to resume (no complete step folder under "
                f"{paths.CHECKPOINTS_DIR}/); start a new run without --resume"
            )
    step = _step_number(step_dir)
    later = later_steps(output_dir, step)
    if later and config.resume_from is None:
        source = "--config_path" if given is not None else f"{paths.CHECKPOINTS_DIR}/{paths.LAST_LINK}"
        newest = later[-1] / paths.PRETRAINED_DIR / paths.TRAIN_CONFIG
        raise ConfigError(
            f"{source} is step {step}, but {output_dir} has later checkpoints "
            f"({', '.join(d.name for d in later)}) that resuming from it would overwrite: pass --resume_from={step} "
            f"to continue from step {step} and remove them, or resume the newest with --config_path={newest}"
        )
    return step_dir, f"--resume=true: continuing from {step_dir} (step {step}){missing}"


def _newest_checkpoint(output_dir: Path) -> tuple[Path | None, str]:
    """``last``'s step folder; without ``last`` (deleted, or lost by a copy that skips links), the
    newest complete step folder, with a note saying so for the log."""
    last = paths.last_checkpoint(output_dir)
    if last is not None:
        return last, ""
    steps = resumable_steps(output_dir)
    if not steps:
        return None, ""
    newest = steps[max(steps)]
    return newest, (f"; {paths.CHECKPOINTS_DIR}/{paths.LAST_LINK} is missing, so the newest complete step folder "
                    f"{newest.name} is used")


def _step_number(step_dir: Path) -> int:
    """Step folders are named by their step (``000020``)."""
    return int(step_dir.name)


def _step_dir_of(config_path: str | None) -> Path | None:
    """The step folder a ``.../checkpoints/NNNNNN/pretrained_model/train_config.json`` lives in."""
    if not config_path:
        return None
    pretrained = Path(config_path).absolute().parent
    if pretrained.name != paths.PRETRAINED_DIR:
        return None
    step_dir = paths.follow_last(pretrained.parent).resolve()  # through a run's last, only into that run
    return step_dir if (step_dir / paths.TRAINING_STATE_DIR).is_dir() else None
