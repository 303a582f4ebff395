"""Launcher detection and process-group start-up, with real launchers and real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _dist_util import (  # noqa: E402
    SPIN_TIMEOUT_S,
    check_probe,
    clean_env,
    describe,
    free_port,
    start_ranks,
    wait_ranks,
)

from lerobot_kit.core.errors import ConfigError  # noqa: E402
from lerobot_kit.plugins.launchers.builtin import first_slurm_host  # noqa: E402

DIST_UTIL = str(Path(__file__).resolve().parent / "_dist_util.py")
BIN = Path(sys.executable).parent

# What the launchers really export (captured from torchrun / accelerate launch / srun children).
TORCHRUN = {
    "TORCHELASTIC_RUN_ID": "none", "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4",
    "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400", "GROUP_RANK": "1", "LOCAL_WORLD_SIZE": "2",
}
ACCELERATE = {
    **TORCHRUN, "ACCELERATE_MIXED_PRECISION": "no", "ACCELERATE_DYNAMO_BACKEND": "NO",
    "ACCELERATE_DYNAMO_MODE": "default",
}
SRUN = {
    "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": "5", "SLURM_NTASKS": "8",
    "SLURM_LOCALID": "1", "SLURM_STEP_NODELIST": "gpu[07-08,11],login1", "SLURM_JOB_NODELIST": "gpu[01-12]",
}


def detect(env: dict[str, str]) -> tuple[str, object]:
    from lerobot_kit.core.distributed.process_group import detect_launcher

    launcher = detect_launcher(env)
    return launcher.name, launcher.read(env)


def test_every_builtin_launcher_is_registered_in_a_fixed_order() -> None:
    from lerobot_kit.core.registry.registry import get_registry

    registry = get_registry()
    classes = [registry.get("launcher", n).load() for n in registry.names("launcher")]
    assert sorted((c.priority, c.name) for c in classes) == [
        (10, "accelerate"), (20, "torchrun"), (30, "slurm"), (1000, "single"),
    ]


def test_launchers_read_their_environment() -> None:
    name, launch = detect(TORCHRUN)
    assert name == "torchrun"
    assert (launch.rank, launch.local_rank, launch.world_size, launch.master_addr, launch.master_port) == (
        3, 1, 4, "10.0.0.1", 29400,
    )
    assert detect(ACCELERATE)[0] == "accelerate" and detect(ACCELERATE)[1] == launch
    cpu = detect({**ACCELERATE, "ACCELERATE_USE_CPU": "True"})[1]
    assert cpu.cpu and cpu.rank == 3
    one = detect({"ACCELERATE_MIXED_PRECISION": "no", "ACCELERATE_DYNAMO_BACKEND": "NO", "ACCELERATE_USE_CPU": "False"})
    assert one[0] == "accelerate" and one[1].world_size == 1 and one[1].master_addr is None
    name, launch = detect(SRUN)
    assert name == "slurm"
    assert (launch.rank, launch.local_rank, launch.world_size, launch.master_addr, launch.master_port) == (
        5, 1, 8, "gpu07", 10000 + 4242,
    )
    assert detect({**SRUN, "MASTER_ADDR": "head", "MASTER_PORT": "1234"})[1].master_addr == "head"
    assert detect({**SRUN, **TORCHRUN})[0] == "torchrun"  # `srun torchrun ...`: torchrun's children
    name, launch = detect({"HOME": "/root"})
    assert name == "single" and launch.world_size == 1 and launch.rank == 0


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"WORLD_SIZE": "2", "RANK": "0"}, "WORLD_SIZE=2 is set but LOCAL_RANK, MASTER_ADDR are not"),
        ({**TORCHRUN, "RANK": "x"}, "RANK='x' is not an integer"),
        ({**TORCHRUN, "RANK": "4"}, "rank 4, local rank 1 and world size 4, which is inconsistent"),
        ({k: v for k, v in SRUN.items() if "NODELIST" not in k}, "export MASTER_ADDR"),
    ],
)
def test_malformed_launch_environment_is_a_clear_error(env: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        detect(env)


@pytest.mark.parametrize(
    ("nodelist", "host"),
    [("node1", "node1"), ("gpu[03-05,9],cpu1", "gpu03"), ("a1,b[1-2]", "a1"), ("rack[2-3]-n[010-012]", "rack2-n010")],
)
def test_first_slurm_host(nodelist: str, host: str) -> None:
    assert first_slurm_host(nodelist) == host


def test_a_plain_process_creates_no_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    from lerobot_kit.core.distributed.process_group import all_reduce_mean, broadcast_object, init_distributed, shutdown

    for key in set(os.environ) - set(clean_env(Path("."))):
        monkeypatch.delenv(key)
    ctx = init_distributed(timeout_s=5)
    assert (ctx.launcher, ctx.rank, ctx.world_size, ctx.backend, ctx.is_main, ctx.distributed) == (
        "single", 0, 1, None, True, False,
    )
    assert not dist.is_initialized()
    assert all_reduce_mean(ctx, {"loss": 2.5}) == {"loss": 2.5}
    assert broadcast_object(ctx, [1]) == [1]
    shutdown(ctx)


@pytest.mark.timeout(90)
def test_torchrun_starts_two_ranks(tmp_path: Path) -> None:
    torchrun = BIN / "torchrun"
    proc = subprocess.run(
        [str(torchrun), "--nproc-per-node=2", f"--master-port={free_port()}", DIST_UTIL, "probe", str(tmp_path)],
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
