"""Per-member metrics of a mixture's run: each logged row's samples and mean loss per member,
summed over ranks; the built-in policies' per-sample losses agree with their loss.

The runs train a two-member dataset (reach frames; the first episode is one member, the rest
the other) through the real trainer. A policy whose per-sample loss is each sample's index,
and which writes down every batch it sees, gives figures a test can compute by hand.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from _dist_util import describe, start_ranks, wait_ranks
from conftest import TINY_ACT, read_metrics, script
from lerobot_kit.core.data.dataset import ACTION_KEY, MEMBER_KEY
from lerobot_kit.core.distributed.process_group import DistContext
from lerobot_kit.core.model.policy import PER_SAMPLE_LOSS, make_policy
from lerobot_kit.core.model.processor import make_processors
from lerobot_kit.core.run.reporting.member_metrics import MemberMetrics
from lerobot_kit.plugins.datasets.reach.data import make_reach_dataset
from lerobot_kit.plugins.datasets.reach.plugin import ReachDatasetConfig
from lerobot_kit.plugins.policies.act.configuration import ACTConfig
from lerobot_kit.plugins.policies.diffusion.configuration import DiffusionConfig
from plugin_dists import env_with, fresh_registry, make_distribution

NAMES = ("user/first", "lab/second_set")
EPISODES, EPISODE_LENGTH = 4, 10  # member 0: episode 0 (10 frames); member 1: episodes 1-3 (30 frames)
MEMBER_PLUGIN = '''
import json
import math
import os

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from lerobot_kit.api import (INDEX_KEY, MEMBER_KEY, PER_SAMPLE_LOSS, InMemoryDataset, Policy, PolicyConfig,
                             hookimpl)
from lerobot_kit.plugins.datasets.reach.data import make_reach_dataset
from lerobot_kit.plugins.datasets.reach.plugin import ReachDatasetConfig

NAMES = %r


class TwoMembersConfig(ReachDatasetConfig):
    type: str = "two_members"


class TwoMembers(InMemoryDataset):
    """Reach frames as a two-member mixture: the first episode is member 0, the rest member 1."""

    def __init__(self, config, delta_indices):
        reach = make_reach_dataset(config, delta_indices)
        super().__init__(reach.meta, reach.frames, reach.episode_index, delta_indices)
        self.first_member_frames = config.episode_length

    def item(self, i, *, uint8_cameras=False):
        item = super().item(i, uint8_cameras=uint8_cameras)
        item[MEMBER_KEY] = torch.tensor(int(i >= self.first_member_frames), dtype=torch.int64)
        return item

    def member_names(self):
        return list(NAMES)


class IndexLossConfig(PolicyConfig):
    type: str = "index_loss"
    per_sample: bool = True  # report PER_SAMPLE_LOSS
    nan_at_call: int = 0  # this forward call (1-based) of rank nan_rank has a NaN loss; 0: none
    nan_rank: int = 0
    calls_file: str = ""  # each forward's members and indices, one JSON line, in <calls_file>.<rank>


class IndexLossPolicy(Policy):
    """Each sample's loss is its frame index; the weight only gives the loss a gradient (zero)."""

    config_class = IndexLossConfig

    def __init__(self, config, meta):
        rng = torch.get_rng_state()
        super().__init__(config, meta)
        self.weight = nn.Parameter(torch.ones(()))
        self.calls = 0
        self._init_from_entry_rng(rng)

    def init_weights(self):
        nn.init.ones_(self.weight)

    def forward(self, batch):
        self.calls += 1
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        if not isinstance(batch[INDEX_KEY], FakeTensor):  # the run's FLOP count at start: shapes, no batch
            seen = {"member": batch[MEMBER_KEY].tolist(), "index": batch[INDEX_KEY].tolist()}
            with open(f"{self.config.calls_file}.{rank}", "a") as calls:
                calls.write(json.dumps(seen) + "\\n")
        per_sample = batch[INDEX_KEY].float() + 0.0 * self.weight
        if (self.calls, rank) == (self.config.nan_at_call, self.config.nan_rank):
            per_sample = per_sample + torch.tensor([math.nan] + [0.0] * (len(per_sample) - 1))
        metrics = {"index_loss": per_sample.detach().mean()}
        if self.config.per_sample:
            metrics[PER_SAMPLE_LOSS] = per_sample.detach()
        return per_sample.mean(), metrics


