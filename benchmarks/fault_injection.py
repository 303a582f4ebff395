"""7. Fault injection: a rank SIGKILLed at a seeded random point of a restartable FSDP(2) run.

Each trial is ``torchrun --standalone --nproc-per-node=2 --max-restarts=1 $(which lerobot)
train`` of a small ACT, sharded over two ranks, saving every few steps (``safetensors_dcp``
so that both a gathered file and DCP shards are written). One rank, chosen at random, is
killed with SIGKILL at one point of one step, both chosen at random from a fixed seed:

- ``forward`` / ``backward`` / ``optimizer``: at the start of the model's forward, when
  autograd reaches the middle wrap unit, before ``optimizer.step``;
- ``sync_save``: while the checkpoint is being written, training blocked;
- ``async_save``: with ``--async_checkpoint=true``, after training has moved on while the
  background write of the checkpoint is under way.

The points are placed by ``LEROBOT_KIT_FAULT`` (``core.run.reliability.fault_injection``, docs/fault-injection.md),
which also records what it saw when it fired. torchrun restarts the group once; the
restarted run finds ``checkpoints/last`` by itself. A trial *recovers* when the command
exits 0, and is *bit-identical* when its final weights equal, tensor for tensor, those of
the same run never interrupted (measured once, in this benchmark). Points cycle through
the five kinds so that every kind is tried; steps and ranks are random.
"""

from __future__ import annotations

import json
import random
import subprocess
import time
from pathlib import Path
from typing import Any

from _common import Context, Result, Row, clean_env, console_script, judge

NAME = "fault_injection"
POINTS = ["forward", "backward", "optimizer", "sync_save", "async_save"]
SEED = 13
MODEL = ["--policy.dim_model=32", "--policy.dim_feedforward=64", "--policy.n_heads=2",
         "--policy.n_encoder_layers=2", "--policy.n_vae_encoder_layers=1", "--policy.chunk_size=5",
         "--policy.n_action_steps=5"]
COMMON = [*MODEL, "--dataset.num_episodes=2", "--dataset.episode_length=20", "--batch_size=4", "--seed=11",
          "--parallelism.dp_shard=2", "--checkpoint_format=safetensors_dcp"]


def _train(folder: Path, flags: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [console_script("torchrun"), "--standalone", "--nproc-per-node=2", "--max-restarts=1",
               console_script("lerobot"), "train", *flags]
    return subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=folder,
                          env={**clean_env(folder), **env})


def _final_weights(run: Path, steps: int) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(run / f"checkpoints/{steps:06d}/pretrained_model/model.safetensors")


def _identical(run: Path, reference: Path, steps: int) -> bool:
    import torch

    try:
        ours = _final_weights(run, steps)
    except OSError:
        return False
    theirs = _final_weights(reference, steps)
    return ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def plan_trials(count: int, steps: int, save_freq: int, seed: int = SEED) -> list[dict[str, Any]]:
    """``count`` trials: points cycling through every kind, steps and ranks drawn from ``seed``."""
    rng = random.Random(seed)
    trials = []
    for index in range(count):
        point = POINTS[index % len(POINTS)]
        if point.endswith("_save"):  # not the last save: nothing trains after it to overlap a background write
            step = rng.randrange(save_freq, steps, save_freq)
        else:
            step = rng.randrange(2, steps + 1)
        trials.append({"trial": index + 1, "point": point, "step": step, "rank": rng.randrange(2)})
    return trials


def run_trial(trial: dict[str, Any], folder: Path, flags: list[str], reference: Path, steps: int) -> dict[str, Any]:
    """One trial in ``folder``; returns the trial with what happened."""
    fault_log = folder / "fault.jsonl"
    env = {"LEROBOT_KIT_FAULT": f"point={trial['point']},step={trial['step']},rank={trial['rank']}",
           "LEROBOT_KIT_FAULT_LOG": str(fault_log)}
    extra = ["--async_checkpoint=true"] if trial["point"] == "async_save" else []
    start = time.perf_counter()
    result = _train(folder, [*flags, *extra, f"--output_dir={folder / 'run'}"], env)
    output = result.stdout + result.stderr
    fired = [json.loads(line) for line in fault_log.read_text().splitlines()] if fault_log.exists() else []
    resumed = [line.split(": continuing from ", 1)[1] for line in output.splitlines() if ": continuing from " in line]
    return {
        **trial,
        "killed": bool(fired),
        "observed": fired[0]["observed"] if fired else None,
        "resumed_from": resumed[0].rsplit("(", 1)[-1].rstrip(")") if resumed else "step 0",
        "exit_code": result.returncode,
        "recovered": result.returncode == 0 and bool(fired),
        "bit_identical": result.returncode == 0 and _identical(folder / "run", reference, steps),
        "seconds": round(time.perf_counter() - start, 1),
        "log_tail": None if result.returncode == 0 else output[-3000:],
    }


def run(ctx: Context) -> Result:
    count = ctx.pick(1, 10)
    steps, save_freq = ctx.pick((4, 2), (30, 10))
    flags = [*COMMON, f"--steps={steps}", f"--save_freq={save_freq}", f"--log_freq={save_freq}"]
    reference_folder = ctx.folder(NAME, "uninterrupted")
    done = _train(reference_folder, [*flags, f"--output_dir={reference_folder / 'run'}"], {})
    if done.returncode != 0:
        raise RuntimeError(f"the uninterrupted run failed:\n{done.stderr[-3000:]}")
    trials = []
    for trial in plan_trials(count, steps, save_freq):
        trials.append(run_trial(trial, ctx.folder(NAME, f"trial{trial['trial']}"), flags,
                                reference_folder / "run", steps))
    result = Result(details={"seed": SEED, "steps": steps, "save_freq": save_freq, "trials": trials})
    identical = sum(t["bit_identical"] for t in trials)
    ratio = identical / len(trials)
    result.rows.append(Row("trials recovered with bit-identical weights", identical, len(trials), "trials", ratio,
                           goal=">= 1", met=judge(ratio, ">= 1")))
    for point in POINTS:
        at_point = [t for t in trials if t["point"] == point]
        if at_point:
            same = sum(t["bit_identical"] for t in at_point)
            result.rows.append(Row(f"killed at {point}: bit-identical", same, len(at_point), "trials",
                                   same / len(at_point)))
    return result


def markdown_table(trials: list[dict[str, Any]]) -> str:
    """The README's table of one run's trials."""
    lines = ["| trial | killed at | rank | step | what the fault saw | restarted from | recovered | bit-identical |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for t in trials:
        lines.append(f"| {t['trial']} | {t['point']} | {t['rank']} | {t['step']} | {t['observed']} | "
                     f"{t['resumed_from']} | {'yes' if t['recovered'] else 'NO'} | "
                     f"{'yes' if t['bit_identical'] else 'NO'} |")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    print(markdown_table(json.loads(Path(sys.argv[1]).read_text())["benchmarks"][NAME]["details"]["trials"]))
