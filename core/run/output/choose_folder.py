"""Which folder a run writes: the folder of the run it continues, or a new one.

Chosen before the resume point, because the resume point is read from the folder's
checkpoints; what decides whether a run continues (``--resume``, ``--resume=auto``, a
launcher's restart) lives here too, since the folder depends on it and the resume room
above reads it from here.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from lerobot_kit.core.config.schema import TrainConfig
from lerobot_kit.core.errors import ConfigError
from lerobot_kit.core.layout import paths

DEFAULT_OUTPUT_ROOT = Path("outputs/train")


@dataclass(frozen=True)
class Restarts:
    """What the launcher says about restarts (``LaunchEnv``): how many so far, how many left."""

    count: int = 0
    allowed: int = 0


FIRST_START = Restarts()  # no restart so far and none allowed: a run started by hand, without a launcher's retries


def continuing(config: TrainConfig, restarts: Restarts) -> bool:
    """``--resume=auto``, or a launcher's restart: continue the run in its folder, from ``last`` if any.

    A launcher's restart (torchrun after a failed rank, SLURM after a requeue) reruns the
    very command that started the run, so it must find the run by itself: it continues
    from ``checkpoints/last`` of the run's folder whatever ``--resume`` says, like
    ``--resume=auto`` (for schedulers that simply rerun a command) — or starts afresh in
    that folder when no checkpoint was published yet.
    """
    return config.resume == "auto" or restarts.count >= 1


def why_continuing(restarts: Restarts) -> str:
    """The cause a continuing run names in its log line and its refusals."""
    return f"restart {restarts.count} of this run" if restarts.count >= 1 else "--resume=auto"


def choose_output_dir(config: TrainConfig, restarts: Restarts) -> Path:
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
    if continuing(config, restarts) or config.resume:
        return _continued_run_dir(config, restarts)
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


def _continued_run_dir(config: TrainConfig, restarts: Restarts) -> Path:
    """The folder of the run a continuing run continues; refused when nothing names one, since a default
    folder is new at each start and would hold none of that run's checkpoints."""
    step_dir = step_dir_of(config.config_path)
    if step_dir is not None:
        return step_dir.parent.parent
    if config.output_dir is not None:
        return Path(config.output_dir)
    if continuing(config, restarts):
        raise ConfigError(
            f"{why_continuing(restarts)} continues the run in its --output_dir, and none was given (the default folder "
            "is a new timestamped one at each start): pass --output_dir"
        )
    raise ConfigError(
        "--resume=true needs a run to resume: pass --config_path=<output_dir>/checkpoints/last/"
        "pretrained_model/train_config.json (or --output_dir of the run)"
    )


def step_dir_of(config_path: str | None) -> Path | None:
    """The step folder a ``.../checkpoints/NNNNNN/pretrained_model/train_config.json`` lives in."""
    if not config_path:
        return None
    pretrained = Path(config_path).absolute().parent
    if pretrained.name != paths.PRETRAINED_DIR:
        return None
    step_dir = paths.follow_last(pretrained.parent).resolve()  # through a run's last, only into that run
    return step_dir if (step_dir / paths.TRAINING_STATE_DIR).is_dir() else None
