"""``eval_info.json`` in LeRobot's shape, plus the scripted expert's results on the same seeds.

``per_episode`` rows and ``aggregated`` (``avg_sum_reward``, ``avg_max_reward``,
``pc_success``, ``eval_s``, ``eval_ep_s``) are what LeRobot's ``lerobot-eval`` writes, so
scripts that read those files read these. ``expert`` holds the same two blocks for the
scripted expert (null when the environment has none): a success rate means little
without the rate the task allows in the same episodes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lerobot_kit.core.eval.rollout import Episode


def aggregate(episodes: list[Episode], eval_s: float) -> dict[str, float]:
    n = len(episodes)
    return {
        "avg_sum_reward": float(np.mean([e.sum_reward for e in episodes])),
        "avg_max_reward": float(np.mean([e.max_reward for e in episodes])),
        "pc_success": 100.0 * sum(e.success for e in episodes) / n,
        "n_episodes": n,
        "eval_s": eval_s,
        "eval_ep_s": eval_s / n,
    }


def eval_info(
    episodes: list[Episode], eval_s: float, expert: list[Episode] | None, expert_s: float, setup: dict[str, Any],
) -> dict[str, Any]:
    return {
        "per_episode": [e.row() for e in episodes],
        "aggregated": aggregate(episodes, eval_s),
        "video_paths": [e.video for e in episodes if e.video],
        "expert": None if expert is None else {
            "per_episode": [e.row() for e in expert], "aggregated": aggregate(expert, expert_s),
        },
        "setup": setup,
    }


def summary(info: dict[str, Any]) -> str:
    """One line: the policy's success next to the expert's, rewards and time."""
    policy = info["aggregated"]
    line = f"success {policy['pc_success']:.1f}%"
    if info["expert"] is not None:
        expert = info["expert"]["aggregated"]["pc_success"]
        ratio = f", {policy['pc_success'] / expert:.2f} of the expert's" if expert else ""
        line += f" (expert {expert:.1f}% on the same seeds{ratio})"
    return (f"{line} | avg_sum_reward {policy['avg_sum_reward']:.2f} | avg_max_reward {policy['avg_max_reward']:.3f} "
            f"| {policy['n_episodes']} episodes in {policy['eval_s']:.1f} s")


def metrics_row(info: dict[str, Any], step: int) -> dict[str, float]:
    """The training log's row: ``eval/<name>`` for trackio and ``logs/metrics.jsonl``."""
    row: dict[str, float] = {"step": step, **{f"eval/{k}": v for k, v in info["aggregated"].items()}}
    if info["expert"] is not None:
        row["eval/expert_pc_success"] = info["expert"]["aggregated"]["pc_success"]
    return row
