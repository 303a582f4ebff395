"""The batches a run trains on: sampler, DataLoader workers, augmentations, worker faults.

``build_loader`` is the one place a run's data pipeline is assembled (``lerobot train``
and the benchmarks call it):

- Order: the sampler's (``core.data.sampler``), a pure function of ``(seed, epoch)``,
  sliced per data-parallel rank; ``--dataset.sampler.type=episode_blocks`` decodes runs
  of consecutive frames and shuffles them in windows, a worker building a window's
  batches (``core.data.blocks``).
  Either gives each member of a dataset mixture its share of the samples
  (``core.data.member_quota``).
- Workers: ``--num_workers`` (default: automatic, ``cpus per rank - 1``, at most
  ``MAX_AUTO_WORKERS``, so 0 on one core; 0 for a dataset held in memory, whose items
  cost less than a batch's trip between processes), persistent, ``PREFETCH_BATCHES``
  batches (or ``PREFETCH_WINDOWS`` windows) ahead each, pinned memory when training on
  CUDA. What a worker returns travels packed in one block of shared memory
  (``core.data.packed``): one trip per batch (or window), not one per tensor. Camera frames leave the workers as uint8, as stored (unless augmented, which
  works in float), and the loader's batches keep them so: converting and collating float
  frames cost a worker more than decoding them, and converting them in the main process
  cost it more than all the rest of its share of the loading (three 480×640 cameras: 4×
  the bytes written per frame). The training step makes them float in [0, 1] on the
  device (``batch_to_device``), after a 4× smaller copy when training on CUDA (the block
  pinned by DataLoader's pinning thread, copied without blocking).
- Randomness: an item's augmentation draws come from a generator seeded by
  ``(seed, epoch, sample index)`` — not from a worker's RNG — so the same sample gets
  the same augmentation whichever worker serves it, and a resumed run, with workers or
  without, sees exactly the items of the uninterrupted run. Each item carries that epoch
  (``EPOCH_KEY``) beside its ``index``, for a policy that draws per sample the same way.
  Each worker's global RNGs (torch, numpy, random) are seeded from ``(seed, rank, epoch,
  worker)`` for anything a dataset plugin draws on its own.
- Faults: a ``LerobotError`` raised while a worker builds an item (a missing or corrupt
  video, a timestamp the video lacks) travels to the main process as a value and is
  raised there as itself — one line naming file, episode and time, instead of
  DataLoader's wrapped worker traceback. A worker that dies or stalls past
  ``--parallelism.timeout_s`` is reported the same way.
"""

from __future__ import annotations

import atexit
import os
import random
import signal
from dataclasses import dataclass
from functools import partial
from typing import Any, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, default_collate, get_worker_info

from lerobot_kit.core.config.schema import TrainConfig
from lerobot_kit.core.data.blocks import BlockPlan, Window, epoch_starts
from lerobot_kit.core.data.dataset import EPOCH_KEY, PolicyDataset, camera_to_float
from lerobot_kit.core.data.fetch_watch import FetchWatch
from lerobot_kit.core.data.member_quota import MemberQuota
from lerobot_kit.core.data.packed import Packed
from lerobot_kit.core.data.sampler import DataPosition, ResumableBatchSampler
from lerobot_kit.core.data.shared_blocks import LentBlocks, ReusedBlocks, SharedBlocks
from lerobot_kit.core.errors import ConfigError, LerobotError

MAX_AUTO_WORKERS = 4  # LeRobot's default; more rarely helps a single GPU's step
PREFETCH_BATCHES = 2  # per worker
PREFETCH_WINDOWS = 1  # per worker, under block sampling: a window is many batches

Batch = dict[str, torch.Tensor]


class DataError(LerobotError):
    """A batch could not be built: bad data, or a DataLoader worker that died or stalled."""


def sample_seed(*parts: int) -> int:
    """A 63-bit seed mixed from integers (seed, epoch, index, ...); equal parts, equal seed."""
    return int(np.random.SeedSequence([p & 0xFFFFFFFF for p in parts] + [p >> 32 for p in parts])
               .generate_state(1, np.uint64)[0] >> np.uint64(1))


