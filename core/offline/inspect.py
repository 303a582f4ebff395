"""What a checkpoint holds, and whether it is whole.

Reads JSON, safetensors headers and DCP metadata only, never tensor data or model code,
and never imports torch: CI can validate a checkpoint in a second, and a downloaded
checkpoint cannot run anything. ``training_step.json`` is checked by the rules of
``core.layout.training_step``, the ones resume reads it by.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lerobot_kit.core.errors import CheckpointError
from lerobot_kit.core.layout import files, manifest, training_step
from lerobot_kit.core.layout import paths as L
from lerobot_kit.core.layout.dcp_metadata import check_dcp_shards, read_dcp_metadata, tensor_entries
from lerobot_kit.core.layout.safetensors_header import read_safetensors_header, tensor_nbytes, tensors
from lerobot_kit.core.layout.training_step import OPTIMIZER_KINDS, WEIGHTS_KINDS, json_type
from lerobot_kit.core.offline.weight_shapes import expected_shapes, shape_mismatch

DEFAULT_VERIFY_MAX_BYTES = 2_000_000_000
"""Checksums are verified by default up to this many bytes on disk (about 10 s of reading)."""


@dataclass
class TensorInfo:
    name: str
    dtype: str
    shape: list[int]
    nbytes: int
    chunks: int | None = None  # DCP tensors: how many saved pieces

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass
class FileInfo:
    """One entry of ``pretrained_model/`` or ``training_state/`` (a DCP folder counts as one)."""

    path: str  # relative to the step folder
    kind: str  # json | safetensors | dcp | other
    size: int  # bytes on disk; a folder's files added up
    tensors: list[TensorInfo] | None = None  # tensor files that could be read

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "kind": self.kind, "size": self.size}
        if self.tensors is not None:
            out["count"] = len(self.tensors)
            out["params"] = sum(t.numel for t in self.tensors)
            out["bytes"] = sum(t.nbytes for t in self.tensors)
            out["tensors"] = [
                {"name": t.name, "dtype": t.dtype, "shape": t.shape, "bytes": t.nbytes}
                | ({} if t.chunks is None else {"chunks": t.chunks})
                for t in self.tensors
            ]
        return out


@dataclass
class Verdict:
    ok: bool | None  # None: could not be checked
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "why": self.why}


@dataclass
class Checksums:
    """What became of ``checksums.json``: verified | failed | skipped (too large) | off (--no-verify) | absent."""

    state: str
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "why": self.why}


@dataclass
class CheckpointReport:
    """Everything ``inspect-checkpoint`` prints; ``ok`` is False when ``problems`` is not empty."""

    path: Path
    step: int | None
    layout_version: int | None
    training_step: dict[str, Any] | None  # the parsed training_step.json, as written
    weights: str | None  # gathered | dcp | gathered+dcp, from training_step.json or the files
    optimizer: str | None  # safetensors | dcp
    peft: bool
    files: list[FileInfo]
    size_on_disk: int
    problems: list[str]  # one line each, starting with the file it is about
    resumable: Verdict
    loadable: Verdict
    checksums: Checksums

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: the ``--json`` output."""
        ts = self.training_step or {}
        return {
            "path": str(self.path),
            "ok": self.ok,
            "problems": self.problems,
            "step": self.step,
            "layout_version": self.layout_version,
            "expected_layout_version": L.LAYOUT_VERSION,
            "lerobot_kit_version": ts.get("lerobot_kit_version"),
            "topology": ts.get("topology"),
            "checkpoint_format": ts.get("checkpoint_format"),
            "weights": self.weights,
            "optimizer": self.optimizer,
            "peft": self.peft,
            "training_step": self.training_step,
            "files": [f.to_json() for f in self.files],
            "size_on_disk": self.size_on_disk,
            "resumable": self.resumable.to_json(),
            "loadable": self.loadable.to_json(),
            "checksums": self.checksums.to_json(),
        }


