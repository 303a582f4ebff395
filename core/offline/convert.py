"""``convert-dcp``: merge the DCP weight shards of a checkpoint into one safetensors file.

Runs offline in one process: no process group, no GPU. The model never sits in memory
at once: each shard chunk is decoded alone and appended to a safetensors file whose header
is computed up front from the DCP metadata — the ``safetensors`` package only writes a
whole dict at once, which would cost the full model in RAM. Peak memory is one chunk for
FSDP's row shards (one tensor plus one chunk for any other split).

Nothing is published from shards that are not what was saved. When the step folder has
a ``checksums.json``, the small files the checks before the conversion rely on
(``config.json``, the shards' ``.metadata``) are compared with it first. The shard files
are hashed by a background thread while the conversion reads them, not in a full pass of
their own before it: file reads and sha256 release the GIL, so where a second core is
free the hashing runs beside the decoding and writing instead of ahead of them. (A
recorded digest covers a whole file, and the conversion reads tensors in the output's
order, not the files', so it cannot hash the shards as it reads them.) The output is
renamed into place only after every shard was found as recorded; a shard that differs
is the error reported, even when the conversion failed on it first. When the policy
declares its weight shapes (``WeightShapes``), shards of other shapes than
``config.json``'s model are refused.

The output is written under a temporary name, its sha256 taken from the bytes handed to
the disk, and fsynced; the kernel is asked to start writing it out every 16 MiB, so the
disk works while later tensors are decoded instead of in one final fsync that waits for
the whole file. With a manifest, that digest is recorded in ``checksums.json``
(every later reader — ``inspect-checkpoint``, a resume — checks the disk against it) and
the written header is read back; without one, the file is dropped from the page cache
and read back in full against the digest. Only then is it renamed into place; shards
are deleted (``delete_dcp``) only after that rename. A crash or a failed check leaves no
output file and the shards untouched.

PEFT checkpoints (recorded as such, or a folder with ``adapter_config.json``) become
``adapter_model.safetensors``. Keys are copied as they are: the PEFT saver writes shard
keys already in PEFT's own naming (adapter name stripped, as
``peft.get_peft_model_state_dict`` returns them), so no renaming happens here.

Loaders read what ``training_step.json`` records, so the record is updated to name the
new file (and the shards' removal under ``delete_dcp``, before they go).

``.metadata`` is a pickle: it is read by ``dcp_metadata``'s restricted unpickler (no code
from the checkpoint runs) and checked against the shard files; chunks are decoded by
``dcp_chunks`` with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lerobot_kit.core.errors import CheckpointError, first_line, os_error_line
from lerobot_kit.core.layout import dcp_metadata, manifest
from lerobot_kit.core.layout.byte_size import byte_size
from lerobot_kit.core.layout.fsync import fsync_dir
from lerobot_kit.core.layout.json_file import read_json
from lerobot_kit.core.layout.no_space import free_bytes, is_no_space, no_space_line
from lerobot_kit.core.layout.paths import (
    DATASET_META,
    DCP_METADATA,
    DCP_MODEL_DIR,
    MANIFEST,
    POLICY_CONFIG,
    PRETRAINED_DIR,
    TMP_SUFFIX,
    TRAINING_STATE_DIR,
    TRAINING_STEP,
)
from lerobot_kit.core.layout.safetensors_header import METADATA_KEY, read_safetensors_header, tensors
from lerobot_kit.core.layout.stored_weights import StoredWeights
from lerobot_kit.core.layout.training_step import rewrite_weights_kind
from lerobot_kit.core.offline.convert_input import check_convertible
from lerobot_kit.core.offline.dcp_chunks import ChunkReader, row_blocks
from lerobot_kit.core.offline.weight_shapes import expected_shapes, shape_mismatch

# torch dtype -> safetensors dtype tag. Optional dtypes are looked up by name so an
# older torch without them still imports this module.
_SAFETENSORS_DTYPES: dict[torch.dtype, str] = {
    dtype: tag
    for name, tag in [
        ("float64", "F64"),
        ("float32", "F32"),
        ("float16", "F16"),
        ("bfloat16", "BF16"),
        ("int64", "I64"),
        ("int32", "I32"),
        ("int16", "I16"),
        ("int8", "I8"),
        ("uint8", "U8"),
        ("bool", "BOOL"),
        ("uint16", "U16"),
        ("uint32", "U32"),
        ("uint64", "U64"),
        ("float8_e4m3fn", "F8_E4M3"),
        ("float8_e5m2", "F8_E5M2"),
        ("complex64", "C64"),
    ]
    if isinstance(dtype := getattr(torch, name, None), torch.dtype)
}


@dataclass(frozen=True)
class _Entry:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    nbytes: int
    stored: dcp_metadata.TensorStorageMetadata


def _entries(dcp_dir: Path, metadata: dcp_metadata.Metadata) -> list[_Entry]:
    """The tensors to write, in safetensors' own order (widest dtype first, then by name,
    which keeps every tensor aligned to its element size in the file), after refusing
    what cannot become a safetensors file."""
    problems = dcp_metadata.check_dcp_shards(dcp_dir, metadata)
    if problems:
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        raise CheckpointError(f"partial or damaged shard folder, cannot convert: {problems[0]}{more}")
    entries = []
    for name, entry in metadata.state_dict_metadata.items():
        if not isinstance(entry, dcp_metadata.TensorStorageMetadata):
            raise CheckpointError(f"{dcp_dir}: entry {name!r} is not a tensor; safetensors can hold only tensors")
        dtype = getattr(torch, entry.properties.dtype.name, None)
        if not isinstance(dtype, torch.dtype) or dtype not in _SAFETENSORS_DTYPES:
            raise CheckpointError(
                f"{dcp_dir}: tensor {name!r} has dtype {entry.properties.dtype}, which safetensors cannot store"
            )
        shape = tuple(entry.size)
        entries.append(_Entry(name, dtype, shape, math.prod(shape) * dtype.itemsize, entry))
    return sorted(entries, key=lambda e: (-e.dtype.itemsize, e.name))


@dataclass(frozen=True)
class ConvertResult:
    output: Path
    tensors: int
    nbytes: int
    seconds: float
    peft: bool
    deleted_dcp: bool

    def summary(self) -> str:
        """The line convert-dcp ends with; the rate in the binary units of the size beside it."""
        rate = byte_size(round(self.nbytes / max(self.seconds, 1e-9)))
        return (
            f"converted {self.tensors} tensors, {byte_size(self.nbytes)} -> {self.output} in {self.seconds:.2f}s "
            f"({rate}/s)" + ("; DCP shards deleted" if self.deleted_dcp else "")
        )


RECORDS_ROOM = 64 << 10
"""Bytes kept free beyond the merged file, for rewriting ``training_step.json`` and ``checksums.json``."""

_NOTHING_CHANGED = "nothing was changed (the DCP shards are intact, and no partial file is left): free space there, " \
    "then run convert-dcp again"

_VERIFY_BLOCK = 8 << 20
"""Bytes read back per ``readinto`` while verifying."""

_WRITEBACK_BLOCK = 16 << 20
"""Bytes of output written before the kernel is asked to start writing them to the disk."""

Progress = Callable[[str, int, int], None]
"""``(phase, bytes_done, bytes_total)``; phase is "write" or "verify"."""


def convert_dcp(
    checkpoint_dir: Path,
    *,
    overwrite: bool = False,
    delete_dcp: bool = False,
    progress: Progress | None = None,
) -> ConvertResult:
    """Merge ``pretrained_model/pytorch_model_fsdp_0/`` into ``model.safetensors``.

    Raises CheckpointError, leaving every existing file as it was, when the shards are
    missing, partial, corrupt or differ from ``checksums.json``, when they hold other
    shapes than ``config.json``'s model, when the output exists and ``overwrite`` is
    false, or when the written file does not read back as written.
    """
    started = time.monotonic()
    pretrained = check_convertible(checkpoint_dir, overwrite)
    stored = StoredWeights.of(pretrained)
    output = pretrained / stored.file_name
    dcp_dir = _shards_to_convert(pretrained, output, overwrite)
    metadata = dcp_metadata.read_dcp_metadata(dcp_dir)
    entries = _entries(dcp_dir, metadata)
    step_dir = pretrained.parent
    recorded = _manifest_checked_before_reading(step_dir) if pretrained.name == PRETRAINED_DIR else None
    digest = _write_merged(output, entries, metadata, stored, recorded is not None, progress)
    _publish(output, digest, recorded, delete_dcp)
    return ConvertResult(
        output=output,
        tensors=len(entries),
        nbytes=sum(e.nbytes for e in entries),
        seconds=time.monotonic() - started,
        peft=stored.adapter,
        deleted_dcp=delete_dcp,
    )


def _shards_to_convert(pretrained: Path, output: Path, overwrite: bool) -> Path:
    """The DCP shard folder of ``pretrained``; refused when there is none, or when ``output``
    exists and may not be replaced."""
    dcp_dir = pretrained / DCP_MODEL_DIR
    if not dcp_dir.is_dir():
        existing = f"; {output.name} exists and may already hold the weights" if output.exists() else ""
        raise CheckpointError(
            f"{pretrained}: this checkpoint has no DCP weight shards ({DCP_MODEL_DIR}/ is missing){existing}"
        )
    if output.exists() and not overwrite:
        raise CheckpointError(f"{output} already exists; pass --overwrite=true to replace it")
    return dcp_dir


def _write_merged(output: Path, entries: list[_Entry], metadata: dcp_metadata.Metadata, stored: StoredWeights,
                  recorded: bool, progress: Progress | None) -> manifest.FileDigest:
    """The merged file written and checked beside ``output`` (its temporary name); returns its
    digest. ``recorded``: the step folder's manifest records the shards, so they are checked
    against it while read (``_ShardCheck``) instead of the output being read back. Nothing is
    left behind when it fails."""
    pretrained = output.parent
    dcp_dir = pretrained / DCP_MODEL_DIR
    tmp = output.with_name(output.name + TMP_SUFFIX)
    header = _header(entries)
    needed = len(header) + sum(e.nbytes for e in entries) + RECORDS_ROOM
    free = free_bytes(pretrained)
    if free is not None and free < needed:
        raise CheckpointError(f"{no_space_line(output, needed)}; {_NOTHING_CHANGED}")
    try:
        with _ShardCheck(pretrained.parent) if recorded else nullcontext():
            if not stored.adapter:
                _check_shapes(pretrained, entries)
            with ChunkReader(dcp_dir, metadata) as reader:
                digest = _write(tmp, header, entries, reader, progress)
            _check_header(tmp, entries)
            if not recorded:
                _read_back(tmp, digest, progress)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if is_no_space(exc):
            raise CheckpointError(f"{no_space_line(output, needed, exc)}; {_NOTHING_CHANGED}") from exc
        raise
    return digest


def _publish(output: Path, digest: manifest.FileDigest, recorded: dict[str, manifest.FileDigest] | None,
             delete_dcp: bool) -> None:
    """The written file moved into place as ``output``, and the step folder's records updated:
    ``training_step.json``'s weights kind, and ``checksums.json`` when the step folder has one
    (``recorded``); the shards deleted with ``delete_dcp``."""
    pretrained = output.parent
    step_dir = pretrained.parent
    replaced = output.exists()
    os.replace(output.with_name(output.name + TMP_SUFFIX), output)
    fsync_dir(pretrained)
    try:
        rewrite_weights_kind(pretrained, "gathered" if delete_dcp else "gathered+dcp")
    except OSError as exc:
        raise _not_recorded(step_dir / TRAINING_STATE_DIR / TRAINING_STEP, output, not replaced, exc) from exc
    try:
        if delete_dcp:
            _delete_shards(pretrained / DCP_MODEL_DIR, output)
    finally:
        if recorded is not None:
            try:
                _record_output(step_dir, recorded, f"{PRETRAINED_DIR}/{output.name}", digest)
            except OSError as exc:
                raise _not_recorded(step_dir / MANIFEST, output, False, exc) from exc


def _not_recorded(record: Path, output: Path, undo: bool, exc: OSError) -> CheckpointError:
    """The error of a conversion whose output is in place but whose ``record`` (``training_step.json``,
    ``checksums.json``) could not be rewritten. The record's temporary file is removed; with
    ``undo`` (nothing was replaced, nothing recorded yet) so is the output, leaving the
    checkpoint as it was."""
    record.with_name(record.name + TMP_SUFFIX).unlink(missing_ok=True)
    if undo:
        output.unlink(missing_ok=True)
        outcome = _NOTHING_CHANGED
    else:
        outcome = f"{output} is written and in use, but {record} still describes the checkpoint before it"
    failed = no_space_line(record, None, exc) if is_no_space(exc) else os_error_line(exc)
    return CheckpointError(f"{output}: recording it failed: {failed}; {outcome}")


def _delete_shards(dcp_dir: Path, output: Path) -> None:
    try:
        shutil.rmtree(dcp_dir)
    except OSError as exc:
        raise CheckpointError(
            f"{output} is written and verified, but deleting {dcp_dir} failed ({exc.strerror or exc}); "
            "delete it by hand"
        ) from exc


def _header(entries: list[_Entry]) -> bytes:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for e in entries:
        header[e.name] = {
            "dtype": _SAFETENSORS_DTYPES[e.dtype],
            "shape": list(e.shape),
            "data_offsets": [offset, offset + e.nbytes],
        }
        offset += e.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def _write(
    tmp: Path, header: bytes, entries: list[_Entry], reader: ChunkReader, progress: Progress | None
) -> manifest.FileDigest:
    """Write ``header`` and then every tensor's bytes to ``tmp``, fsync it, and return the
    size and sha256 of the bytes handed to the disk.

    A tensor whose chunks are whole-row runs (FSDP's dim-0 shards) is written chunk by
    chunk as each is decoded, so no tensor-sized buffer exists; any other split is
    assembled into one tensor first. Peak memory: one chunk, or one tensor plus one chunk.
    """
    total = sum(e.nbytes for e in entries)
    digest = hashlib.sha256(header)
    done = writeback_from = 0
    with tmp.open("wb", buffering=0) as file:
        _write_all(file, memoryview(header))
        for e in entries:
            for piece in _pieces(e, reader):
                data = memoryview(_as_bytes(piece).numpy())
                digest.update(data)
                _write_all(file, data)
                del piece, data
            done += e.nbytes
            writeback_from = _start_writeback(file.fileno(), writeback_from, len(header) + done)
            if progress:
                progress("write", done, total)
        os.fsync(file.fileno())
    return manifest.FileDigest(len(header) + total, digest.hexdigest())


def _pieces(e: _Entry, reader: ChunkReader) -> Iterator[torch.Tensor]:
    """The tensor's data in file order: its row chunks one by one, or the assembled whole."""
    blocks = row_blocks(e.stored)
    if blocks is not None:
        for chunk in blocks:
            yield reader.read(e.name, chunk, e.dtype)
        return
    whole = torch.empty(e.shape, dtype=e.dtype)
    for chunk, data in reader.chunks(e.name, e.stored, e.dtype):
        whole[tuple(slice(o, o + n) for o, n in zip(chunk.offsets, chunk.sizes, strict=True))].copy_(data)
        del data
    yield whole


def _read_back(tmp: Path, written: manifest.FileDigest, progress: Progress | None) -> None:
    """Read the file back from the disk (its pages dropped from the cache first) and match
    its sha256 against the one taken while writing."""
    with tmp.open("rb", buffering=0) as file:
        _drop_cached_pages(file.fileno())
        digest, done = hashlib.sha256(), 0
        block = memoryview(bytearray(min(_VERIFY_BLOCK, max(written.bytes, 1))))
        while got := file.readinto(block):
            digest.update(block[:got])
            done += got
            if progress:
                progress("verify", done, written.bytes)
    if done != written.bytes or digest.hexdigest() != written.sha256:
        raise CheckpointError(f"{tmp}: reads back different from the shards; disk or memory fault?")


def _manifest_checked_before_reading(step_dir: Path) -> dict[str, manifest.FileDigest] | None:
    """The step folder's recorded digests after checking the small files the shape check
    relies on (``config.json``, the shards' ``.metadata``) against them; None when it has
    no ``checksums.json``."""
    if not manifest.has_manifest(step_dir):
        return None
    recorded = manifest.read_manifest(step_dir)
    _refuse_damage(
        manifest.verify_manifest(
            step_dir, only=[f"{PRETRAINED_DIR}/{POLICY_CONFIG}", f"{PRETRAINED_DIR}/{DCP_MODEL_DIR}/{DCP_METADATA}"]
        )
    )
    return recorded


def _refuse_damage(problems: list[str]) -> None:
    if problems:
        more = f" (and {len(problems) - 1} more files)" if len(problems) > 1 else ""
        raise CheckpointError(f"damaged checkpoint, not converting: {problems[0]}{more}")


class _ShardCheck:
    """The shard files compared with ``checksums.json`` in a background thread while the
    conversion reads them, instead of in a full read of their own before it.

    File reads and sha256 of large buffers release the GIL, so the hashing runs on a free
    core beside the conversion's decoding and writing. Leaving the block waits for the
    verdict, so the output is renamed into place only from shards that matched; when the
    conversion itself failed, a shard that differs is the error reported (it explains the
    failure). An interrupt (not an ``Exception``) does not wait: the daemon thread only
    reads, and finishes on its own or dies with the process.
    """

    def __init__(self, step_dir: Path) -> None:
        self._problems: list[str] = []
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(step_dir,), name="convert-dcp-checksums", daemon=True)

    def __enter__(self) -> _ShardCheck:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc is None or isinstance(exc, Exception):
            self._verdict()

    def _run(self, step_dir: Path) -> None:
        try:
            self._problems = manifest.verify_manifest(step_dir, only=[f"{PRETRAINED_DIR}/{DCP_MODEL_DIR}"])
        except BaseException as exc:  # handed to the main thread by _verdict
            self._failure = exc

    def _verdict(self) -> None:
        """Wait for the thread; raise its finding as the one-line error of a damaged checkpoint."""
        self._thread.join()
        if self._failure is not None:
            raise CheckpointError(
                f"damaged checkpoint, not converting: checking the shards against {MANIFEST} failed "
                f"({type(self._failure).__name__}: {first_line(self._failure)})"
            ) from self._failure
        _refuse_damage(self._problems)


