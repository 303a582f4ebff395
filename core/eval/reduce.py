"""Which episodes each rank runs, and how their results come back to the main process.

Episodes are cut into batches of ``--eval.batch_size`` in index order and the batches
are dealt round-robin to ranks. A batch is the same set of episodes, with the same
policy seed, whatever the number of processes, so a rank's share computes exactly what
one process computes for those episodes, and the gathered results equal a one-process
evaluation with the same batch size (batch composition can change a policy's numbers:
a diffusion policy draws its noise per batch, and matmul kernels vary with batch size).
"""

from __future__ import annotations

from typing import TypeVar

from lerobot_kit.core.distributed.process_group import DistContext

T = TypeVar("T")


def episode_batches(n_episodes: int, batch_size: int) -> list[list[int]]:
    return [list(range(start, min(start + batch_size, n_episodes))) for start in range(0, n_episodes, batch_size)]


def rank_share(batches: list[list[int]], rank: int, world_size: int) -> list[list[int]]:
    return batches[rank::world_size]


def gather_to_main(ctx: DistContext, part: T) -> list[T]:
    """Collective: every rank's ``part``, in rank order, on the main process (an empty list elsewhere)."""
    if not ctx.distributed:
        return [part]
    import torch.distributed as dist

    parts: list[T] | None = [part] * ctx.world_size if ctx.is_main else None
    dist.gather_object(part, parts, dst=0)
    return parts or []
