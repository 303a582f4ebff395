"""Run one batch of episodes in a vectorised environment, driven by any actor.

The actor is a function from observations to actions, so the policy and the scripted
expert go through the very same loop and their numbers are comparable. Episodes that
end early stay in the batch (the environment does not auto-reset) and their rewards
are masked from then on, as LeRobot's rollout does; the batch ends when every episode
has ended or after ``max_episode_steps``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from lerobot_kit.core.errors import LerobotError
from lerobot_kit.core.eval.env import Observation, VectorEnv

Actor = Callable[[Observation], np.ndarray]


@dataclass
class Episode:
    """One episode's results; ``path`` and ``goal`` when the environment reports them (the plot)."""

    index: int
    seed: int
    sum_reward: float
    max_reward: float
    success: bool
    path: list[list[float]] | None = None  # agent positions, reset included
    goal: list[float] | None = None
    frames: list[np.ndarray] = field(default_factory=list)  # uint8 [H, W, 3], only for recorded episodes
    video: str | None = None  # the mp4 written from ``frames``, relative to the evaluation folder

    def row(self) -> dict[str, object]:
        """The row of ``eval_info.json``'s ``per_episode`` (LeRobot's keys)."""
        return {"episode_ix": self.index, "sum_reward": self.sum_reward, "max_reward": self.max_reward,
                "success": self.success, "seed": self.seed}


class NonFiniteActionError(LerobotError):
    """An actor's action holds NaN or infinity: no episode it drives has a meaningful result."""


def run_batch(env: VectorEnv, act: Actor, indices: list[int], seeds: list[int], record: set[int],
              who: str) -> list[Episode]:
    """Episodes ``indices`` (environment ``i`` starts from ``seeds[i]``); frames kept for those in ``record``.

    ``who`` drives them (``policy``, ``expert``): an action of it that is not finite stops
    the batch with one line naming the episode and the step.
    """
    n = env.num_envs
    observation, info = env.reset(seed=seeds)
    done = np.zeros(n, dtype=bool)
    success = np.zeros(n, dtype=bool)
    sum_reward = np.zeros(n)
    max_reward = np.full(n, -np.inf)
    steps = np.zeros(n, dtype=np.int64)
    recorded = [i for i, index in enumerate(indices) if index in record]
    frames: dict[int, list[np.ndarray]] = {i: [] for i in recorded}
    paths: list[np.ndarray] = []
    _keep(env, info, recorded, frames, paths, done)
    for step in range(1, env.max_episode_steps + 1):
        action = act(observation)
        _check_finite(action, step, indices, seeds, who)
        observation, reward, terminated, truncated, info = env.step(action)
        alive = ~done
        reward = np.asarray(reward, dtype=np.float64)
        sum_reward += np.where(alive, reward, 0.0)
        max_reward = np.where(alive, np.maximum(max_reward, reward), max_reward)
        success |= alive & np.asarray(info["is_success"], dtype=bool)
        steps += alive
        _keep(env, info, recorded, frames, paths, done)
        done |= np.asarray(terminated, dtype=bool) | np.asarray(truncated, dtype=bool)
        if done.all():
            break
    goal = info.get("goal")
    return [
        Episode(
            index=index, seed=seeds[i], sum_reward=float(sum_reward[i]), max_reward=float(max_reward[i]),
            success=bool(success[i]),
            path=[p[i].tolist() for p in paths[: steps[i] + 1]] if paths else None,
            goal=np.asarray(goal)[i].tolist() if goal is not None else None,
            frames=frames.get(i, []),
        )
        for i, index in enumerate(indices)
    ]


def _check_finite(action: np.ndarray, step: int, indices: list[int], seeds: list[int], who: str) -> None:
    finite = np.isfinite(np.asarray(action, dtype=np.float64).reshape(len(indices), -1)).all(axis=1)
    if finite.all():
        return
    i = int(np.argmin(finite))
    raise NonFiniteActionError(
        f"the {who}'s action at step {step} of episode {indices[i]} (seed {seeds[i]}) is not finite (NaN or "
        "infinity), so no episode it drives means anything: its weights or normalisation stats hold NaN or "
        "infinity, or its computation overflows; evaluate an earlier step folder of the run"
    )


def _keep(env: VectorEnv, info: dict, recorded: list[int], frames: dict[int, list[np.ndarray]],
          paths: list[np.ndarray], done: np.ndarray) -> None:
    """Keep the step's positions, and frames of the recorded episodes still running."""
    if "position" in info:
        paths.append(np.asarray(info["position"], dtype=np.float64).copy())
    wanted = [i for i in recorded if not done[i]]
    if not wanted:
        return
    image = env.render()
    if image is not None:
        for i in wanted:
            frames[i].append(np.ascontiguousarray(image[i]))
