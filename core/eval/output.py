"""Where an evaluation's files go: a folder that appears whole, and never over another one.

An evaluation writes into a new hidden sibling of its folder and renames it into place
once complete, so a folder named like an evaluation always holds a whole one, and a
failed evaluation leaves nothing. The rename never replaces an evaluation: a folder that
exists (with anything in it) is left as it is. ``lerobot eval`` then refuses, naming
it; an evaluation during training takes the next free name (``eval/000008.2`` when
``eval/000008`` is an earlier evaluation of that step, from before a resume).

A training run's folder belongs to the run: ``lerobot eval --output_dir`` inside one is
refused (the run's own evaluations go to ``<run>/eval/<step>/``). Torch-free.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

from lerobot_kit.core.errors import ConfigError, LerobotError
from lerobot_kit.core.layout.paths import CHECKPOINTS_DIR, LAST_LINK, is_step_dir_name, step_dir_name

EVAL_DIR = "eval"
_RUN_LOG = Path("logs") / "metrics.jsonl"


def refuse_inside_run(output_dir: Path) -> None:
    """A ``ConfigError`` when ``output_dir`` is a training run's folder or lies inside one."""
    run = training_run_holding(output_dir)
    if run is not None:
        raise ConfigError(
            f"--output_dir={output_dir} is inside the training run folder {run}, which belongs to that run (its "
            f"evaluations during training go to {run / EVAL_DIR}/<step>/, and would meet this one there); choose "
            "an --output_dir outside it (nothing was written)"
        )


def training_run_holding(path: Path) -> Path | None:
    """The training run folder that ``path`` is or lies in, links followed; None when there is none."""
    for where in (Path(path).absolute(), Path(path).resolve()):
        for folder in (where, *where.parents):
            if is_training_run(folder):
                return folder
    return None


def is_training_run(folder: Path) -> bool:
    """A folder ``lerobot train`` wrote: its metrics log, or a ``checkpoints/`` of step folders (or ``last``)."""
    if os.path.isfile(folder / _RUN_LOG):
        return True
    try:
        names = os.listdir(folder / CHECKPOINTS_DIR)
    except OSError:  # none (or none this user may list)
        return False
    return any(name == LAST_LINK or is_step_dir_name(name) for name in names)


def building_folder(output_dir: Path, token: str | None = None) -> Path:
    """The hidden sibling an evaluation is written into before it is renamed to ``output_dir``;
    ``token`` (default: a new random one) must be the same on every rank of one evaluation."""
    return output_dir.with_name(f".{output_dir.name}.{token or new_token()}.tmp")


def new_token() -> str:
    return uuid.uuid4().hex[:12]


@contextlib.contextmanager
def written_whole(output_dir: Path) -> Iterator[Path]:
    """A new hidden sibling of ``output_dir`` to write into, renamed to ``output_dir`` when the
    block ends normally and removed when it does not. An ``output_dir`` that is empty is
    replaced; one that is not (filled while the block ran) is left as it is, and the
    evaluation refused in one line."""
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    building = building_folder(output_dir)
    building.mkdir()  # with the umask's mode, as the folder itself would be
    try:
        yield building
        if not publish(building, output_dir):
            raise LerobotError(
                f"{output_dir} was filled by something else while this evaluation ran; it was left as it is and "
                "this evaluation's results were discarded: run again with another --output_dir"
            )
    finally:
        shutil.rmtree(building, ignore_errors=True)  # gone already when it was renamed


def publish(building: Path, output_dir: Path) -> bool:
    """Rename ``building`` to ``output_dir`` unless that holds anything (an empty folder is
    replaced); False when it does, and nothing was changed."""
    try:
        os.rename(building, output_dir)
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
            return False
        raise
    return True


def step_eval_folder(output_dir: Path, step: int) -> Path:
    """``<output_dir>/eval/<step>/``: numbered as ``checkpoints/<step>/``, outside it, so checkpoint
    folders stay exactly what the checkpoint code writes and publishes."""
    return output_dir / EVAL_DIR / step_dir_name(step)


def publish_step_eval(building: Path, output_dir: Path, step: int) -> Path:
    """Rename an evaluation of ``step`` during training into ``eval/<step>/``, or, when an earlier
    evaluation of that step is there, into the next free ``eval/<step>.<n>/``; its folder."""
    first = step_eval_folder(output_dir, step)
    for n in range(1, 10_000):
        target = first if n == 1 else first.with_name(f"{first.name}.{n}")
        if publish(building, target):
            return target
    raise LerobotError(f"{first.parent}: 10,000 evaluations of step {step}; remove the old ones")
