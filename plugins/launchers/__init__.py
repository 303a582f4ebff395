"""Built-in launchers: torchrun/elastic, accelerate launch, SLURM srun, a Kubeflow PyTorchJob pod, a plain process."""

from __future__ import annotations

from typing import Callable

from lerobot_kit.api import hookimpl


@hookimpl
def lerobot_register_launchers(register: Callable[..., None]) -> None:
    register("torchrun", "lerobot_kit.plugins.launchers.builtin:TorchrunLauncher")
    register("accelerate", "lerobot_kit.plugins.launchers.builtin:AccelerateLauncher")
    register("slurm", "lerobot_kit.plugins.launchers.builtin:SlurmLauncher")
    register("pytorchjob", "lerobot_kit.plugins.launchers.builtin:PyTorchJobLauncher")
    register("single", "lerobot_kit.plugins.launchers.builtin:SingleProcessLauncher")
