"""Closed-loop success of the README's first policy, against the scripted expert.

Runs the README's first ``lerobot train`` command and its ``lerobot eval`` line exactly
as written there (both are read from README.md, so the figure is the one a user gets),
in a scratch folder: the policy's success rate on 50 episodes beside the expert's on the
same episode seeds. The goal is on their ratio (at least 0.9). Training and evaluation
wall times are reported. ``--smoke`` appends ``--steps=20`` and ``--eval.n_episodes=4``
to the same commands (a smoke policy is not judged on success).
"""

from __future__ import annotations

import json
import re
import shlex

from _common import REPO, Context, Result, Row, clean_env, console_script, judge, run_timed

NAME = "eval_success"
GOAL = ">= 0.9"


def readme_command(subcommand: str) -> list[str]:
    """The arguments of the README's first ``lerobot <subcommand>`` in a shell code block."""
    readme = (REPO / "README.md").read_text()
    for block in re.findall(r"```bash\n(.*?)```", readme, re.DOTALL):
        for part in re.split(r"&&|\n", block.replace("\\\n", " ")):
            words = shlex.split(part)
            if words[:2] == ["lerobot", subcommand]:
                return words[2:]
    raise RuntimeError(f"README.md has no `lerobot {subcommand}` command in a bash block")


def _flag(args: list[str], name: str) -> str:
    values = [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]
    if not values:
        raise RuntimeError(f"the README's command has no --{name}: {' '.join(args)}")
    return values[-1]


def run(ctx: Context) -> Result:
    folder = ctx.folder(NAME)
    env = clean_env(ctx.workdir)
    lerobot = console_script("lerobot")
    train_args = readme_command("train") + ctx.pick(["--steps=20"], [])
    eval_args = readme_command("eval") + ctx.pick(["--eval.n_episodes=4"], [])
    trained = run_timed([lerobot, "train", *train_args], env, timeout=1800, cwd=folder)
    if trained.returncode != 0:
        raise RuntimeError(f"lerobot train {' '.join(train_args)} failed:\n{trained.stderr[-3000:]}")
    evaluated = run_timed([lerobot, "eval", *eval_args], env, timeout=1800, cwd=folder)
    if evaluated.returncode != 0:
        raise RuntimeError(f"lerobot eval {' '.join(eval_args)} failed:\n{evaluated.stderr[-3000:]}")
    info = json.loads((folder / _flag(eval_args, "output_dir") / "eval_info.json").read_text())
    policy, expert = info["aggregated"], info["expert"]["aggregated"]
    ratio = policy["pc_success"] / expert["pc_success"] if expert["pc_success"] else None
    episodes = policy["n_episodes"]
    result = Result(details={"train": train_args, "eval": eval_args, "summary": evaluated.stdout.strip(),
                             "aggregated": policy, "expert": expert})
    goal = ctx.pick("", GOAL)  # a 20-step smoke policy is not judged
    result.rows.append(Row(
        f"README command 1, then lerobot eval ({episodes} episodes): success vs the expert's on the same seeds",
        policy["pc_success"], expert["pc_success"], "%", ratio, goal, judge(ratio, goal),
    ))
    result.rows.append(Row("README command 1 (lerobot train) wall time", trained.seconds, None, "s", None,
                           note=" ".join(train_args)))
    result.rows.append(Row(f"lerobot eval wall time ({episodes} episodes, and the expert's)", evaluated.seconds,
                           None, "s", None))
    return result
