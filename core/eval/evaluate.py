"""One evaluation: this rank's share of the episodes, by the policy and by the expert, then
videos, ``eval_info.json`` and ``rollouts.png``.

Shared by ``lerobot eval`` and evaluation during training, so the two cannot disagree.
Everything a run could get wrong is checked when the ``Evaluator`` is built (the
environment type, its features against the policy's, PyAV for videos), before any
episode runs — and, in training, before the first step.

The torch RNG is forked for the whole evaluation and seeded per batch from the batch's
first episode seed: a stochastic policy draws the same noise for a batch wherever it
runs, and training's RNG streams come out exactly as they went in.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lerobot_kit.core.config.schema import EnvConfig, EvalConfig
from lerobot_kit.core.data.dataset import DatasetMeta
from lerobot_kit.core.distributed.process_group import DistContext
from lerobot_kit.core.eval.actor import check_env_features, policy_actor
from lerobot_kit.core.eval.env import Observation, VectorEnv
from lerobot_kit.core.eval.metrics import eval_info
from lerobot_kit.core.eval.plot import write_rollout_plot
from lerobot_kit.core.eval.reduce import episode_batches, gather_to_main, rank_share
from lerobot_kit.core.eval.rollout import Actor, Episode, run_batch
from lerobot_kit.core.eval.video import import_av, write_mp4
from lerobot_kit.core.layout.json_file import write_json
from lerobot_kit.core.model.policy import Policy
from lerobot_kit.core.model.processor import PolicyProcessor
from lerobot_kit.core.registry.registry import get_registry

EVAL_INFO = "eval_info.json"
VIDEOS_DIR = "videos"
PLOT = "rollouts.png"


class Evaluator:
    def __init__(self, env: EnvConfig, options: EvalConfig, seed: int, ctx: DistContext, meta: DatasetMeta) -> None:
        self.env_config = env
        self.options = options
        self.seed = seed
        self.ctx = ctx
        self.entry = get_registry().env(env.type)
        self._envs: dict[int, VectorEnv] = {}
        probe = self.entry.build(env, min(options.batch_size, options.n_episodes))
        try:
            check_env_features(meta, probe.features, env.type)
            self.fps = probe.fps
            # Decided once, from the class, so every rank takes the same collectives whatever its share.
            self.has_expert = type(probe).expert_action is not VectorEnv.expert_action
        finally:
            probe.close()
        if options.max_episodes_rendered:
            import_av()

    def _env(self, num_envs: int) -> VectorEnv:
        """One environment per batch size (at most two: full batches and the last one), kept
        until ``close``."""
        if num_envs not in self._envs:
            self._envs[num_envs] = self.entry.build(self.env_config, num_envs)
        return self._envs[num_envs]

    def close(self) -> None:
        """Close the environments; the next evaluation builds them again. Between evaluations
        during training, a simulator holds nothing."""
        for env in self._envs.values():
            env.close()
        self._envs.clear()

    def run(self, policy: Policy, preprocessor: PolicyProcessor, postprocessor: PolicyProcessor,
            output_dir: Path, setup: dict[str, Any]) -> dict[str, Any] | None:
        """Collective: every rank calls it. ``eval_info`` on the main process, None elsewhere.

        ``eval_s`` is the slowest rank's time for its share of policy rollouts: the wall
        time of the evaluation's rollouts, which run on all ranks at once.
        """
        try:
            return self._run(policy, preprocessor, postprocessor, output_dir, setup)
        finally:
            self.close()

    def _run(self, policy: Policy, preprocessor: PolicyProcessor, postprocessor: PolicyProcessor,
             output_dir: Path, setup: dict[str, Any]) -> dict[str, Any] | None:
        batches = rank_share(episode_batches(self.options.n_episodes, self.options.batch_size),
                             self.ctx.rank, self.ctx.world_size)
        started = time.perf_counter()
        episodes = self._policy_episodes(policy, preprocessor, postprocessor, batches)
        policy_s = time.perf_counter() - started
        episodes = [self._write_video(e, output_dir) for e in episodes]
        started = time.perf_counter()
        expert = self._expert_episodes(batches) if self.has_expert else []
        expert_s = time.perf_counter() - started
        parts = gather_to_main(self.ctx, (episodes, expert, policy_s, expert_s))
        if not self.ctx.is_main:
            return None
        everyone = _merge(p[0] for p in parts)
        info = eval_info(
            everyone, max(p[2] for p in parts),
            _merge(p[1] for p in parts) if self.has_expert else None, max(p[3] for p in parts),
            {**setup, "env": self.env_config.model_dump(mode="json"), "seed": self.seed,
             "n_episodes": self.options.n_episodes, "batch_size": self.options.batch_size},
        )
        output_dir.mkdir(parents=True, exist_ok=True)
        write_json(output_dir / EVAL_INFO, info)
        write_rollout_plot(output_dir / PLOT, everyone)
        return info

    def _policy_episodes(self, policy: Policy, preprocessor: PolicyProcessor, postprocessor: PolicyProcessor,
                         batches: list[list[int]]) -> list[Episode]:
        policy.eval()
        act = policy_actor(policy, preprocessor, postprocessor, self.ctx.device)
        record = set(range(self.options.max_episodes_rendered))
        episodes: list[Episode] = []
        devices = [self.ctx.device] if self.ctx.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            for indices in batches:
                seeds = [self.seed + i for i in indices]
                torch.manual_seed(seeds[0])
                policy.reset()
                episodes += run_batch(self._env(len(indices)), act, indices, seeds, record, who="policy")
        return episodes

    def _expert_episodes(self, batches: list[list[int]]) -> list[Episode]:
        """The scripted expert on the same episodes and seeds."""
        episodes: list[Episode] = []
        for indices in batches:
            env = self._env(len(indices))
            seeds = [self.seed + i for i in indices]
            episodes += run_batch(env, _expert_actor(env), indices, seeds, set(), who="expert")
        return episodes

    def _write_video(self, episode: Episode, output_dir: Path) -> Episode:
        """The episode with its video written and named, and without its frames (they are not sent to rank 0)."""
        if not episode.frames:
            return episode
        name = f"{VIDEOS_DIR}/eval_episode_{episode.index}.mp4"
        write_mp4(output_dir / name, episode.frames, self.fps)
        return dataclasses.replace(episode, frames=[], video=name)


def _expert_actor(env: VectorEnv) -> Actor:
    """The environment's scripted expert as an actor (it reads the environment's state, not the observation)."""
    def act(_: Observation) -> np.ndarray:
        action = env.expert_action()
        assert action is not None  # only asked of environments that override expert_action
        return action

    return act


def _merge(parts: Iterable[list[Episode]]) -> list[Episode]:
    return sorted((e for part in parts for e in part), key=lambda e: e.index)