def auto_num_workers(world_size: int, cpus: int | None = None) -> int:
    """Workers per rank: every core but the rank's own, shared among the ranks on this node."""
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    local = os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("SLURM_NTASKS_PER_NODE")
    ranks_here = int(local) if local and local.isdigit() else world_size
    return max(0, min(MAX_AUTO_WORKERS, cpus // max(1, ranks_here) - 1))


@dataclass(frozen=True)
class _Fault:
    """A ``LerobotError`` raised in a worker, carried to the main process as a batch."""

    error_type: type[LerobotError]
    message: str

    def error(self) -> LerobotError:
        try:
            return self.error_type(self.message)
        except TypeError:  # a subclass whose constructor takes other arguments
            return DataError(self.message)


@dataclass(frozen=True)
class _Decoding:
    """A window's items, decoded a group at a time while the collate function packs them."""

    window: Window
    groups: Iterator[tuple[list[int], list[Batch]]]


class TrainingItems:
    """What DataLoader workers index: ``(epoch, frame)`` keys → augmented items.

    ``__getitems__`` builds a whole micro-batch in one call (DataLoader uses it when
    present), so a fault is caught once per batch and returned instead of raised. Given
    a block sampling ``Window``, it decodes the window's items lazily, for the collate
    function to write into the window's batches as they come.
    """

    def __init__(self, dataset: PolicyDataset, config: TrainConfig) -> None:
        self.dataset = dataset
        self.seed = config.seed
        self.cameras = dataset.meta.image_keys()
        transforms = config.dataset.image_transforms
        self.augment = None
        if transforms.enable and self.cameras:
            from lerobot_kit.core.data.transforms import ImageAugmentation

            self.augment = ImageAugmentation(transforms)
        # A dataset implementing ``item`` reads a request's items together; camera frames then
        # leave the worker as uint8, unless they are augmented (in float) here.
        self.native = type(dataset).item is not PolicyDataset.item

    def __len__(self) -> int:
        return len(self.dataset)

    def items(self, keys: list[tuple[int, int]]) -> list[Batch]:
        indices = [index for _, index in keys]
        if self.native:
            items = self.dataset.items(indices, uint8_cameras=self.augment is None)
        else:
            items = [self.dataset[index] for index in indices]
        if self.augment is not None:
            for (epoch, index), item in zip(keys, items):
                generator = torch.Generator().manual_seed(sample_seed(self.seed, epoch, index))
                for camera in self.cameras:
                    item[camera] = self.augment(camera_to_float(item[camera]), generator)
        for epoch, item in zip(torch.tensor([epoch for epoch, _ in keys], dtype=torch.int64).unbind(), items):
            item[EPOCH_KEY] = epoch  # views of one tensor: a tensor apiece costs more than a small item's reading
        return items

    def __getitem__(self, key: tuple[int, int]) -> Batch:
        return self.items([key])[0]

    def __getitems__(self, keys: list[tuple[int, int]] | Window) -> list[Batch] | _Decoding | _Fault:
        if isinstance(keys, Window):
            window = keys
            return _Decoding(window, ((group, self.items([window.keys[i] for i in group])) for group in window.groups()))
        try:
            return self.items(keys)
        except LerobotError as exc:
            return _Fault(type(exc), str(exc))


def collate(items: list[Batch]) -> Batch:
    """``default_collate`` per key, except that camera frames stored channel-last (a reader's
    ``[..., C, H, W]`` view of ``[..., H, W, C]`` memory) are stacked channel-last into a
    ``channels_last`` batch: plain copies, where stacking them channel-first would cost a
    strided transpose per frame (several times a memory copy)."""
    return {key: _stack([item[key] for item in items]) for key in items[0]}


def _stack(values: list[Any]) -> Any:
    first = values[0]
    if isinstance(first, torch.Tensor) and first.dim() >= 3 and first.stride(-3) == 1 and first.stride(-1) != 1:
        moved = [value.movedim(-3, -1) for value in values]
        if all(value.is_contiguous() for value in moved):
            return default_collate(moved).movedim(-1, -3)
    return default_collate(values)


class _Collate:
    """DataLoader's ``collate_fn``: a batch; from a worker, packed for the trip to the main
    process (``core.data.packed``) in one of the worker's reusable blocks. A window (block
    sampling) becomes its batches packed in one block, a worker's or (without workers) one
    of the main process's reused ones."""

    def __init__(self, blocks: SharedBlocks | ReusedBlocks) -> None:
        self.blocks = blocks

    def __call__(self, items: list[Batch] | _Decoding | _Fault) -> Batch | Packed | _Fault:
        if isinstance(items, _Fault):
            return items
        if isinstance(items, _Decoding):
            try:
                return Packed.batches(len(items.window.keys), items.window.batch_size, items.groups, self.blocks)
            except LerobotError as exc:
                return _Fault(type(exc), str(exc))
        if get_worker_info() is None:
            return collate(items)
        return Packed.batch(items, self.blocks)


def _seed_worker(worker_id: int, seed: int, rank: int, epoch: int, stop_signals: tuple[int, ...] = ()) -> None:
    # Ctrl-C and a scheduler's SIGTERM reach every process; the training process stops at a
    # step boundary with a checkpoint (core.run.reliability.preemption) and ends its workers itself.
    for signum in stop_signals:
        signal.signal(signum, signal.SIG_IGN)
    worker_seed = sample_seed(seed, rank, epoch, worker_id)
    torch.manual_seed(worker_seed)
    np.random.seed(worker_seed % 2**32)
    random.seed(worker_seed)


class _KeyedBatches:
    """The sampler's batches as ``(epoch, frame)`` keys, so workers know each sample's epoch."""

    def __init__(self, sampler: ResumableBatchSampler) -> None:
        self.sampler = sampler

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        for epoch, batch in self.sampler.batches():
            yield [(epoch, index) for index in batch]


class _BlockWindows:
    """Episode-block sampling's requests, one ``Window`` of batches each (``core.data.blocks``)."""

    def __init__(self, plan: BlockPlan, start: DataPosition, global_batch: int, batch_size: int) -> None:
        self.plan = plan
        self.batch_size = batch_size
        self.first_epoch = start.epoch
        self.first_output = start.offset // global_batch * batch_size

    def __iter__(self) -> Iterator[Window]:
        for epoch, first in epoch_starts(self.first_epoch, self.first_output):
            for frames in self.plan.epoch(epoch).windows(first):
                yield Window([(epoch, frame) for frame in frames.tolist()], self.batch_size, self.plan.block_size)


class TrainingLoader:
    """Endless iterable of micro-batches for one data-parallel rank; ``sampler`` tracks the position."""

    def __init__(
        self,
        loader: DataLoader,
        sampler: ResumableBatchSampler,
        num_workers: int,
        timeout_s: float,
        memory_flags: str = "--num_workers",
    ) -> None:
        self.loader = loader
        self.sampler = sampler
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        self.memory_flags = memory_flags  # what to lower when a worker ran out of memory
        self._workers: Any = None  # the DataLoader iterator that owns the worker processes
        self._watch: FetchWatch | None = None  # bounds each fetch, handover included
        self._lent = LentBlocks()  # blocks of the batches handed out, back to their workers once unused

    def __iter__(self) -> Iterator[Batch]:
        for result in self._results():
            batches = self._delivered(result)
            batches.reverse()
            while batches:  # each handed on, not kept here: its block may go back once the consumer drops it
                yield batches.pop()

    def _delivered(self, result: Batch | Packed) -> list[Batch]:
        """The batch, or a window's batches, of one result. A packed result's tensors view its
        block, handed back to its worker once none of them is used any more (``LentBlocks``;
        on CUDA DataLoader's pinning thread copied the block out already)."""
        self._lent.release_unviewed()
        if not isinstance(result, Packed):
            return [result]
        if result.slot is not None and self._lent.COUNTED:
            self._lent.lend(result.block, result.slot)
        unpacked = result.unpack()
        batches = [unpacked] if isinstance(unpacked, dict) else unpacked
        if result.slot is not None and not self._lent.COUNTED:
            block = result.block.untyped_storage().data_ptr()
            batches = [{key: value.clone() if isinstance(value, torch.Tensor)
                        and value.untyped_storage().data_ptr() == block else value for key, value in batch.items()}
                       for batch in batches]
            result.release()
        return batches

    def _results(self) -> Iterator[Any]:
        """What the DataLoader delivers, with worker faults raised as themselves."""
        results = self._workers = iter(self.loader)
        atexit.register(self.close)
        if self.num_workers:
            pids = [worker.pid for worker in results._workers]  # type: ignore[attr-defined]  # persistent: fixed
            self._watch = FetchWatch(self.timeout_s, pids)
        try:
            while True:
                try:
                    result = self._fetch(results)
                except RuntimeError as exc:
                    raise self.worker_failure(exc) from exc
                except (EOFError, ConnectionError) as exc:  # its batch's memory is handed over by the worker itself
                    if self._watch_fired:
                        raise self._stuck() from exc
                    raise DataError(
                        f"DataLoader worker died while handing over a batch ({type(exc).__name__}). "
                        f"Lower {self.memory_flags} if the machine ran out of memory"
                    ) from exc
                if isinstance(result, _Fault):
                    raise result.error()
                yield result
        finally:
            self.close()

    def _fetch(self, results: Iterator[Any]) -> Any:
        if self._watch is None:
            return next(results)
        self._watch.begin()
        result = next(results)
        # A fetch that failed stays timed: a pinning thread stuck taking over a stopped
        # worker's batch is freed by the watch, or closing the loader would wait for it.
        self._watch.end()
        return result

    def close(self) -> None:
        """Stop the worker processes now (also at interpreter exit, and when iteration ends).

        Workers ignore the stop signals, so that a preempted run can save a checkpoint
        first; multiprocessing's exit handler stops workers with SIGTERM and then waits for
        them, so after an error it would wait forever. DataLoader has no public way to stop
        persistent workers; its iterator's shutdown is what its own finaliser calls. That
        shutdown asks each worker to finish, then sends it SIGTERM, which ours ignore: a
        worker still alive after it is stuck (in a read that never returns, say) and is
        killed, or the process could never exit.
        """
        workers, self._workers = self._workers, None
        atexit.unregister(self.close)
        shutdown = getattr(workers, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        for worker in getattr(workers, "_workers", ()):
            if worker.is_alive():
                worker.kill()
                worker.join()
        if self._watch is not None:
            self._watch.stop()

    def worker_failure(self, exc: RuntimeError) -> Exception:
        """``exc`` as the user's one line when it is DataLoader's word on its workers, else ``exc``.

        Public because a worker's death also arrives outside iteration: DataLoader's SIGCHLD
        handler raises it in whatever the main thread runs at that moment (a step, a save)."""
        text = str(exc)
        if "DataLoader timed out" in text or self._watch_fired:
            return self._stuck()
        if "DataLoader worker" in text:
            first = text.splitlines()[0]
            return DataError(f"{first} Lower {self.memory_flags} if the machine ran out of memory")
        return exc

    @property
    def _watch_fired(self) -> bool:
        """The fetch watch killed the workers: whatever error their deaths raised, they were stuck."""
        return self._watch is not None and self._watch.fired

    def _stuck(self) -> DataError:
        return DataError(
            f"no batch from the DataLoader workers in {self.timeout_s:.0f} s (--parallelism.timeout_s); "
            "a worker is stuck reading the dataset or handing over its batch"
        )


def batch_to_device(batch: Batch, device: torch.device, cameras: list[str]) -> Batch:
    """A loader's batch on ``device``, its uint8 camera frames float in [0, 1] there
    (``camera_to_float``: the values the dataset's float items hold): a quarter of the bytes
    cross to a GPU, and the host never converts them. Text stays on the host."""
    moved = {key: value.to(device, non_blocking=True) if isinstance(value, torch.Tensor) else value
             for key, value in batch.items()}
    for camera in cameras:
        if camera in moved:
            moved[camera] = camera_to_float(moved[camera])
    return moved


def build_loader(
    dataset: PolicyDataset,
    config: TrainConfig,
    dp_world_size: int,
    dp_rank: int,
    start: DataPosition,
    device: torch.device,
) -> TrainingLoader:
    """The rank's batches from ``start`` on, as ``config`` asks."""
    if EPOCH_KEY in dataset.meta.features:
        raise ConfigError(
            f"the dataset has a feature named {EPOCH_KEY!r}, the key under which training batches carry each "
            "sample's epoch; rename that feature in the dataset (nothing was trained)"
        )
    workers = config.num_workers
    if workers is None:
        workers = auto_num_workers(dp_world_size) if dataset.reads_on_demand else 0
    members = MemberQuota.of(dataset)
    sampler = ResumableBatchSampler(
        len(dataset), config.batch_size, dp_world_size, dp_rank, config.seed, start=start, members=members
    )
    timeout = float(config.parallelism.timeout_s)
    batch_sampler: Any = _KeyedBatches(sampler)
    prefetch, memory_flags = PREFETCH_BATCHES, "--num_workers"
    if config.dataset.sampler.type == "episode_blocks":
        plan = BlockPlan(
            dataset.episode_lengths(), config.dataset.sampler.block_size, config.dataset.sampler.buffer_size,
            config.batch_size, dp_world_size, dp_rank, config.seed, members,
        )
        batch_sampler = _BlockWindows(plan, start, sampler.global_batch, config.batch_size)
        prefetch = PREFETCH_WINDOWS
        memory_flags = "--num_workers or --dataset.sampler.buffer_size (each worker holds two windows of it)"
    options: dict[str, Any] = {}
    if workers:
        options = {
            "persistent_workers": True,
            "prefetch_factor": prefetch,
            "worker_init_fn": partial(
                _seed_worker, seed=config.seed, rank=dp_rank, epoch=start.epoch,
                stop_signals=config.preemption.signal_numbers(),
            ),
            "timeout": timeout,
        }
    loader = DataLoader(
        TrainingItems(dataset, config),  # type: ignore[arg-type]  # map-style: __len__/__getitem__
        batch_sampler=batch_sampler,
        num_workers=workers,
        collate_fn=_Collate(SharedBlocks(workers) if workers else ReusedBlocks()),
        pin_memory=device.type == "cuda",
        # A private generator: creating the iterator must not draw from the global RNG, or a
        # resumed run's dropout would drift from the uninterrupted run's.
        generator=torch.Generator().manual_seed(config.seed),
        **options,
    )
    return TrainingLoader(loader, sampler, workers, timeout, memory_flags)