def inspect_checkpoint(
    path: Path, *, verify: bool | None = None, verify_max_bytes: int = DEFAULT_VERIFY_MAX_BYTES
) -> CheckpointReport:
    """Inspect and validate a step folder, its ``pretrained_model/`` or ``training_state/``, or a run folder.

    ``verify``: compare every file with ``checksums.json`` (True), never (False), or when
    the step folder holds at most ``verify_max_bytes`` (None): that is the one check
    that reads the tensor data. Raises ``CheckpointError`` only when ``path`` is not a
    checkpoint at all; everything wrong inside one is a line of ``report.problems``.
    """
    return _Inspector(L.find_step_dir(Path(path)), verify, verify_max_bytes).run()


@dataclass
class _Problem:
    file: str
    message: str  # full line, starting with the file

    @property
    def blocks_loading(self) -> bool:
        """Loading with --policy.path reads pretrained_model/, less the run config and the shards."""
        return self.file.startswith(f"{L.PRETRAINED_DIR}/") and not self.file.startswith(
            (f"{L.PRETRAINED_DIR}/{L.TRAIN_CONFIG}", f"{L.PRETRAINED_DIR}/{L.DCP_MODEL_DIR}")
        )


@dataclass
class _Inspector:
    root: Path
    verify: bool | None
    verify_max_bytes: int
    files: list[FileInfo] = field(default_factory=list)
    problems: list[_Problem] = field(default_factory=list)
    layout_problems: list[tuple[str, str]] = field(default_factory=list)  # (file, what it is), worded at the end
    parsed_json: dict[str, Any] = field(default_factory=dict)  # rel path -> value, for files that parse
    headers: dict[str, dict[str, Any]] = field(default_factory=dict)  # rel path -> valid safetensors header
    dcp_tensors: dict[str, list[TensorInfo]] = field(default_factory=dict)  # rel dir -> tensors, when whole
    current_layout: bool = False  # training_step.json says layout LAYOUT_VERSION
    shapes_unknown: str = ""  # why config.json's weight shapes could not be known, when they could not
    checksums: Checksums = field(default_factory=lambda: Checksums("absent", ""))
    matching: set[str] = field(default_factory=set)  # files checksums.json records that were read and match

    def run(self) -> CheckpointReport:
        for sub in (L.PRETRAINED_DIR, L.TRAINING_STATE_DIR):
            self._scan(sub)
        size_on_disk = _tree_size(self.root)
        self.checksums = self._check_checksums(size_on_disk)
        ts = self._check_training_step()
        self._check_policy_files()
        peft = self._is_peft(ts)
        if not peft:
            self._check_weight_shapes()
        self._require(L.PRETRAINED_DIR, L.POLICY_CONFIG)
        self._require(L.TRAINING_STATE_DIR, L.TRAINING_STEP)
        if ts is not None and self.current_layout:
            self._check_required(ts)
            if not self.layout_problems:
                self._check_optimizer(peft)
        loadable = self._loadable(peft)
        self._word_layout_problems(loadable)
        return CheckpointReport(
            path=self.root,
            step=self._step(ts),
            layout_version=ts.get("layout_version") if ts is not None else None,
            training_step=ts,
            weights=self._weights_kind(ts),
            optimizer=self._optimizer_kind(ts),
            peft=peft,
            files=self.files,
            size_on_disk=size_on_disk,
            problems=[p.message for p in self.problems],
            resumable=self._resumable(),
            loadable=loadable,
            checksums=self.checksums,
        )

    # --- reading every file present -------------------------------------------------

    def _scan(self, sub: str) -> None:
        folder = self.root / sub
        if not folder.is_dir():
            return
        try:
            entries = sorted(folder.iterdir())
        except OSError as err:
            self._problem(f"{sub}/", f"cannot be listed: {err.strerror or err}")
            return
        for entry in entries:
            rel = f"{sub}/{entry.name}"
            if entry.is_dir():
                if entry.name in (L.DCP_MODEL_DIR, L.DCP_OPTIMIZER_DIR) or (entry / L.DCP_METADATA).exists():
                    self._read_dcp(entry, rel)
                else:
                    self.files.append(FileInfo(rel, "other", _tree_size(entry)))
            elif entry.suffix == ".json":
                self._read_json(entry, rel)
            elif entry.suffix == ".safetensors":
                self._read_safetensors(entry, rel)
            else:
                self.files.append(FileInfo(rel, "other", _file_size(entry)))

    def _read_json(self, path: Path, rel: str) -> None:
        self.files.append(FileInfo(rel, "json", _file_size(path)))
        try:
            self.parsed_json[rel] = json.loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            self._problem(rel, "not valid JSON: not UTF-8 text")
        except (ValueError, RecursionError) as err:  # JSONDecodeError, or too deep / too long a number
            self._problem(rel, f"not valid JSON: {err}")
        except OSError as err:
            self._problem(rel, f"cannot be read: {err.strerror or err}")

    def _read_safetensors(self, path: Path, rel: str) -> None:
        info = FileInfo(rel, "safetensors", _file_size(path))
        self.files.append(info)
        try:
            header = read_safetensors_header(path, label=rel)
        except CheckpointError as err:
            self.problems.append(_Problem(rel, str(err)))
            return
        self.headers[rel] = header
        info.tensors = _infos(header)

    def _read_dcp(self, folder: Path, rel: str) -> None:
        info = FileInfo(rel, "dcp", _tree_size(folder))
        self.files.append(info)
        try:
            metadata = read_dcp_metadata(folder, label=rel)
        except CheckpointError as err:
            self.problems.append(_Problem(rel, str(err)))
            return
        info.tensors = [
            TensorInfo(
                name,
                e.properties.dtype.name,
                list(e.size),
                math.prod(e.size) * e.properties.dtype.itemsize,
                chunks=len(e.chunks),
            )
            for name, e in tensor_entries(metadata).items()
        ]
        shard_problems = check_dcp_shards(folder, metadata, label=rel)
        self.problems.extend(_Problem(rel, line) for line in shard_problems)
        if not shard_problems:
            self.dcp_tensors[rel] = info.tensors

    # --- contents: checksums and weight shapes -----------------------------------------

    def _check_checksums(self, size_on_disk: int) -> Checksums:
        """Every file against ``checksums.json``; a file that differs is a problem naming it."""
        if not manifest.has_manifest(self.root):
            return Checksums(
                "absent", f"no {L.MANIFEST} (written before checkpoints carried one): contents not verified"
            )
        try:
            recorded = manifest.read_manifest(self.root)
        except CheckpointError as err:
            self._problem(L.MANIFEST, str(err).removeprefix(f"{self.root / L.MANIFEST}: "))
            return Checksums("failed", f"{L.MANIFEST} is unreadable")
        if self.verify is False:
            return Checksums("off", "not verified (--no-verify)")
        if self.verify is None and size_on_disk > self.verify_max_bytes:
            return Checksums(
                "skipped",
                f"not verified: {_gb(size_on_disk)} on disk is above --verify-max-bytes={self.verify_max_bytes}; "
                "pass --verify to check them",
            )
        lines = manifest.verify_manifest(self.root)
        differing = set()
        for line in lines:
            rel = line.removeprefix(f"{self.root}/")
            differing.add(rel.split(":", 1)[0])
            self.problems.append(_Problem(rel.split(":", 1)[0], rel))
        self.matching = set(recorded) - differing
        if lines:
            return Checksums("failed", f"{len(lines)} of {len(recorded)} files differ from {L.MANIFEST}")
        return Checksums("verified", f"{len(recorded)} files match {L.MANIFEST}")

    def _check_weight_shapes(self) -> None:
        """The stored weights against the shapes ``config.json`` builds (its policy's ``weight_shapes``)."""
        config = self.parsed_json.get(f"{L.PRETRAINED_DIR}/{L.POLICY_CONFIG}")
        if not (isinstance(config, dict) and isinstance(config.get("type"), str)):
            self.shapes_unknown = f"{L.POLICY_CONFIG} names no policy type"
            return
        meta_rel = f"{L.PRETRAINED_DIR}/{L.DATASET_META}"
        if self._exists(L.PRETRAINED_DIR, L.DATASET_META) and meta_rel not in self.parsed_json:
            self.shapes_unknown = f"{L.DATASET_META} is unreadable"
            return
        expected = expected_shapes(config, self.parsed_json.get(meta_rel))
        for name, message in expected.problems:
            self._problem(f"{L.PRETRAINED_DIR}/{name}", message)
        if expected.shapes is None:
            self.shapes_unknown = expected.why_unknown or f"{L.POLICY_CONFIG} does not describe a model"
            return
        stored: list[tuple[str, list[TensorInfo]]] = []
        gathered = f"{L.PRETRAINED_DIR}/{L.MODEL_WEIGHTS}"
        if gathered in self.headers:
            stored.append((gathered, _infos(self.headers[gathered])))
        shards = f"{L.PRETRAINED_DIR}/{L.DCP_MODEL_DIR}"
        if shards in self.dcp_tensors:
            stored.append((shards, self.dcp_tensors[shards]))
        for rel, infos in stored:
            mismatch = shape_mismatch(expected.shapes, {t.name: tuple(t.shape) for t in infos})
            if mismatch:
                self._problem(rel, mismatch)

    # --- schemas ----------------------------------------------------------------------

    def _check_training_step(self) -> dict[str, Any] | None:
        """The record's own problems, by ``TrainingStep``'s rules, and its step against the folder."""
        rel = f"{L.TRAINING_STATE_DIR}/{L.TRAINING_STEP}"
        ts = self.parsed_json.get(rel)
        if ts is None:
            return None
        if not isinstance(ts, dict):
            self._problem(rel, f"must be a JSON object, not {json_type(ts)}")
            return None
        other = training_step.other_layout(ts)
        if other is not None:
            self.layout_problems.append((rel, other))
            return ts
        self.current_layout = True
        for line in training_step.problems(ts):
            self._problem(rel, line)
        if L.is_step_dir_name(self.root.name) and type(ts.get("step")) is int and ts["step"] != int(self.root.name):
            self._problem(rel, f"step is {ts['step']}, but the folder is {self.root.name}")
        return ts

    def _check_policy_files(self) -> None:
        """The JSON files of pretrained_model/ and their references to state files."""
        config = self.parsed_json.get(f"{L.PRETRAINED_DIR}/{L.POLICY_CONFIG}")
        if config is not None and not (isinstance(config, dict) and isinstance(config.get("type"), str)):
            self._problem(f"{L.PRETRAINED_DIR}/{L.POLICY_CONFIG}", 'must be a JSON object with a "type" string')
        for name in (L.TRAIN_CONFIG, L.ADAPTER_CONFIG):
            value = self.parsed_json.get(f"{L.PRETRAINED_DIR}/{name}")
            if value is not None and not isinstance(value, dict):
                self._problem(f"{L.PRETRAINED_DIR}/{name}", f"must be a JSON object, not {json_type(value)}")
        for name in (L.SCHEDULER_STATE, L.SCALER_STATE):
            value = self.parsed_json.get(f"{L.TRAINING_STATE_DIR}/{name}")
            if value is not None and not isinstance(value, dict):
                self._problem(f"{L.TRAINING_STATE_DIR}/{name}", f"must be a JSON object, not {json_type(value)}")
        for rel, value in self.parsed_json.items():
            name = rel.split("/", 1)[1]
            if rel.startswith(f"{L.PRETRAINED_DIR}/") and name.startswith((L.PREPROCESSOR, L.POSTPROCESSOR)):
                for ref in sorted(set(_safetensors_refs(value))):
                    if not (self.root / L.PRETRAINED_DIR / ref).is_file():
                        self._problem(rel, f"refers to {ref}, which is missing")

    def _check_required(self, ts: dict[str, Any]) -> None:
        """Every file the layout table requires for what training_step.json says was saved,
        as a resume requires it (``core.layout.files``)."""
        T = L.TRAINING_STATE_DIR
        topo = ts.get("topology")
        sharded = isinstance(topo, dict) and type(topo.get("dp_shard")) is int and topo["dp_shard"] > 1
        if sharded and self._exists(T, L.OPTIMIZER_STATE) and not self._exists(T, L.DCP_OPTIMIZER_DIR):
            self.layout_problems.append(
                (
                    f"{T}/{L.OPTIMIZER_STATE}",
                    f"old layout: a sharded run (dp_shard={topo['dp_shard']}) with one gathered optimizer state "
                    f"and no {T}/{L.DCP_OPTIMIZER_DIR}/, as LeRobot 0.6 wrote",
                )
            )
            return
        try:
            kind = files.CheckpointKind.of(training_step.TrainingStep.from_json(ts, f"{T}/{L.TRAINING_STEP}"))
        except CheckpointError:
            return  # the record's own problems are reported; what it requires is unknown
        for file, line in files.missing(self.root, kind):
            # The table's line says why the file is needed; checksums.json's "missing" says less.
            self.problems = [p for p in self.problems if p.file != file.path]
            self.problems.append(_Problem(file.path, line))

    def _require(self, sub: str, name: str) -> None:
        """A file every checkpoint holds, whatever its record says (or when there is none to say)."""
        if self._exists(sub, name):
            return
        if not (self.root / sub).is_dir():
            if not any(p.file == f"{sub}/" for p in self.problems):
                self._problem(f"{sub}/", "missing")
            return
        self._problem(f"{sub}/{name}", f"missing ({files.ALWAYS})")

    # --- consistency between files ----------------------------------------------------

    def _check_optimizer(self, peft: bool) -> None:
        """Optimizer state must belong to these weights.

        State tensors are ``state.<param>.<key>``, the parameter named by its FQN (what the
        trainer writes) or by its index; a name found among the weights must have their
        shape, and the other parameters' shapes must be among the remaining weights'.
        """
        weights = self._reference_weights(peft)
        groups_rel = f"{L.TRAINING_STATE_DIR}/{L.OPTIMIZER_PARAM_GROUPS}"
        state_rel = f"{L.TRAINING_STATE_DIR}/{L.OPTIMIZER_STATE}"
        dcp_rel = f"{L.TRAINING_STATE_DIR}/{L.DCP_OPTIMIZER_DIR}"
        if state_rel in self.headers:
            listed = self._param_group_members(groups_rel)
            per_param: dict[str, list[TensorInfo]] = {}
            for t in _infos(self.headers[state_rel]):
                param = _state_param(t.name)
                if param is None or not t.name.startswith("state."):
                    self._problem(state_rel, f"unexpected tensor {t.name!r} (expected state.<parameter>.<key>)")
                    continue
                per_param.setdefault(param, []).append(t)
            if listed is not None:
                stray = sorted((p for p in per_param if p not in listed), key=_natural)
                if stray:
                    self._problem(
                        state_rel, f"holds state for parameter {stray[0]}, which no param group of {groups_rel} lists"
                    )
                if weights is not None and len(listed) > len(weights[1]):
                    self._problem(
                        groups_rel,
                        f"lists {len(listed)} parameters, but {weights[0]} holds only {len(weights[1])} tensors: "
                        "the optimizer state is not this model's",
                    )
            if weights is not None:
                self._check_state_shapes(state_rel, per_param, weights)
        elif dcp_rel in self.dcp_tensors and weights is not None:
            per_param = {}
            for t in self.dcp_tensors[dcp_rel]:
                param = _state_param(t.name)
                if param is not None:
                    per_param.setdefault(param, []).append(t)
            self._check_state_shapes(dcp_rel, per_param, weights)

    def _param_group_members(self, rel: str) -> set[str] | None:
        """The parameters (FQNs, or indices as strings) the param groups list."""
        groups = self.parsed_json.get(rel)
        if groups is None:
            return None
        if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
            self._problem(rel, f"must be a JSON list of param groups (objects), not {json_type(groups)}")
            return None
        seen: set[str] = set()
        for i, group in enumerate(groups):
            params = group.get("params")
            if not isinstance(params, list) or not all(
                isinstance(p, str) or (type(p) is int and p >= 0) for p in params
            ):
                self._problem(rel, f'param group {i}: "params" must be a list of parameter names or indices')
                return None
            members = {str(p) for p in params}
            twice = seen & members
            if twice:
                self._problem(rel, f"parameter {min(twice, key=_natural)} is in more than one param group")
            seen |= members
        return seen

    def _check_state_shapes(
        self, rel: str, per_param: dict[str, list[TensorInfo]], weights: tuple[str, list[TensorInfo]]
    ) -> None:
        source, weight_tensors = weights
        by_name = {t.name: tuple(t.shape) for t in weight_tensors}
        available = Counter(by_name.values())
        unnamed: list[tuple[str, tuple[int, ...]]] = []
        for param, states in sorted(per_param.items(), key=lambda kv: _natural(kv[0])):
            shapes = {tuple(t.shape) for t in states if t.shape}  # scalars (e.g. Adam's step) say nothing
            if len(shapes) > 1:
                self._problem(rel, f"state of parameter {param} has tensors of different shapes {sorted(shapes)}")
                return
            if not shapes:
                continue
            shape = shapes.pop()
            if param not in by_name:
                unnamed.append((param, shape))
            elif by_name[param] != shape:
                self._problem(
                    rel,
                    f"state of parameter {param} has shape {list(shape)}, but {source} has it as "
                    f"{list(by_name[param])}: the optimizer state is not this model's",
                )
                return
            else:
                available[shape] -= 1
        for param, shape in unnamed:
            if available[shape] <= 0:
                self._problem(
                    rel,
                    f"state of parameter {param} has shape {list(shape)}, which no (remaining) tensor of "
                    f"{source} has: the optimizer state is not this model's",
                )
                return
            available[shape] -= 1

    def _reference_weights(self, peft: bool) -> tuple[str, list[TensorInfo]] | None:
        """The weights the optimizer updated: the gathered file, else the DCP shards."""
        gathered = f"{L.PRETRAINED_DIR}/{L.ADAPTER_WEIGHTS if peft else L.MODEL_WEIGHTS}"
        if gathered in self.headers:
            return gathered, _infos(self.headers[gathered])
        shards = f"{L.PRETRAINED_DIR}/{L.DCP_MODEL_DIR}"
        if shards in self.dcp_tensors:
            return shards, self.dcp_tensors[shards]
        return None

    # --- verdicts ---------------------------------------------------------------------

    def _loadable(self, peft: bool) -> Verdict:
        blocking = [p for p in self.problems if p.blocks_loading]
        if blocking:
            return Verdict(False, blocking[0].message)
        P = L.PRETRAINED_DIR
        if not self._exists(P, L.POLICY_CONFIG):
            return Verdict(False, f"{P}/{L.POLICY_CONFIG} is missing")
        if peft and self._exists(P, L.ADAPTER_WEIGHTS):
            if not self._exists(P, L.ADAPTER_CONFIG):
                return Verdict(False, f"{P}/{L.ADAPTER_CONFIG} is missing")
            return Verdict(True, f"PEFT adapter {P}/{L.ADAPTER_WEIGHTS} on its base policy")
        if self._exists(P, L.MODEL_WEIGHTS):
            weights = f"{P}/{L.MODEL_WEIGHTS}"
            if not self.shapes_unknown:
                return Verdict(True, f"{weights}, its shapes as {L.POLICY_CONFIG} builds the model")
            together = {f"{P}/{L.POLICY_CONFIG}", weights}
            if self._exists(P, L.DATASET_META):
                together.add(f"{P}/{L.DATASET_META}")
            if self.matching.issuperset(together):
                return Verdict(
                    True,
                    f"{weights}, saved together with {L.POLICY_CONFIG}: both match {L.MANIFEST} "
                    f"({self.shapes_unknown})",
                )
            return Verdict(
                None,
                f"{weights} is whole, but its shapes are unchecked: {self.shapes_unknown}, and no verified "
                f"{L.MANIFEST} ties it to {L.POLICY_CONFIG}",
            )
        if f"{P}/{L.DCP_MODEL_DIR}" in self.dcp_tensors:
            return Verdict(
                False,
                f"the weights are DCP shards only; run `lerobot convert-dcp --checkpoint_dir={self.root}` first",
            )
        return Verdict(False, f"{P}/ holds no loadable weights")

    def _word_layout_problems(self, loadable: Verdict) -> None:
        if loadable.ok:
            works = f"loading the weights still works: --policy.path={self.root / L.PRETRAINED_DIR}"
        elif loadable.ok is None:
            works = f"loading the weights may work: --policy.path={self.root / L.PRETRAINED_DIR} ({loadable.why})"
        else:
            works = f"its weights do not load either ({loadable.why})"
        self.problems[0:0] = [
            _Problem(rel, f"{rel}: {what}; it cannot be resumed; {works}") for rel, what in self.layout_problems
        ]

    def _resumable(self) -> Verdict:
        if not self.problems:
            return Verdict(True, "every file of the layout is present and consistent")
        more = f" (and {len(self.problems) - 1} more problems)" if len(self.problems) > 1 else ""
        return Verdict(False, self.problems[0].message + more)

    # --- small helpers ----------------------------------------------------------------

    def _is_peft(self, ts: dict[str, Any] | None) -> bool:
        if ts is not None and isinstance(ts.get("peft"), bool):
            return ts["peft"]
        return self._exists(L.PRETRAINED_DIR, L.ADAPTER_WEIGHTS)

    def _weights_kind(self, ts: dict[str, Any] | None) -> str | None:
        if ts is not None and ts.get("weights") in WEIGHTS_KINDS:
            return ts["weights"]
        gathered = self._exists(L.PRETRAINED_DIR, L.MODEL_WEIGHTS) or self._exists(L.PRETRAINED_DIR, L.ADAPTER_WEIGHTS)
        shards = self._exists(L.PRETRAINED_DIR, L.DCP_MODEL_DIR)
        return {(True, False): "gathered", (False, True): "dcp", (True, True): "gathered+dcp"}.get((gathered, shards))

    def _optimizer_kind(self, ts: dict[str, Any] | None) -> str | None:
        if ts is not None and ts.get("optimizer") in OPTIMIZER_KINDS:
            return ts["optimizer"]
        if self._exists(L.TRAINING_STATE_DIR, L.DCP_OPTIMIZER_DIR):
            return "dcp"
        return "safetensors" if self._exists(L.TRAINING_STATE_DIR, L.OPTIMIZER_STATE) else None

    def _step(self, ts: dict[str, Any] | None) -> int | None:
        if ts is not None and type(ts.get("step")) is int:
            return ts["step"]
        return int(self.root.name) if L.is_step_dir_name(self.root.name) else None

    def _exists(self, *parts: str) -> bool:
        return self.root.joinpath(*parts).exists()

    def _problem(self, rel: str, message: str) -> None:
        self.problems.append(_Problem(rel, f"{rel}: {message}"))


def _infos(header: dict[str, Any]) -> list[TensorInfo]:
    return [
        TensorInfo(name, e["dtype"], e["shape"], tensor_nbytes(e["dtype"], e["shape"]))
        for name, e in tensors(header).items()
    ]


def _state_param(name: str) -> str | None:
    """The parameter of an optimizer tensor ``[prefix.]state.<parameter>.<key>``, else None."""
    _, found, rest = name.partition("state.")
    param, dot, _key = rest.rpartition(".")
    return param if found and dot and param else None


def _safetensors_refs(value: Any) -> list[str]:
    """Every string in a processor JSON that names a ``.safetensors`` state file."""
    if isinstance(value, str):
        return [value] if value.endswith(".safetensors") else []
    if isinstance(value, dict):
        return [ref for v in value.values() for ref in _safetensors_refs(v)]
    if isinstance(value, list):
        return [ref for v in value for ref in _safetensors_refs(v)]
    return []


def _natural(key: str) -> tuple[int, str]:
    return (int(key), "") if key.isdigit() else (1 << 62, key)


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB"


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _tree_size(folder: Path) -> int:
    total = 0
    for dirpath, _, filenames in os.walk(folder):
        for name in filenames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total