def _check_shapes(pretrained: Path, entries: list[_Entry]) -> None:
    """Refuse shards of other shapes than the model ``config.json`` describes, when its
    policy declares its shapes; shards of a policy that does not are converted as they are."""
    try:
        config = read_json(pretrained / POLICY_CONFIG)
        meta_path = pretrained / DATASET_META
        meta = read_json(meta_path) if meta_path.exists() else None
    except CheckpointError:
        return  # no usable config: nothing to check against (loading will say why)
    if not isinstance(config, dict):
        return
    expected = expected_shapes(config, meta)
    if expected.problems:
        name, message = expected.problems[0]
        raise CheckpointError(f"{pretrained / name}: {message}; not converting")
    if expected.shapes is not None:
        mismatch = shape_mismatch(expected.shapes, {e.name: e.shape for e in entries})
        if mismatch:
            raise CheckpointError(f"{pretrained / DCP_MODEL_DIR}: {mismatch}; not converting")


def _record_output(
    step_dir: Path, recorded: dict[str, manifest.FileDigest], output: str, digest: manifest.FileDigest
) -> None:
    """Put the new file's digest into ``checksums.json``: the recorded digests stay as they
    are (they were checked, or describe files not touched), the rewritten training record
    is hashed anew, and files no longer there drop out."""
    rewritten = f"{TRAINING_STATE_DIR}/{TRAINING_STEP}"
    known = {rel: d for rel, d in recorded.items() if rel != rewritten}
    manifest.write_manifest(step_dir, known={**known, output: digest})


