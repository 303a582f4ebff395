"""A sample's cameras read at once, on threads of the process that builds the sample.

PyAV releases the GIL while it demuxes, decodes and converts, and each camera is its
own file with its own decoder, so the cameras of a request decode in parallel on the
threads of one DataLoader worker. The work per sample is the same (one decoder per
file either way); what changes is that a worker can use a core that would otherwise
wait — on a machine with more cores than workers (``lerobot train`` starts at most 4),
or while the other workers wait on the main process.

One pool per process, made on first use there: a forked worker has none of its
parent's threads, so it never touches the parent's pool. A request with more cameras
than the table of open decoders never closes (its ``video.KEPT_DECODERS`` most recently
used) is read one camera after the other: each thread holds its camera's decoder for
the whole read, and only a decoder outside that set is ever closed to make room
(``open_files``).
"""

from __future__ import annotations

import concurrent.futures
import os
from typing import Callable, TypeVar

Value = TypeVar("Value")

_POOL: dict[int, concurrent.futures.ThreadPoolExecutor] = {}  # pid -> this process's pool


def read_cameras(read: Callable[[str], Value], keys: list[str], max_threads: int) -> dict[str, Value]:
    """``{key: read(key)}``, the keys read on threads at once when there are 2 to
    ``max_threads`` of them. Every read has finished when this returns or raises (the
    first key's error, in ``keys`` order), so no decoder is still in use afterwards."""
    if not 1 < len(keys) <= max_threads:
        return {key: read(key) for key in keys}
    pool = _pool(max_threads)
    futures = [pool.submit(read, key) for key in keys]
    concurrent.futures.wait(futures)
    return {key: future.result() for key, future in zip(keys, futures)}


def _pool(max_threads: int) -> concurrent.futures.ThreadPoolExecutor:
    pid = os.getpid()
    if pid not in _POOL:
        _POOL.clear()  # a forked child's copy of its parent's entry, whose threads it does not have
        _POOL[pid] = concurrent.futures.ThreadPoolExecutor(max_threads, thread_name_prefix="cameras")
    return _POOL[pid]
