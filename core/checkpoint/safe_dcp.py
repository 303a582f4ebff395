"""Every DCP read of the toolkit: ``dcp.load`` without letting the checkpoint run code.

Torch's own reader unpickles ``.metadata`` with plain ``pickle.load``, and its load
planner reads every non-tensor entry of a shard with ``torch.load(weights_only=False)``:
either runs whatever a crafted file names. Checkpoints are downloaded and shared, so
``load_dcp`` reads the metadata with the restricted unpickler of
``core.layout.dcp_metadata`` (torch-free stand-ins, nothing called), checks that every
shard it names is there and long enough, and builds torch's metadata classes from the
checked stand-ins; the planner reads bytes entries with ``weights_only=True``. Tensor
shapes are compared with the target state first, so a checkpoint of another model
shape fails with one line naming the tensor instead of a size-mismatch traceback.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import metadata as tm
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader, _StorageInfo
from torch.distributed.checkpoint.planner import ReadItem

from lerobot_kit.core.errors import CheckpointError, first_line
from lerobot_kit.core.layout import dcp_metadata as standin
from lerobot_kit.core.layout.paths import DCP_METADATA


class UnsafeShardEntryError(CheckpointError):
    """A non-tensor entry of a shard file holds something other than plain data."""


def load_dcp(state: dict[str, Any], dcp_dir: Path, *, what: str, fix: str) -> None:
    """Collective: fill ``state`` (tensors, DTensors and plain values) from the DCP folder.

    ``what`` says what the shards are ("weight shards", "optimizer shards") and ``fix``
    what to do when they do not fit this run; both go into the one-line errors, which
    every rank raises alike (each reads the same metadata and checks the same things).
    """
    dcp_dir = Path(dcp_dir)
    if not dcp_dir.is_dir():
        raise CheckpointError(f"{dcp_dir}: missing, though the checkpoint records DCP {what}")
    checked = standin.read_dcp_metadata(dcp_dir)
    problems = standin.check_dcp_shards(dcp_dir, checked)
    if problems:
        raise CheckpointError(f"{problems[0]}; the {what} are incomplete, the checkpoint is damaged{_more(problems)}")
    metadata = torch_metadata(checked, dcp_dir)
    _check_shapes(state, metadata, dcp_dir, fix)
    try:
        dcp.load(state, storage_reader=_CheckedReader(dcp_dir, metadata), planner=_WeightsOnlyPlanner(dcp_dir))
    except (Exception, CheckpointException) as exc:  # DCP's CheckpointException is a BaseException
        cause = _root_cause(exc)
        if isinstance(cause, CheckpointError):
            raise type(cause)(str(cause)) from exc
        raise CheckpointError(f"{dcp_dir}: cannot load the {what} ({type(cause).__name__}: {first_line(cause)})") from exc


def torch_metadata(checked: standin.Metadata, dcp_dir: Path) -> tm.Metadata:
    """Torch's ``Metadata`` built field by field from stand-ins ``read_dcp_metadata`` checked."""
    where = f"{dcp_dir}/{DCP_METADATA}"
    entries: dict[str, tm.TensorStorageMetadata | tm.BytesStorageMetadata] = {}
    for fqn, entry in checked.state_dict_metadata.items():
        _require(isinstance(fqn, str), where, f"entry name {fqn!r} is not a string")
        if isinstance(entry, standin.BytesStorageMetadata):
            entries[fqn] = tm.BytesStorageMetadata()
            continue
        entries[fqn] = tm.TensorStorageMetadata(
            properties=_properties(entry.properties, where, fqn),
            size=torch.Size(entry.size),
            chunks=[tm.ChunkStorageMetadata(offsets=torch.Size(c.offsets), sizes=torch.Size(c.sizes)) for c in entry.chunks],
        )
    storage: dict[tm.MetadataIndex, _StorageInfo] = {}
    for index, info in (checked.storage_data or {}).items():
        offset, position = getattr(index, "offset", None), getattr(index, "index", None)
        transforms = getattr(info, "transform_descriptors", None)
        _require(
            isinstance(index.fqn, str)
            and (offset is None or isinstance(offset, standin.Size))
            and (position is None or type(position) is int)
            and (transforms is None or (isinstance(transforms, list) and all(isinstance(t, str) for t in transforms))),
            where, f"storage record of {index.fqn!r} is malformed",
        )
        key = tm.MetadataIndex(fqn=index.fqn, offset=None if offset is None else torch.Size(offset), index=position)
        storage[key] = _StorageInfo(info.relative_path, info.offset, info.length, transforms)
    version = getattr(checked, "version", None)
    return tm.Metadata(
        state_dict_metadata=entries,
        planner_data=_planner_data(getattr(checked, "planner_data", None), where),
        storage_data=storage,
        storage_meta=tm.StorageMeta(),
        version=version if isinstance(version, str) else None,
    )