@hookimpl
def lerobot_register_datasets(register):
    register("two_members", TwoMembersConfig, TwoMembers)


@hookimpl
def lerobot_register_policies(register):
    register("index_loss", IndexLossConfig, IndexLossPolicy)
''' % (NAMES,)
DATA = ["--dataset.type=two_members", f"--dataset.num_episodes={EPISODES}",
        f"--dataset.episode_length={EPISODE_LENGTH}"]
COMMON = [*DATA, "--num_workers=0", "--save_checkpoint=false"]


@pytest.fixture
def member_site(tmp_path: Path) -> Path:
    return make_distribution(tmp_path / "site", "memberplug", MEMBER_PLUGIN)


@pytest.fixture
def member_plugin(member_site: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process sees the plugin (and forgets it afterwards)."""
    monkeypatch.syspath_prepend(str(member_site))
    fresh_registry(monkeypatch)
    yield
    sys.modules.pop("memberplug", None)


def train_here(*flags: str) -> list[dict[str, float]]:
    """One process trains in this one, through the public entry point; its metrics rows."""
    from lerobot_kit.api import parse_train_config, train

    config = parse_train_config(list(flags))
    train(config)
    return read_metrics(Path(config.output_dir))


def samples_key(name: str) -> str:
    return f"member/{name}/samples"


def loss_key(name: str) -> str:
    return f"member/{name}/loss"


def member_columns(row: dict[str, float]) -> set[str]:
    return {key for key in row if key.startswith("member/")}


def expected_rows(calls: list[list[dict[str, list[int]]]], log_steps: list[int],
                  skipped: set[int]) -> list[dict[str, float]]:
    """Per window, from every rank's batches (``calls[rank][step - 1]``): each member's samples,
    and the mean of its per-sample losses (the frame indices) over the updates not ``skipped``."""
    rows, start = [], 0
    for end in log_steps:
        row: dict[str, float] = {}
        for m, name in enumerate(NAMES):
            drawn = [(step, index) for rank_calls in calls for step in range(start + 1, end + 1)
                     for member, index in zip(rank_calls[step - 1]["member"], rank_calls[step - 1]["index"])
                     if member == m]
            row[samples_key(name)] = len(drawn)
            kept = [index for step, index in drawn if step not in skipped]
            if kept:
                row[loss_key(name)] = sum(kept) / len(kept)
        rows.append(row)
        start = end
    return rows


def read_calls(path: Path) -> list[dict[str, list[int]]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_rows_carry_each_members_samples_and_mean_loss_and_skipped_updates_keep_their_samples_only(
    tmp_path: Path, member_plugin: None, capfd: pytest.CaptureFixture[str]
) -> None:
    """Accumulation of 2 micro-batches, a log every update; the second update (steps 3-4) has a
    NaN loss and is skipped: its window keeps its samples but has no member loss at all."""
    calls = tmp_path / "calls"
    rows = train_here(*COMMON, "--policy.type=index_loss", "--policy.nan_at_call=3", f"--policy.calls_file={calls}",
                      "--batch_size=4", "--steps=7", "--log_freq=2", "--accelerator.gradient_accumulation.steps=2",
                      "--nonfinite=skip", f"--output_dir={tmp_path / 'run'}")
    assert [row["step"] for row in rows] == [2, 4, 6, 7]
    batches = read_calls(Path(f"{calls}.0"))
    assert len(batches) == 7 and all(len(b["index"]) == 4 for b in batches)
    expected = expected_rows([batches], [2, 4, 6, 7], skipped={3, 4})
    for row, wanted in zip(rows, expected):
        assert {key: row[key] for key in member_columns(row)} == pytest.approx(wanted, rel=1e-12)
    assert [sum(row[samples_key(name)] for name in NAMES) for row in rows] == [8, 8, 8, 4]
    assert math.isnan(rows[1]["loss"]) and not member_columns(rows[1]) & {loss_key(n) for n in NAMES}
    # The run's own loss is the samples' mean loss: the members' means, weighted by their samples.
    for row in (rows[0], rows[2], rows[3]):
        weighted = sum(row[loss_key(n)] * row[samples_key(n)] for n in NAMES if loss_key(n) in row)
        assert row["loss"] == pytest.approx(weighted / sum(row[samples_key(n)] for n in NAMES), rel=1e-6)
    assert all(PER_SAMPLE_LOSS not in row for row in rows)
    lines = [line for line in capfd.readouterr().err.splitlines() if re.search(r" step \d+/7 \| loss ", line)]
    assert len(lines) == 4 and not any("member" in line for line in lines)  # the log line is unchanged


def test_a_policy_without_per_sample_losses_gets_samples_only(tmp_path: Path, member_plugin: None) -> None:
    rows = train_here(*COMMON, "--policy.type=index_loss", "--policy.per_sample=false",
                      f"--policy.calls_file={tmp_path / 'calls'}", "--batch_size=5", "--steps=2", "--log_freq=1",
                      f"--output_dir={tmp_path / 'run'}")
    assert [member_columns(row) for row in rows] == [{samples_key(n) for n in NAMES}] * 2
    assert [sum(row[samples_key(n)] for n in NAMES) for row in rows] == [5, 5]
    assert "index_loss" in rows[0] and PER_SAMPLE_LOSS not in rows[0]


def test_act_on_a_mixture_logs_member_losses_whose_weighted_mean_is_its_loss(tmp_path: Path,
                                                                              member_plugin: None) -> None:
    rows = train_here(*COMMON, *TINY_ACT, "--batch_size=6", "--steps=4", "--log_freq=2",
                      f"--output_dir={tmp_path / 'run'}")
    assert [row["step"] for row in rows] == [2, 4]
    for row in rows:
        counts = [row[samples_key(n)] for n in NAMES]
        assert sum(counts) == 12 and all(isinstance(c, int) for c in counts)
        weighted = sum(row[loss_key(n)] * row[samples_key(n)] for n in NAMES if row[samples_key(n)])
        assert row["loss"] == pytest.approx(weighted / 12, rel=1e-5)
        assert PER_SAMPLE_LOSS not in row and {"l1_loss", "kld_loss"} <= set(row)


@pytest.mark.slow  # starts two processes
def test_two_ranks_sum_their_samples_and_losses(tmp_path: Path, member_site: Path) -> None:
    """A real two-process run (gloo): each row's figures are those of both ranks' batches;
    rank 1's NaN at step 2 skips that update on both ranks, so neither's losses count."""
    calls = tmp_path / "calls"
    run = tmp_path / "run"
    argv = [script("lerobot"), "train", *COMMON, "--policy.type=index_loss", "--policy.nan_at_call=2",
            "--policy.nan_rank=1", f"--policy.calls_file={calls}", "--nonfinite=skip", "--batch_size=3",
            "--steps=4", "--log_freq=2", f"--output_dir={run}"]
    ranks = start_ranks(argv, 2, tmp_path, extra_env=env_with(member_site))
    codes = wait_ranks(ranks, timeout=180)
    assert codes == [0, 0], describe(ranks)
    rows = read_metrics(run)
    assert [row["step"] for row in rows] == [2, 4]
    batches = [read_calls(Path(f"{calls}.{rank}")) for rank in (0, 1)]
    expected = expected_rows(batches, [2, 4], skipped={2})
    for row, wanted in zip(rows, expected):
        assert {key: row[key] for key in member_columns(row)} == pytest.approx(wanted, rel=1e-12)
        assert sum(row[samples_key(n)] for n in NAMES) == 2 * 3 * 2


ONE_PROCESS = DistContext(0, 0, 1, torch.device("cpu"), "single", None)


def test_member_sums_are_kept_per_update_and_checked() -> None:
    metrics = MemberMetrics(NAMES, torch.device("cpu"))
    member = torch.tensor([1, 0, 1, 1])
    metrics.add({MEMBER_KEY: member}, torch.tensor([1.0, 2.0, 3.0, 5.0]))
    metrics.end_update(applied=True)
    metrics.add({MEMBER_KEY: member}, torch.tensor([9.0, 9.0, 9.0, math.nan]))
    metrics.end_update(applied=False)
    assert metrics.window_row(ONE_PROCESS) == {samples_key(NAMES[0]): 2, loss_key(NAMES[0]): 2.0,
                                               samples_key(NAMES[1]): 6, loss_key(NAMES[1]): 3.0}
    assert metrics.window_row(ONE_PROCESS) == {samples_key(NAMES[0]): 0, samples_key(NAMES[1]): 0}
    with pytest.raises(ValueError, match=r"per_sample_loss.* has shape \(3,\), expected one loss per sample"):
        metrics.add({MEMBER_KEY: member}, torch.zeros(3))
    with pytest.raises(ValueError, match=r"a batch has no 'member' key"):
        metrics.add({}, None)
    single = MemberMetrics([], torch.device("cpu"))
    single.add({}, torch.zeros(3))  # a single dataset: nothing to check, nothing to log
    single.end_update(applied=True)
    assert single.window_row(ONE_PROCESS) == {}


def _reach_batch(config: ACTConfig | DiffusionConfig) -> tuple[object, dict[str, torch.Tensor]]:
    """A batch with padded actions (frames near an episode's end)."""
    dataset = make_reach_dataset(ReachDatasetConfig(num_episodes=2, episode_length=10), config.delta_indices())
    pre, _ = make_processors(config, dataset.meta)
    batch = pre(torch.utils.data.default_collate([dataset[i] for i in (0, 4, 8, 9, 15, 19)]))
    assert batch[f"{ACTION_KEY}_is_pad"].any()
    return dataset.meta, batch


@pytest.mark.parametrize("use_vae", [False, True])
def test_act_per_sample_losses_average_to_its_loss(use_vae: bool) -> None:
    config = ACTConfig(dim_model=16, n_heads=2, dim_feedforward=32, n_encoder_layers=1, n_vae_encoder_layers=1,
                       latent_dim=4, chunk_size=4, n_action_steps=2, use_vae=use_vae)
    meta, batch = _reach_batch(config)
    torch.manual_seed(0)
    loss, metrics = make_policy(config, meta)(batch)
    per_sample = metrics[PER_SAMPLE_LOSS]
    assert per_sample.shape == (6,) and not per_sample.requires_grad
    torch.testing.assert_close(per_sample.mean(), loss.detach())


@pytest.mark.parametrize("mask_padded_actions", [False, True])
def test_diffusion_per_sample_losses_average_to_its_loss_weighted_by_valid_actions(mask_padded_actions: bool) -> None:
    config = DiffusionConfig(dim_model=16, n_heads=2, dim_feedforward=32, n_layers=1, horizon=4, n_action_steps=2,
                             n_obs_steps=1, num_train_timesteps=10, num_inference_steps=2,
                             mask_padded_actions=mask_padded_actions)
    meta, batch = _reach_batch(config)
    torch.manual_seed(0)
    loss, metrics = make_policy(config, meta)(batch)
    per_sample = metrics[PER_SAMPLE_LOSS]
    assert per_sample.shape == (6,) and not per_sample.requires_grad
    weights = (~batch[f"{ACTION_KEY}_is_pad"]).sum(1).float() if mask_padded_actions else torch.ones(6)
    torch.testing.assert_close((per_sample * weights).sum() / weights.sum(), loss.detach())
