"""6. Start-up: ``lerobot --help``, ``lerobot inspect-checkpoint`` on the >=100 M checkpoint,
and the time to the first step of ``lerobot train``.

Wall time of the real console commands, from spawn to exit, alternating with the
floor any Python command pays: ``python -c pass`` on the same interpreter. The goal
(under 0.5 s) is on the commands' own wall time; the ratio to the floor shows how
much of it is ours. ``inspect-checkpoint`` is judged with ``--no-verify`` (reading
headers and metadata: its start-up); by default it also verifies ``checksums.json``
for a checkpoint this size (1.3 GB, under ``--verify-max-bytes``), which reads and
hashes every byte, so that run is reported beside it, not judged. Time to first step
runs ``lerobot train --steps=1 --log_freq=1`` until its ``step 1/1`` line appears,
against ``python -c "import torch"``, which any training command pays (reported, not
judged).
"""

from __future__ import annotations

import sys
from typing import Callable

from _common import Context, Result, Row, clean_env, console_script, judge, paired, run_timed, time_to_line
from checkpoint_io import large_checkpoint

NAME = "startup"
GOAL = "< 0.5"


def _rotating(reps: int, measures: dict[str, Callable[[], float]]) -> dict[str, list[float]]:
    names = list(measures)
    times: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(reps):
        for name in names[rep % len(names):] + names[: rep % len(names)]:
            times[name].append(measures[name]())
    return times


def run(ctx: Context) -> Result:
    step_dir, params = large_checkpoint(ctx)
    env = clean_env(ctx.workdir)
    lerobot = console_script("lerobot")

    def wall(argv: list[str]) -> Callable[[], float]:
        return lambda: run_timed(argv, env, timeout=120).seconds

    times = _rotating(ctx.pick(1, 7), {
        "python": wall([sys.executable, "-c", "pass"]),
        "help": wall([lerobot, "--help"]),
        "inspect": wall([lerobot, "inspect-checkpoint", "--no-verify", str(step_dir)]),
        "inspect_verify": wall([lerobot, "inspect-checkpoint", str(step_dir)]),
    })
    result = Result(details={"wall_s": times, "checkpoint_params": params})
    size = f"{params / 1e6:.0f} M"
    for name, label, goal in (("help", "lerobot --help", GOAL),
                              ("inspect", f"lerobot inspect-checkpoint --no-verify ({size})", GOAL),
                              ("inspect_verify", f"lerobot inspect-checkpoint, checksums verified ({size})", "")):
        stats = paired(times[name], times["python"])
        result.rows.append(Row(
            f"{label} wall time vs python -c pass", stats["ours"], stats["reference"], "s", stats["ratio"],
            f"{goal} s" if goal else "", judge(stats["ours"], goal), "goal on ours (absolute)" if goal else "",
        ))

    runs = iter(range(100))
    folder = ctx.folder(NAME)

    def first_step() -> float:
        argv = [console_script("lerobot"), "train", "--steps=1", "--log_freq=1", "--save_checkpoint=false",
                f"--output_dir={folder / f'run{next(runs)}'}"]
        return time_to_line(argv, env, "step 1/1", timeout=300).seconds

    train = _rotating(ctx.pick(1, 3), {"train": first_step, "torch": wall([sys.executable, "-c", "import torch"])})
    result.details["first_step_s"] = train
    stats = paired(train["train"], train["torch"])
    result.rows.append(Row(
        "lerobot train time to first step vs python -c 'import torch'", stats["ours"], stats["reference"], "s",
        stats["ratio"], note="default ACT and data",
    ))
    return result
