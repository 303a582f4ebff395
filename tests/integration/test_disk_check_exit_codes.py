"""FSDP(2) under torchrun, where the check before a save finds too little room: every rank
prints the one line and exits 1.

The ranks refuse together (the check compares every rank's share in one all-gather), so
they close their process group together and then ignore further stop signals while they
exit. Before, each left its group to the interpreter's exit — which could die of SIGABRT
tearing it down after a peer had gone — and torchrun's SIGTERM to the ranks still exiting
once the first had exited turned their exit code into -15 (7 runs in 10 here). The output
folder is a real 8 MB tmpfs (tests run as root); rank 0 alone needs about 16 MB.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from conftest import launch_env, script, tmpfs

# 1.87 M parameters: 7.5 MB of fp32 weights, so rank 0's share of a checkpoint is about 16 MB.
MODEL = ["--policy.dim_model=128", "--policy.dim_feedforward=512", "--policy.n_encoder_layers=6"]
RUN = [*MODEL, "--dataset.num_episodes=2", "--dataset.episode_length=20", "--batch_size=2", "--log_freq=1",
       "--steps=4", "--save_freq=2", "--parallelism.dp_shard=2"]


def test_every_rank_refused_by_the_disk_check_exits_1(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "disk", "size=8m") as disk:
        run = disk / "run"
        command = [script("torchrun"), "--standalone", "--nproc-per-node=2", script("lerobot"), "train", *RUN,
                   f"--output_dir={run}"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                                env=launch_env(tmp_path))
        output = result.stdout + result.stderr
        assert not (run / "checkpoints").exists() or not any((run / "checkpoints").iterdir()), output[-4000:]
    # torchrun's summary lists every failed rank with its exit code.
    codes = sorted(int(code) for code in re.findall(r"exitcode\s*:\s*(-?\d+) \(pid", output))
    assert result.returncode == 1 and codes == [1, 1], output[-5000:]
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 2, output[-5000:]
    for line in errors:
        assert line.startswith(f"error: checkpoint of step 2 not written: {run / 'checkpoints'} has "), line
        assert "needs about" in line and "no checkpoint yet" in line, line
    ours = [line for line in output.splitlines() if line.startswith('  File "') and "torch/distributed" not in line
            and not re.search(r'/torchrun", line \d+, in <module>$', line)]
    assert not ours and "terminate called" not in output, output[-5000:]  # torchrun's own report aside
