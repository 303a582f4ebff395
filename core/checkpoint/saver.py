"""The trainer's checkpoint schedule, synchronous or with DCP shards written in the background.

Synchronous (the default), a save returns once the checkpoint is on the disk and
published. With ``async_checkpoint`` in a sharded run, a save returns once every DCP
shard state is copied into memory: a background thread per rank writes the shards while
training goes on, coordinating over a gloo group of its own so that its collectives
never interleave with the training ones. The checkpoint stays a ``.tmp`` folder until
every write is done; then the main process publishes it (fsync, rename, ``last``), as
crash-safe as a synchronous save. At most one save is in flight: the next save first
waits for it, which bounds the extra memory to one staged copy of the sharded state.

A write that fails (a full disk, a read-only file system, a quota) stops every rank
alike with one line, the unfinished ``.tmp`` removed (``write_failures``). In the
background the ranks' threads agree on their side group, and each rank raises the line
at the next point every rank reaches together (the next save, or ``finish``); a rank
that sees the failure earlier (``poll``), and a publish that the main process alone
sees refused, are told to ``refused``, whose caller stops every rank at one step.

Files other than shards (gathered weights, configs, RNG, scheduler) are small or need
the gather anyway, so they are still written before the save returns.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from lerobot_kit.core.checkpoint import disk_space, retention, write_failures
from lerobot_kit.core.checkpoint.save_digests import gather_digests, own_shard_digests
from lerobot_kit.core.checkpoint.save_restore import save_checkpoint, write_checkpoint
from lerobot_kit.core.checkpoint.shard_writes import deferred_shard_writes, write_deferred
from lerobot_kit.core.checkpoint.state import CheckpointState
from lerobot_kit.core.distributed.process_group import barrier
from lerobot_kit.core.errors import CheckpointError, LerobotError, first_line, os_error_line
from lerobot_kit.core.layout import atomic
from lerobot_kit.core.layout.manifest import FileDigest

logger = logging.getLogger("lerobot_kit")


@dataclass
class _InFlight:
    step: int
    future: Future[dict[str, FileDigest]]  # every rank's digests of its shard files
    needed: int  # bytes all ranks write for it, for the message if the disk fills up


@dataclass(frozen=True)
class SaveSettings:
    """How a run checkpoints: in the background or not, how many step folders it keeps."""

    async_checkpoint: bool
    keep_last_checkpoints: int
    timeout_s: float  # of the background writer's own process group


class CheckpointSaver:
    def __init__(self, state: CheckpointState, settings: SaveSettings, refused: Callable[[str, str], None]) -> None:
        """``refused(what, fix)``: a background save failed where this rank cannot raise alone."""
        self.state = state
        self.settings = settings
        self.refused = refused
        sharded = state.facts.sharded
        self.background = settings.async_checkpoint and sharded
        self.last: Path | None = None
        self._in_flight: _InFlight | None = None
        self._group: Any = None
        self._stager: Any = None
        self._writer: ThreadPoolExecutor | None = None
        if settings.async_checkpoint and not sharded and state.ctx.is_main:
            logger.warning(
                "async_checkpoint: this run is not sharded, so it saves gathered files, synchronously; "
                "the flag only applies to DCP shards (--parallelism.dp_shard > 1)"
            )
        if self.background:
            import torch
            import torch.distributed as dist
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            # Collective, so every rank creates it here, at the same point of start-up.
            self._group = dist.new_group(backend="gloo", timeout=timedelta(seconds=settings.timeout_s))
            # Kept for the run: it reuses its host buffers from one save to the next.
            self._stager = DefaultStager(StagingOptions(
                use_pinned_memory=torch.cuda.is_available(), use_shared_memory=False,
                use_async_staging=False, use_non_blocking_copy=False,
            ))
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lerobot-checkpoint")

    def save(self, step: int) -> None:
        """Collective: every rank calls it at the same step, with the run's state as it stands."""
        if not self.background:
            needed = disk_space.check_room(self.state, step)
            with write_failures.cleaned_up(self.state, step, needed):
                final = save_checkpoint(self.state, step)
            self._published(final)
            return
        self.wait()  # the staged buffers are reused: the previous write must be done
        needed = disk_space.check_room(self.state, step)
        with write_failures.cleaned_up(self.state, step, needed):
            with deferred_shard_writes(self._stager) as deferred:
                write_checkpoint(self.state, step)
        assert self._writer is not None
        tmp = atomic.temp_step_dir(self.state.output_dir, step)
        future = self._writer.submit(_write_and_hash, self.state, deferred.writes, self._group, tmp)
        self._in_flight = _InFlight(step, future, needed)

    def poll(self) -> None:
        """Publish the checkpoint in flight if its writes are done; never waits, no collective.

        Each rank checks only its own writer: DCP's last step gathers every rank's write
        results before any rank's ``save`` returns, so the main process's writer being
        done means all shards of all ranks are on the disk. A failed write is left in
        flight, for the next save or ``finish`` to raise on every rank alike.
        """
        in_flight = self._in_flight
        if in_flight is None or not in_flight.future.done():
            return
        if in_flight.future.exception() is not None:
            self.refused(f"the background checkpoint of step {in_flight.step} failed", write_failures.fix_for(None))
            return
        self.wait()

    def finish(self) -> Path | None:
        """Collective: wait for the save in flight, publish it; the last published checkpoint."""
        if self.background:
            self.wait()
            assert self._writer is not None
            self._writer.shutdown()
            self._stager.close()
            barrier(self.state.ctx)
        return self.last

    def wait(self) -> None:
        """Block until the save in flight is written, then publish it (main process); no collective,
        except for a failed write, which every rank raises here alike (``poll`` leaves it for
        the next save or ``finish``, which every rank reaches together)."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is None:
            return
        try:
            with write_failures.cleaned_up(self.state, in_flight.step, in_flight.needed):
                digests = in_flight.future.result()
        except LerobotError:
            raise
        except BaseException as exc:  # DCP's CheckpointException is a BaseException
            cause = disk_space.root_error(exc)
            raise CheckpointError(
                f"the background checkpoint of step {in_flight.step} failed, so it was not published "
                f"({type(cause).__name__}: {first_line(cause)}); the previous checkpoint is intact"
            ) from exc
        if self.state.ctx.is_main:
            self._publish(in_flight.step, digests)

    def _publish(self, step: int, digests: dict[str, FileDigest]) -> None:
        """Main process: publish the written checkpoint of ``step``. Refused by the file system, the
        folder is removed and ``refused`` told (the other ranks are elsewhere: nothing is raised)."""
        try:
            final = atomic.publish(self.state.output_dir, step, digests)
        except (OSError, CheckpointError) as exc:
            removed = write_failures.remove_unfinished(self.state, step)
            if isinstance(exc, OSError):
                self.refused(f"checkpoint of step {step} not published: {os_error_line(exc)}; {removed}",
                             write_failures.fix_for(exc.errno))
            else:
                self.refused(f"checkpoint of step {step} not published: {exc}; {removed}", "")
            return
        logger.debug("checkpoint of step %d published", step)
        self._published(final)

    def _published(self, final: Path | None) -> None:
        """After a publish (``final`` on the main process only): older step folders may go."""
        if final is None:
            return
        self.last = final
        retention.prune(self.state.output_dir, int(final.name), self.settings.keep_last_checkpoints)


def _write_and_hash(
    state: CheckpointState, writes: list[tuple[dict[str, Any], Path]], group: Any, step_dir: Path
) -> dict[str, FileDigest]:
    """Background thread, collective over ``group``: the queued shard writes, then every rank's
    digests of the shard files it wrote, for the main process's manifest. A failed write
    raises ``SaveFailed`` in every rank's thread alike."""
    with write_failures.save_phase(state, group):
        write_deferred(writes, group)
        mine = own_shard_digests(step_dir, state.ctx.rank)
    return gather_digests(state.ctx, mine, group)
