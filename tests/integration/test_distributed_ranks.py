"""Process-group start-up with real launchers (torchrun, accelerate launch) and real rank
processes, and what the survivors do when a rank dies or hangs."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _dist_util import DIST_UTIL, SPIN_TIMEOUT_S, check_probe, clean_env, describe, free_port, start_ranks, wait_ranks

BIN = Path(sys.executable).parent


@pytest.mark.timeout(90)
def test_torchrun_starts_two_ranks(tmp_path: Path) -> None:
    torchrun = BIN / "torchrun"
    proc = subprocess.run(
        [str(torchrun), "--standalone", "--nproc-per-node=2", DIST_UTIL, "probe", str(tmp_path)],
        capture_output=True, text=True, timeout=80, env=clean_env(tmp_path),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check_probe([json.loads((tmp_path / f"result{r}.json").read_text()) for r in range(2)], "torchrun")


@pytest.mark.timeout(90)
@pytest.mark.parametrize("fault", ["killed", "stopped"])
def test_a_dead_or_stuck_rank_makes_the_survivor_fail(fault: str, tmp_path: Path) -> None:
    """Killed: the survivor sees the closed connection at once. Stopped (SIGSTOP, a hung
    process): the collective timeout (5 s) ends the survivor. Either way non-zero, no hang."""
    ranks = start_ranks([DIST_UTIL, "spin", str(tmp_path)], 2, tmp_path)
    try:
        deadline = time.monotonic() + 40
        while not all((tmp_path / f"ready{r}").exists() for r in range(2)):
            assert time.monotonic() < deadline, f"ranks never got ready:\n{describe(ranks)}"
            assert all(r.proc.poll() is None for r in ranks), f"a rank died early:\n{describe(ranks)}"
            time.sleep(0.1)
        ranks[1].proc.send_signal(signal.SIGKILL if fault == "killed" else signal.SIGSTOP)
        faulted_at = time.monotonic()
        code = wait_ranks(ranks[:1], timeout=SPIN_TIMEOUT_S + 20)[0]
        elapsed = time.monotonic() - faulted_at
    finally:
        for r in ranks:
            if r.proc.poll() is None:
                r.proc.kill()
                r.proc.wait()
    assert code != 0, describe(ranks)
    if fault == "stopped":
        assert elapsed >= SPIN_TIMEOUT_S - 1, f"failed after {elapsed:.1f}s, before the timeout: {describe(ranks[:1])}"
        assert "Timed out" in ranks[0].output()


def _two_nodes(commands: list[list[str]], tmp_path: Path) -> list[dict]:
    """Two 'machines' on loopback, one process each, started like two shells would."""
    env = clean_env(tmp_path)
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        for cmd in commands
    ]
    try:
        outputs = [proc.communicate(timeout=80)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(outputs)
    return [json.loads((tmp_path / f"result{r}.json").read_text()) for r in range(2)]


@pytest.mark.timeout(120)
def test_torchrun_two_nodes_on_loopback(tmp_path: Path) -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    results = _two_nodes(
        [
            [str(BIN / "torchrun"), "--nnodes=2", f"--node-rank={node}", "--nproc-per-node=1",
             f"--rdzv-endpoint={endpoint}", DIST_UTIL, "probe", str(tmp_path)]
            for node in (0, 1)
        ],
        tmp_path,
    )
    check_probe(results, "torchrun")
    assert [r["local_rank"] for r in results] == [0, 0]


@pytest.mark.timeout(120)
def test_accelerate_two_machines_on_loopback(tmp_path: Path) -> None:
    accelerate = BIN / "accelerate"
    assert accelerate.exists(), "accelerate is part of the test extras: pip install -e '.[test]'"
    port = free_port()
    results = _two_nodes(
        [
            [str(accelerate), "launch", "--multi_gpu", "--num_processes=2", "--num_machines=2",
             f"--machine_rank={machine}", "--main_process_ip=127.0.0.1", f"--main_process_port={port}",
             DIST_UTIL, "probe", str(tmp_path)]
            for machine in (0, 1)
        ],
        tmp_path,
    )
    check_probe(results, "accelerate")
    assert [r["local_rank"] for r in results] == [0, 0]
