"""Launcher detection from the environment each launcher exports, and a plain process's start-up."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from _dist_util import clean_env
from lerobot_kit.core.errors import ConfigError
from lerobot_kit.plugins.launchers.builtin import first_slurm_host

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

    assert [(c.priority, c.name) for c in get_registry().launchers()] == [
        (10, "accelerate"), (20, "torchrun"), (25, "pytorchjob"), (30, "slurm"), (1000, "single"),
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
