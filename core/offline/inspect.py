"""What a checkpoint holds, and whether it is whole.

Reads JSON, safetensors headers and DCP metadata only, never tensor data or model code,
and never imports torch: CI can validate a checkpoint in a second, and a downloaded
checkpoint cannot run anything. Every file is read and checked by ``core.layout.validate``,
the very check a resume, ``--policy.path`` and ``lerobot eval`` pass a checkpoint through
before reading it, so "resumable" and "loadable" here are what they accept; this module
adds the report: checksums, the weight shapes ``config.json`` builds, the files the
layout table requires, and the verdicts.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lerobot_kit.core.errors import CheckpointError
from lerobot_kit.core.layout import files, manifest, state_pieces, training_step
from lerobot_kit.core.layout import paths as L
from lerobot_kit.core.layout.byte_size import byte_size
from lerobot_kit.core.layout.dcp_metadata import tensor_entries
from lerobot_kit.core.layout.layout_file import LayoutFile
from lerobot_kit.core.layout.safetensors_header import tensor_nbytes, tensors
from lerobot_kit.core.layout.training_step import OPTIMIZER_KINDS, WEIGHTS_KINDS
from lerobot_kit.core.layout.validate import (
    DAMAGE,
    NOT_A_FILE,
    UNREADABLE,
    CheckedFolder,
    Entry,
    Problem,
    check_pretrained_folder,
    check_step_folder,
    first_problem,
)
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
class PieceInfo:
    """A piece of training state the checkpoint holds (``core.layout.state_pieces``), and where."""

    name: str
    held_in: list[str]  # its files the folder holds, or ``training_step.json:<field>``

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "held_in": self.held_in}


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
    policy_folder: bool  # a folder save_pretrained wrote, with no training state; else a step folder
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
    dataset: dict[str, Any] | None = None  # what the run trained on, from train_config.json
    state: list[PieceInfo] = field(default_factory=list)  # the pieces of training state it holds

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: the ``--json`` output."""
        ts = self.training_step or {}
        return {
            "path": str(self.path),
            "kind": "policy_folder" if self.policy_folder else "step_folder",
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
            "dataset": self.dataset,
            "state": [piece.to_json() for piece in self.state],
        }


def inspect_checkpoint(
    path: Path, *, verify: bool | None = None, verify_max_bytes: int = DEFAULT_VERIFY_MAX_BYTES
) -> CheckpointReport:
    """Inspect and validate a step folder, its ``pretrained_model/`` or ``training_state/``, a run
    folder, or a policy folder that ``save_pretrained`` wrote on its own (``paths.is_policy_folder``:
    a copied ``pretrained_model/``, LeRobot's output, a Hub snapshot), which loads but does not resume.

    ``verify``: compare every file with ``checksums.json`` (True), never (False), or when
    the step folder holds at most ``verify_max_bytes`` (None): that is the one check
    that reads the tensor data. Raises ``CheckpointError`` only when ``path`` is not a
    checkpoint at all; everything wrong inside one is a line of ``report.problems``.
    """
    from lerobot_kit.core.registry.registry import get_registry

    get_registry()  # plugins register their state pieces (and so their files) when imported
    path = Path(path)
    if L.is_policy_folder(path):
        return _Inspector(path.parent, verify, verify_max_bytes, pretrained=path.name, policy_folder=True).run()
    return _Inspector(L.find_step_dir(path), verify, verify_max_bytes).run()