def _properties(props: standin.TensorProperties, where: str, fqn: str) -> tm.TensorProperties:
    dtype = getattr(torch, props.dtype.name, None)
    layout = getattr(torch, str(getattr(props, "layout", "torch.strided")).removeprefix("torch."), None)
    memory_format = getattr(torch, str(getattr(props, "memory_format", "contiguous_format")), None)
    flags = [getattr(props, "requires_grad", False), getattr(props, "pin_memory", False)]
    _require(
        isinstance(dtype, torch.dtype) and isinstance(layout, torch.layout)
        and isinstance(memory_format, torch.memory_format) and all(type(f) is bool for f in flags),
        where, f"tensor {fqn!r} has properties this torch does not know",
    )
    return tm.TensorProperties(
        dtype=dtype, layout=layout, requires_grad=flags[0], memory_format=memory_format, pin_memory=flags[1]
    )


def _planner_data(data: Any, where: str) -> dict[str, tuple[str | int, ...]] | None:
    """DCP's flattening map (flat name -> path of keys); plain data or nothing."""
    if data is None:
        return None
    _require(
        isinstance(data, dict) and all(
            isinstance(k, str) and isinstance(v, (tuple, list)) and all(type(p) in (str, int) for p in v)
            for k, v in data.items()
        ),
        where, "planner_data is not a map of names to key paths",
    )
    return {k: tuple(v) for k, v in data.items()}


def _require(ok: bool, where: str, problem: str) -> None:
    if not ok:
        raise CheckpointError(f"{where}: {problem}; not a DCP metadata file this toolkit wrote")


def _check_shapes(state: dict[str, Any], metadata: tm.Metadata, dcp_dir: Path, fix: str) -> None:
    """Every tensor to fill has the shape the checkpoint stores for it (DTensors: their global shape)."""
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    flat, _ = flatten_state_dict(state)
    for fqn, value in flat.items():
        stored = metadata.state_dict_metadata.get(fqn)
        if not isinstance(value, torch.Tensor) or not isinstance(stored, tm.TensorStorageMetadata):
            continue
        if tuple(value.shape) != tuple(stored.size):
            raise CheckpointError(
                f"{dcp_dir} does not fit this run's model (saved with other settings): size mismatch for {fqn}: "
                f"{list(stored.size)} in the checkpoint, {list(value.shape)} in the model; {fix}"
            )


class _CheckedReader(FileSystemReader):
    """Hands DCP the metadata checked beforehand; never unpickles ``.metadata`` itself."""

    def __init__(self, path: Path, metadata: tm.Metadata) -> None:
        super().__init__(path)
        self._checked = metadata

    def read_metadata(self, *args: Any, **kwargs: Any) -> tm.Metadata:
        if kwargs.get("rank") is not None:  # rank-local metadata files are never written here
            raise CheckpointError(f"{self.path}: per-rank DCP metadata is not read")
        self._checked.storage_meta = tm.StorageMeta(load_id=self.load_id)
        return self._checked


class _WeightsOnlyPlanner(DefaultLoadPlanner):
    """Reads a bytes entry (an int, a list of names...) as plain data, never as code."""

    def __init__(self, dcp_dir: Path) -> None:
        super().__init__()
        self._dcp_dir = dcp_dir

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        try:
            loaded = torch.load(value, weights_only=True)
        except Exception as exc:  # noqa: BLE001 - any refusal or damage means the same here
            shard = self.metadata.storage_data[read_item.storage_index].relative_path
            raise UnsafeShardEntryError(
                f"{self._dcp_dir / shard}: refusing to load entry {fqn!r}, which is not plain data "
                f"({first_line(exc, 160)}); the checkpoint is damaged or was crafted to run code"
            ) from exc
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], loaded)
        else:
            self.state_dict[fqn] = loaded


def _root_cause(exc: BaseException) -> BaseException:
    """The first rank's own exception inside DCP's wrapper, else ``exc``."""
    if isinstance(exc, CheckpointException) and exc.failures:
        first = exc.failures[min(exc.failures)]
        return first[0] if isinstance(first, tuple) else first
    return exc


def _more(problems: list[str]) -> str:
    return f" ({len(problems) - 1} more problems)" if len(problems) > 1 else ""
