"""What each built-in launcher reports about restarts, from the environment it leaves."""

from __future__ import annotations

from lerobot_kit.plugins.launchers.builtin import SingleProcessLauncher, SlurmLauncher, TorchrunLauncher

TORCHRUN = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29400",
            "TORCHELASTIC_RUN_ID": "x"}


def test_torchrun_restart_count_budget_and_agent_store():
    first = TorchrunLauncher.read({**TORCHRUN, "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "3",
                                   "TORCHELASTIC_USE_AGENT_STORE": "True"})
    assert (first.restart_count, first.max_restarts, first.agent_store) == (0, 3, True)
    again = TorchrunLauncher.read({**TORCHRUN, "TORCHELASTIC_RESTART_COUNT": "2", "TORCHELASTIC_MAX_RESTARTS": "3",
                                   "TORCHELASTIC_USE_AGENT_STORE": "False"})
    assert (again.restart_count, again.agent_store) == (2, False)
    # `srun torchrun` requeued: a new agent counts from 0, SLURM remembers the requeue.
    assert TorchrunLauncher.read({**TORCHRUN, "SLURM_RESTART_COUNT": "1"}).restart_count == 1


def test_slurm_requeues_count_as_restarts():
    env = {"SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "n[1-2]",
           "SLURM_JOB_ID": "7"}
    assert SlurmLauncher.read(env).restart_count == 0
    assert SlurmLauncher.read({**env, "SLURM_RESTART_COUNT": "3"}).restart_count == 3
    assert SingleProcessLauncher.read({"SLURM_RESTART_COUNT": "1"}).restart_count == 1
    assert SingleProcessLauncher.read({}).restart_count == 0