@dataclass
class _Inspector:
    root: Path  # the step folder, or the policy folder's parent; files are named relative to it
    verify: bool | None
    verify_max_bytes: int
    pretrained: str = L.PRETRAINED_DIR  # the folder of the loadable files, in root
    policy_folder: bool = False  # pretrained is a folder save_pretrained wrote, with no training state
    checked: CheckedFolder = field(init=False)
    problems: list[Problem] = field(default_factory=list)
    layout_problems: list[tuple[str, str]] = field(default_factory=list)  # (file, what it is), worded at the end
    shapes_unknown: str = ""  # why config.json's weight shapes could not be known, when they could not
    checksums: Checksums = field(default_factory=lambda: Checksums("absent", ""))
    matching: set[str] = field(default_factory=set)  # files checksums.json records that were read and match

    def run(self) -> CheckpointReport:
        # Every file read and checked exactly as the loaders check it before reading.
        if self.policy_folder:
            self.checked = check_pretrained_folder(self.root / self.pretrained)
        else:
            self.checked = check_step_folder(self.root)
        self.problems = list(self.checked.problems)
        files = [self._file_info(entry) for entry in self.checked.entries]
        # A Hub snapshot's files are links into its blobs: a policy folder counts what they lead to.
        size_on_disk = sum(f.size for f in files) if self.policy_folder else _tree_size(self.root)
        self.checksums = self._check_checksums(size_on_disk)
        ts = self.checked.json.get(f"{L.TRAINING_STATE_DIR}/{L.TRAINING_STEP}")
        ts = ts if isinstance(ts, dict) and not self.policy_folder else None
        if ts is not None and self.checked.other_layout is not None:
            self.layout_problems.append((f"{L.TRAINING_STATE_DIR}/{L.TRAINING_STEP}", self.checked.other_layout))
            # Another layout's training state (LeRobot's RNG entries, say) breaks this layout's
            # rules file by file; that it cannot be resumed is the one thing to say about it.
            self.problems = [p for p in self.problems if not p.file.startswith(f"{L.TRAINING_STATE_DIR}/")]
        peft = self._is_peft(ts)
        if not peft:
            self._check_weight_shapes()
        self._require_essential()
        if ts is not None and self.checked.other_layout is None:
            self._check_required(ts)
        loadable = self._loadable(peft)
        self._word_layout_problems(loadable)
        return CheckpointReport(
            path=self.root / self.pretrained if self.policy_folder else self.root,
            policy_folder=self.policy_folder,
            step=self._step(ts),
            layout_version=ts.get("layout_version") if ts is not None else None,
            training_step=ts,
            weights=self._weights_kind(ts),
            optimizer=self._optimizer_kind(ts),
            peft=peft,
            files=files,
            size_on_disk=size_on_disk,
            problems=[p.line for p in self.problems],
            resumable=self._resumable(),
            loadable=loadable,
            checksums=self.checksums,
            dataset=trained_on(self.checked.json.get(f"{self.pretrained}/{L.TRAIN_CONFIG}")),
            state=self._state_pieces(ts),
        )

    def _file_info(self, entry: Entry) -> FileInfo:
        if entry.kind == "dcp":
            info = FileInfo(entry.rel, "dcp", _tree_size(entry.path))
            metadata = self.checked.dcp.get(entry.rel)
            if metadata is not None:
                info.tensors = [
                    TensorInfo(name, e.properties.dtype.name, list(e.size),
                               math.prod(e.size) * e.properties.dtype.itemsize, chunks=len(e.chunks))
                    for name, e in tensor_entries(metadata).items()
                ]
            return info
        size = _tree_size(entry.path) if os.path.isdir(entry.path) else _file_size(entry.path)
        info = FileInfo(entry.rel, entry.kind, size)
        if entry.rel in self.checked.headers:
            info.tensors = _infos(self.checked.headers[entry.rel])
        return info

    # --- contents: checksums and weight shapes -----------------------------------------

    def _check_checksums(self, size_on_disk: int) -> Checksums:
        """Every file against ``checksums.json``; a file that differs is a problem naming it."""
        if self.policy_folder:
            return Checksums("absent", f"a policy folder carries no {L.MANIFEST} (a step folder does): "
                             "contents not verified")
        if not manifest.has_manifest(self.root):
            return Checksums(
                "absent", f"no {L.MANIFEST} (written before checkpoints carried one): contents not verified"
            )
        try:
            recorded = manifest.read_manifest(self.root)
        except CheckpointError as err:
            line = f"{L.MANIFEST}: {str(err).removeprefix(f'{self.root / L.MANIFEST}: ')}"
            self.problems.append(Problem.of(L.MANIFEST, type(err)(line)))
            return Checksums("failed", f"{L.MANIFEST} is unreadable")
        if self.verify is False:
            return Checksums("off", "not verified (--no-verify)")
        if self.verify is None and size_on_disk > self.verify_max_bytes:
            return Checksums(
                "skipped",
                f"not verified: {byte_size(size_on_disk)} on disk is above --verify-max-bytes={self.verify_max_bytes}; "
                "pass --verify to check them",
            )
        findings = manifest.manifest_findings(self.root)
        differing = set()
        for finding in findings:
            line = finding.line.removeprefix(f"{self.root}/")
            rel = line.split(":", 1)[0]
            differing.add(rel)
            if not self._unopenable(rel):  # named once, by the check that tried to open it
                self.problems.append(Problem(rel, line, UNREADABLE if finding.unreadable else DAMAGE))
        self.matching = set(recorded) - differing
        unreadable = sum(finding.unreadable for finding in findings)
        if unreadable:
            differ = f"; {len(findings) - unreadable} differ" if len(findings) > unreadable else ""
            return Checksums("failed", f"{unreadable} of {len(recorded)} files could not be read to compare with "
                                       f"{L.MANIFEST}{differ}")
        if findings:
            return Checksums("failed", f"{len(findings)} of {len(recorded)} files differ from {L.MANIFEST}")
        return Checksums("verified", f"{len(recorded)} files match {L.MANIFEST}")

    def _shape_sources(self) -> tuple[str, str]:
        """The files the weights' shapes are built from: ``config.json`` and the dataset's features."""
        return f"{self.pretrained}/{L.POLICY_CONFIG}", f"{self.pretrained}/{L.DATASET_META}"

    def _check_weight_shapes(self) -> None:
        """The stored weights against the shapes ``config.json`` builds (its policy's ``weight_shapes``)."""
        parsed = self.checked.json
        config_rel, meta_rel = self._shape_sources()
        config = parsed.get(config_rel)
        if not (isinstance(config, dict) and isinstance(config.get("type"), str)):
            self.shapes_unknown = f"{L.POLICY_CONFIG} names no policy type"
            return
        if any(p.file == config_rel for p in self.checked.problems):  # the shared check named its problem
            self.shapes_unknown = f"{L.POLICY_CONFIG} is not a valid config"
            return
        if self._exists(meta_rel) and meta_rel not in parsed:
            self.shapes_unknown = f"{L.DATASET_META} is unreadable"
            return
        expected = expected_shapes(config, parsed.get(meta_rel))
        for name, message in expected.problems:
            self._problem(f"{self.pretrained}/{name}", message)
        if expected.shapes is None:
            self.shapes_unknown = expected.why_unknown or f"{L.POLICY_CONFIG} does not describe a model"
            return
        full = (file for file in state_pieces.MODEL.files if file.holds_tensors and not _adapter(file))
        for rel in self._rels(full):
            stored = self.checked.shapes(rel)
            mismatch = shape_mismatch(expected.shapes, stored) if stored is not None else None
            if mismatch:
                self._problem(rel, mismatch)

    # --- what the layout table requires -------------------------------------------------

    def _check_required(self, ts: dict[str, Any]) -> None:
        """Every file the layout table requires for what training_step.json says was saved,
        as a resume requires it (``core.layout.files``)."""
        T = L.TRAINING_STATE_DIR
        topo = ts.get("topology")
        dp_shard = topo.get("dp_shard") if isinstance(topo, dict) else None
        older = files.older_layout(self.root, dp_shard) if type(dp_shard) is int else None
        if older is not None:
            self.layout_problems.append(older)
            return
        try:
            kind = files.CheckpointKind.of(training_step.TrainingStep.from_json(ts, f"{T}/{L.TRAINING_STEP}"))
        except CheckpointError:
            return  # the record's own problems are reported; what it requires is unknown
        try:
            lacking = list(files.missing(self.root, kind))
        except CheckpointError as err:
            rel = getattr(err, "file", None) or L.TRAINING_STATE_DIR
            if not self._unopenable(rel):
                self.problems.append(Problem.of(rel, err))
            return
        for file, line in lacking:
            # The table's line says why the file is needed; checksums.json's "missing" says less.
            self.problems = [p for p in self.problems if p.file != file.path]
            self.problems.append(Problem(file.path, line))

    def _require_essential(self) -> None:
        """The files the table requires whatever a record says (or when there is none to say): those
        that make the folder a policy folder, and a step folder's record."""
        for rel in self._rels(file for file in files.layout_files() if file.essential):
            self._require(rel)

    def _require(self, rel: str) -> None:
        """A file every checkpoint holds: missing, or its folder missing, unless named unopenable already."""
        if self._exists(rel) or self._unopenable(rel):
            return
        sub = rel.rsplit("/", 1)[0]
        if not os.path.isdir(self.root / sub):
            if not any(p.file == f"{sub}/" for p in self.problems):
                self._problem(f"{sub}/", "missing")
            return
        self._problem(rel, f"missing ({files.ALWAYS})")

    # --- verdicts ---------------------------------------------------------------------

    def _loadable(self, peft: bool) -> Verdict:
        """What ``--policy.path`` would make of the folder: the layout table's files for loading, read
        as the loader reads them (a PEFT checkpoint's adapter first, else the full weights)."""
        blocking = [p for p in self.problems if self.checked.blocks_loading(p)]
        if blocking:
            return Verdict(False, first_problem(blocking).line)
        for rel in self._rels(file for file in files.layout_files() if file.essential and file.for_loading):
            if not self._is_file(rel):
                return Verdict(False, f"{rel} is missing")
        for weights in _weights_loaded(peft):
            if self._holds(weights):
                return self._adapter_verdict(weights) if _adapter(weights) else self._full_weights_verdict(weights)
        shards = self._rels(state_pieces.tensor_files(state_pieces.MODEL, "weights", "dcp"))
        if any(self.checked.shapes(rel) is not None for rel in shards) and not self.policy_folder:
            return Verdict(
                False,
                f"the weights are DCP shards only; run `lerobot convert-dcp --checkpoint_dir={self.root}` first",
            )
        return Verdict(False, f"{self.pretrained}/ holds no loadable weights")

    def _adapter_verdict(self, adapter: LayoutFile) -> Verdict:
        """An adapter loads onto its base policy with the other files loading reads of a PEFT checkpoint alone."""
        alongside = (file for file in files.layout_files()
                     if file.for_loading and _adapter(file) and not file.holds_tensors)
        for rel in self._rels(alongside):
            if not self._is_file(rel):
                return Verdict(False, f"{rel} is missing")
        return Verdict(True, f"PEFT adapter {self._rels([adapter])[0]} on its base policy")

    def _full_weights_verdict(self, file: LayoutFile) -> Verdict:
        """Full weights load when their shapes are what ``config.json`` builds, or, where those cannot be
        known, when a verified ``checksums.json`` says they were saved with it."""
        weights = self._rels([file])[0]
        if not self.shapes_unknown:
            return Verdict(True, f"{weights}, its shapes as {L.POLICY_CONFIG} builds the model")
        together = {weights, *(rel for rel in self._shape_sources() if self._exists(rel))}
        if self.matching.issuperset(together):
            return Verdict(
                True,
                f"{weights}, saved together with {L.POLICY_CONFIG}: both match {L.MANIFEST} ({self.shapes_unknown})",
            )
        return Verdict(
            None,
            f"{weights} is whole, but its shapes are unchecked: {self.shapes_unknown}, and no verified "
            f"{L.MANIFEST} ties it to {L.POLICY_CONFIG}",
        )

    def _word_layout_problems(self, loadable: Verdict) -> None:
        if loadable.ok:
            works = f"loading the weights still works: --policy.path={self.root / L.PRETRAINED_DIR}"
        elif loadable.ok is None:
            works = f"loading the weights may work: --policy.path={self.root / L.PRETRAINED_DIR} ({loadable.why})"
        else:
            works = f"its weights do not load either ({loadable.why})"
        self.problems[0:0] = [
            Problem(rel, f"{rel}: {what}; it cannot be resumed; {works}") for rel, what in self.layout_problems
        ]

    def _resumable(self) -> Verdict:
        if self.policy_folder:
            return Verdict(False, "a policy folder holds no training state: train from it with --policy.path")
        if not self.problems:
            return Verdict(True, "every file of the layout is present and consistent")
        more = f" (and {len(self.problems) - 1} more problems)" if len(self.problems) > 1 else ""
        return Verdict(False, first_problem(self.problems).line + more)

    def _state_pieces(self, ts: dict[str, Any] | None) -> list[PieceInfo]:
        """Every piece of the layout table the folder holds: by its files, or its field of the record."""
        if self.policy_folder:
            return []  # the weights alone: no training state
        held = []
        for piece in state_pieces.state_pieces():
            where = [file.path for file in piece.files if self._exists(file.path)]
            if piece.record_field is not None and ts is not None and piece.record_field in ts:
                where.append(f"{L.TRAINING_STEP}:{piece.record_field}")
            if where:
                held.append(PieceInfo(piece.name, where))
        return held

    # --- small helpers ----------------------------------------------------------------

    def _is_peft(self, ts: dict[str, Any] | None) -> bool:
        if ts is not None and isinstance(ts.get("peft"), bool):
            return ts["peft"]
        return any(self._holds(file) for file in state_pieces.MODEL.files if file.holds_tensors and _adapter(file))

    def _weights_kind(self, ts: dict[str, Any] | None) -> str | None:
        if ts is not None and ts.get("weights") in WEIGHTS_KINDS:
            return ts["weights"]
        gathered, shards = (self._holds_any(state_pieces.MODEL, "weights", kind) for kind in ("gathered", "dcp"))
        return {(True, False): "gathered", (False, True): "dcp", (True, True): "gathered+dcp"}.get((gathered, shards))

    def _optimizer_kind(self, ts: dict[str, Any] | None) -> str | None:
        if self.policy_folder:
            return None
        if ts is not None and ts.get("optimizer") in OPTIMIZER_KINDS:
            return ts["optimizer"]
        stored = (kind for kind in ("dcp", "safetensors") if self._holds_any(state_pieces.OPTIMIZER, "optimizer", kind))
        return next(stored, None)  # shards first, as a resume reads them first

    def _holds_any(self, piece: state_pieces.StatePiece, field: str, kind: str) -> bool:
        """Whether the folder holds ``piece``'s tensors as a record saying ``field: kind`` has them stored."""
        return any(self._holds(file) for file in state_pieces.tensor_files(piece, field, kind))

    def _step(self, ts: dict[str, Any] | None) -> int | None:
        if ts is not None and type(ts.get("step")) is int:
            return ts["step"]
        if self.policy_folder:
            return None
        return int(self.root.name) if L.is_step_dir_name(self.root.name) else None

    def _rels(self, found: Iterable[LayoutFile]) -> list[str]:
        """Where this folder keeps files of the layout table (whose paths are the step folder's): a
        policy folder is a pretrained folder alone, under its own name, with none of the others."""
        prefix = f"{L.PRETRAINED_DIR}/"
        rels = []
        for file in found:
            if file.path.startswith(prefix):
                rels.append(f"{self.pretrained}/{file.path.removeprefix(prefix)}")
            elif not self.policy_folder:
                rels.append(file.path)
        return rels

    def _holds(self, file: LayoutFile) -> bool:
        """Whether the folder holds ``file`` as the entry the table says: a folder, or a regular file."""
        return any(self._exists(rel) if file.folder else self._is_file(rel) for rel in self._rels([file]))

    def _exists(self, *parts: str) -> bool:
        return os.path.exists(self.root.joinpath(*parts))  # False, not an error, where this user may not look

    def _is_file(self, *parts: str) -> bool:
        return os.path.isfile(self.root.joinpath(*parts))

    def _unopenable(self, rel: str) -> bool:
        """Whether ``rel`` (or a folder it lies in) is named already as not a file or as unreadable:
        whatever else could be said about it (missing, differing from checksums.json) is unknown."""
        return any(
            p.cause in (UNREADABLE, NOT_A_FILE)
            and (p.file == rel or p.line.startswith(f"{rel}:") or (p.file.endswith("/") and rel.startswith(p.file)))
            for p in self.problems
        )

    def _problem(self, rel: str, message: str) -> None:
        self.problems.append(Problem(rel, f"{rel}: {message}"))


