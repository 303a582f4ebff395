"""Which checkpoint a run resumes from, once its output folder is chosen (``output.choose_folder``).

Read from the folder's step folders and its ``last`` link, under the folder's lock, so
the choice cannot change before the run restores it; the reason for the choice goes to
the log, since a restart or ``--resume=auto`` decides it without the user.
"""

from __future__ import annotations

from pathlib import Path

from lerobot_kit.core.config.schema import TrainConfig
from lerobot_kit.core.errors import CheckpointError, ConfigError
from lerobot_kit.core.layout import paths
from lerobot_kit.core.layout.paths import later_steps, resumable_steps
from lerobot_kit.core.run.output.choose_folder import Restarts, continuing, step_dir_of, why_continuing
from lerobot_kit.core.run.output.lock import LOCK_FILE


def resume_point(config: TrainConfig, output_dir: Path, restarts: Restarts) -> tuple[Path | None, str | None]:
    """The step folder the run resumes from (None: step 0), and why, for the log; refuses to overwrite a run."""
    if continuing(config, restarts):
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


def step_number(step_dir: Path) -> int:
    """Step folders are named by their step (``000020``)."""
    return int(step_dir.name)


def _continue_run(output_dir: Path, restarts: Restarts) -> tuple[Path | None, str]:
    """``--resume=auto`` or a restart: the run folder's ``last`` checkpoint if any."""
    why = why_continuing(restarts)
    last, missing = _newest_checkpoint(output_dir)
    if last is None:
        return None, f"{why}: no checkpoint in {output_dir} yet, starting from step 0"
    return last, f"{why}: continuing from {last} (step {step_number(last)}){missing}"


def _resume_requested(config: TrainConfig, output_dir: Path) -> tuple[Path, str]:
    """``--resume=true``: the step ``--config_path`` names, or ``--resume_from``'s, or the newest.

    Resuming an older step than the newest would overwrite the later checkpoints one save
    at a time and leave the rest beside a ``last`` that no longer points to the newest,
    so it is refused unless ``--resume_from`` says so (the run then removes them first).
    """
    given = step_dir_of(config.config_path)
    step_dir, missing = _requested_step_dir(config, output_dir, given)
    step = step_number(step_dir)
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


def _requested_step_dir(config: TrainConfig, output_dir: Path, given: Path | None) -> tuple[Path, str]:
    """The step folder ``--resume=true`` names, most explicit first, and the log's note when ``last`` was
    missing; one line naming what exists when it names none."""
    if config.resume_from is not None:
        steps = resumable_steps(output_dir)
        step_dir = steps.get(config.resume_from)
        if step_dir is None:
            known = ", ".join(str(s) for s in sorted(steps)) or "none"
            raise CheckpointError(
                f"--resume_from={config.resume_from}: {output_dir} has no complete step folder "
                f"{paths.step_dir_name(config.resume_from)} (resumable steps: {known}); pass one of those"
            )
        return step_dir, ""
    if given is not None:
        return given, ""
    newest, missing = _newest_checkpoint(output_dir)
    if newest is None:
        raise CheckpointError(
            f"--resume=true: {output_dir} has no checkpoint to resume (no complete step folder under "
            f"{paths.CHECKPOINTS_DIR}/); start a new run without --resume"
        )
    return newest, missing


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
