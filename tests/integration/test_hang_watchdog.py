"""``--parallelism.step_timeout_s``: a rank made to hang inside a step (the test-only
``LEROBOT_KIT_FAULT=...,action=hang``) prints every thread's stack with its rank and step,
and every rank exits non-zero within the timeout plus 30 s — long before the 600 s
collective timeout would end the run. Real rank processes of the console script."""

from __future__ import annotations

import json
import time

from _dist_util import describe, start_ranks, wait_ranks
from conftest import TINY_ACT, script

STEP_TIMEOUT_S = 10


def test_a_hung_rank_dumps_its_stacks_and_every_rank_exits_non_zero(tmp_path):
    fault_log = tmp_path / "faults.jsonl"
    argv = [script("lerobot"), "train", *TINY_ACT, "--dataset.num_episodes=2", "--dataset.episode_length=20",
            "--batch_size=4", "--steps=50", "--save_freq=50", "--parallelism.dp_shard=2",
            f"--parallelism.step_timeout_s={STEP_TIMEOUT_S}", f"--output_dir={tmp_path / 'run'}"]
    env = {"LEROBOT_KIT_FAULT": "point=forward,step=3,rank=1,action=hang", "LEROBOT_KIT_FAULT_LOG": str(fault_log)}
    ranks = start_ranks(argv, 2, tmp_path, extra_env=env)
    codes = wait_ranks(ranks, timeout=600)
    [fault] = [json.loads(line) for line in fault_log.read_text().splitlines()]
    assert (fault["rank"], fault["step"], fault["action"]) == (1, 3, "hang")
    assert time.time() - fault_log.stat().st_mtime < STEP_TIMEOUT_S + 30 + 5, describe(ranks)  # + wait_ranks' poll
    assert codes[1] == 124 and codes[0] != 0, describe(ranks)
    hung = ranks[1].output()
    assert "rank 1: step 3 has run for" in hung and f"--parallelism.step_timeout_s={STEP_TIMEOUT_S}" in hung
    assert "Current thread" in hung and "most recent call first" in hung, hung[-3000:]
    assert "fault_injection.py" in hung  # the hung main thread's stack, down to where it hangs