def _check_header(tmp: Path, entries: list[_Entry]) -> None:
    """The written header must list exactly the shards' tensors, as torch's format."""
    header = read_safetensors_header(tmp)
    listed = {name: (entry["dtype"], tuple(entry["shape"])) for name, entry in tensors(header).items()}
    expected = {e.name: (_SAFETENSORS_DTYPES[e.dtype], e.shape) for e in entries}
    if listed != expected:
        first = next(n for n in sorted(set(listed) | set(expected)) if listed.get(n) != expected.get(n))
        raise CheckpointError(
            f"{tmp}: the file just written lists {first!r} as {listed.get(first)}, "
            f"the shards hold {expected.get(first)}"
        )
    if header.get(METADATA_KEY) != {"format": "pt"}:
        raise CheckpointError(f"{tmp}: the file just written lacks safetensors' torch format tag")


def _drop_cached_pages(fd: int) -> None:
    """Ask the kernel to forget the (already fsynced, so clean) pages of ``fd``, so that
    reading them back tests the disk rather than memory. Advisory: a no-op where the
    platform lacks it."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is not None:
        advise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def _start_writeback(fd: int, start: int, end: int) -> int:
    """Have the kernel start writing ``[start, end)`` of ``fd`` to the disk now, once that
    span reaches ``_WRITEBACK_BLOCK``; returns where the next span starts.

    Without it the whole file waits in the page cache (far below the kernel's own flushing
    threshold) until the final fsync, which then writes it all while nothing else happens;
    this way the disk writes while later tensors are decoded and hashed. On Linux
    ``POSIX_FADV_DONTNEED`` starts writeback of a range's dirty pages and drops only pages
    already on the disk, so the pages just written mostly stay cached. Advisory: a no-op
    where the platform lacks it.
    """
    advise = getattr(os, "posix_fadvise", None)
    if advise is None or end - start < _WRITEBACK_BLOCK:
        return start
    advise(fd, start, end - start, os.POSIX_FADV_DONTNEED)
    return end


def _write_all(file: Any, data: memoryview) -> None:
    """An unbuffered ``write`` may take less than it is given."""
    while data:
        data = data[file.write(data) :]


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().reshape(-1).view(torch.uint8)