def _adapter(file: LayoutFile) -> bool:
    """Whether only a PEFT checkpoint holds ``file`` (its adapter's weights or config)."""
    return not file.accepts("peft", False)


def _weights_loaded(peft: bool) -> list[LayoutFile]:
    """The gathered weights loading reads, in the order it looks for them: a PEFT checkpoint's adapter
    first, then (for any checkpoint) the full model's."""
    gathered = state_pieces.tensor_files(state_pieces.MODEL, "weights", "gathered")
    return [file for file in gathered if peft and _adapter(file)] + [file for file in gathered if not _adapter(file)]


def trained_on(train_config: Any) -> dict[str, Any] | None:
    """The data a run's ``train_config.json`` names: its dataset type and id, or a mixture's
    members (``repo_id``, weight, renames) and how shares were set; None without the file."""
    dataset = train_config.get("dataset") if isinstance(train_config, dict) else None
    if not isinstance(dataset, dict):
        return None
    summary: dict[str, Any] = {"type": dataset.get("type")}
    mixture = dataset.get("mixture")
    if isinstance(mixture, list):
        summary["mixture"] = [
            {key: member.get(key) for key in ("repo_id", "weight", "rename_map", "episodes")}
            for member in mixture if isinstance(member, dict)
        ]
        summary["mixture_alpha"] = dataset.get("mixture_alpha")
    elif dataset.get("repo_id") is not None:
        summary["repo_id"] = dataset.get("repo_id")
    return summary


def _infos(header: dict[str, Any]) -> list[TensorInfo]:
    return [
        TensorInfo(name, e["dtype"], e["shape"], tensor_nbytes(e["dtype"], e["shape"]))
        for name, e in tensors(header).items()
    ]


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
