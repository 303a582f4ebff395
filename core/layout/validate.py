"""Every file of a checkpoint checked before anything reads it: the loaders and ``inspect-checkpoint`` share it.

A resume, ``--policy.path``, ``lerobot eval`` and ``load_pretrained`` read a checkpoint's
JSON files, safetensors files and DCP folders; ``inspect-checkpoint`` reports on them.
All of them go through ``check_step_folder`` / ``check_pretrained_folder``, which read
each file once (JSON, safetensors headers, DCP metadata, never tensor data) and check it
by the rule of its kind (``core.layout.file_rules``; ``config.json`` by its policy type,
as ``--policy.path`` validates it: ``core.layout.pretrained_config``), so a damaged file
is one line naming it before any model is built, and inspect's "resumable" and
"loadable" are what the loaders accept.
``check_resumable`` and ``check_loadable`` turn the first problem into the loaders'
``CheckpointError`` (``refuse``). What only torch can tell (the values inside a random
state, the optimizer state against the live model) the loader checks itself, in the
same words.

Each problem has a cause. Damage (wrong contents; a folder, a named pipe or a device
where a file should be: none is ever opened) is refused with the caller's advice, such
as resuming an earlier step. A file the system refuses to read (permissions, ownership,
a disk error) is named with its errno and fix instead, and comes first: nothing is
known about its contents, and advice for damage would be wrong.

Nothing outside the checkpoint is read through it: every entry of ``pretrained_model/``
and ``training_state/`` must resolve inside the step folder (links followed), a
processor's ``state_file`` is a file name in its folder, and DCP shards lie in theirs
(``dcp_metadata.check_dcp_shards``).

Across files, the optimizer state is checked against the weights it belongs to. Torch-free.
"""

from __future__ import annotations

import os
import stat
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lerobot_kit.core.errors import CheckpointError
from lerobot_kit.core.layout import paths as L
from lerobot_kit.core.layout.dcp_metadata import Metadata, check_dcp_shards, read_dcp_metadata, tensor_entries
from lerobot_kit.core.layout.file_access import (
    CheckpointAccessError,
    NotAFileError,
    access_line,
    entry_mode,
    not_a_file_line,
)
from lerobot_kit.core.layout.file_rules import (
    OUTSIDE,
    adapter_config_problems,
    dataset_meta_problems,
    group_members,
    natural,
    no_rule,
    object_problems,
    policy_config_problems,
    processor_problems,
)
from lerobot_kit.core.layout.files import (
    CheckpointKind,
    content_rule,
    layout_files,
    missing,
    older_layout,
    resumable_record,
)
from lerobot_kit.core.layout.hub_snapshot import cached_repo_of
from lerobot_kit.core.layout.json_file import json_type, read_json
from lerobot_kit.core.layout.safetensors_header import read_safetensors_header, tensors
from lerobot_kit.core.layout.state_pieces import MODEL, tensor_files
from lerobot_kit.core.layout.training_step import TrainingStep, other_layout, recorded_training_step
from lerobot_kit.core.layout.training_step import problems as record_problems

Shapes = dict[str, tuple[int, ...]]
GATHERED_WEIGHTS = tuple(file.path for file in tensor_files(MODEL, "weights", "gathered"))
_MODEL_SHARDS = tensor_files(MODEL, "weights", "dcp")
RECORD = f"{L.TRAINING_STATE_DIR}/{L.TRAINING_STEP}"

# What a problem is, which decides what a refusal says about it.
DAMAGE = "damage"  # the contents are wrong: what to do is the caller's advice (an earlier step)
NOT_A_FILE = "not a file"  # damage too: a folder, a named pipe or a device where a file should be
UNREADABLE = "unreadable"  # the system refused to read it: the line names the errno and the fix
FOREIGN = "foreign"  # another library's file no installed type reads: the line says what to do


@dataclass(frozen=True)
class Problem:
    file: str  # relative to the checked folder's root, e.g. "pretrained_model/config.json"
    line: str  # the whole line, starting with ``file``
    cause: str = DAMAGE

    @property
    def damage(self) -> bool:
        """Whether the advice for a damaged checkpoint applies (UNREADABLE and FOREIGN lines carry their own fix)."""
        return self.cause in (DAMAGE, NOT_A_FILE)

    @classmethod
    def of(cls, rel: str, err: CheckpointError) -> Problem:
        """A reader's one-line error as a problem, with its cause."""
        cause = UNREADABLE if isinstance(err, CheckpointAccessError) else (
            NOT_A_FILE if isinstance(err, NotAFileError) else DAMAGE)
        return cls(rel, str(err), cause)


@dataclass(frozen=True)
class Weights:
    """A weights file or shard folder as the optimizer check compares with it."""

    source: str  # its path relative to the checked folder
    shapes: Shapes  # its tensors
    names: frozenset[str]  # every entry it holds (DCP shards may hold non-tensor entries too)


@dataclass(frozen=True)
class Entry:
    """One entry of ``pretrained_model/`` or ``training_state/`` (a DCP folder counts as one)."""

    rel: str
    path: Path
    kind: str  # json | safetensors | dcp | other


@dataclass
class CheckedFolder:
    """A checkpoint folder read and checked: what parsed, and every problem, one line each.

    ``root`` is the step folder (or the parent of a bare ``pretrained_model``-like folder,
    ``pretrained``); files are named relative to it. Nothing may resolve outside ``inside``.
    """

    root: Path
    pretrained: str  # the sub-folder holding the loadable files
    inside: Path
    entries: list[Entry] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    json: dict[str, Any] = field(default_factory=dict)  # rel -> value, for files that parse
    headers: dict[str, dict[str, Any]] = field(default_factory=dict)  # rel -> valid safetensors header
    dcp: dict[str, Metadata] = field(default_factory=dict)  # rel -> metadata of a DCP folder that read
    incomplete: set[str] = field(default_factory=set)  # DCP folders whose shards are missing or short
    record: TrainingStep | None = None  # training_step.json, when it is a valid record of this layout
    other_layout: str | None = None  # why training_step.json is of another layout, when it is

    def blocks_loading(self, problem: Problem) -> bool:
        """Loading (``--policy.path``, eval) reads the pretrained folder, less the run config and the
        shards, and the step folder's record, which must at least be a file it can read (in a
        folder it can list: ``recorded_training_step``). Anywhere in the pretrained folder, an entry
        that is not a file or that the system will not read stops it: no loader opens one."""
        unopenable = problem.cause in (NOT_A_FILE, UNREADABLE)
        if problem.file in (RECORD, f"{L.TRAINING_STATE_DIR}/") and unopenable:
            return True
        prefix = f"{self.pretrained}/"
        if not (problem.file == prefix or problem.file.startswith(prefix)):
            return False
        name = problem.file.removeprefix(prefix).split("/", 1)[0]
        return unopenable or name not in _not_loaded()

    def shapes(self, rel: str) -> Shapes | None:
        """Tensor name -> shape of a safetensors file or whole DCP folder that was read."""
        if rel in self.headers:
            return {name: tuple(e["shape"]) for name, e in tensors(self.headers[rel]).items()}
        if rel in self.dcp and rel not in self.incomplete:
            return {name: tuple(e.size) for name, e in tensor_entries(self.dcp[rel]).items()}
        return None

    # --- reading every entry ------------------------------------------------------------

    def scan(self, sub: str) -> None:
        folder = self.root / sub
        try:
            mode = entry_mode(folder, f"{sub}/")
        except CheckpointAccessError as err:
            self.problems.append(Problem.of(f"{sub}/", err))
            return
        if mode is None or not stat.S_ISDIR(mode):
            return
        if not L.resolves_inside(folder, self.inside):
            self._problem(f"{sub}/", f"links outside the checkpoint (to {L.link_target(folder)}); {OUTSIDE}")
            return
        try:
            children = sorted(folder.iterdir())
        except OSError as err:
            self.problems.append(Problem(f"{sub}/", access_line(f"{sub}/", err, folder=True), UNREADABLE))
            return
        for child in children:
            self._read(sub, child)

    def _read(self, sub: str, path: Path) -> None:
        rel = f"{sub}/{path.name}"
        if not L.resolves_inside(path, self.inside):
            self.entries.append(Entry(rel, path, "other"))
            self._problem(rel, f"links outside the checkpoint (to {L.link_target(path)}); {OUTSIDE}")
            return
        try:
            mode = entry_mode(path, rel)
        except CheckpointAccessError as err:
            self.entries.append(Entry(rel, path, "other"))
            self.problems.append(Problem.of(rel, err))
            return
        if mode is not None and not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
            # A named pipe, a device or a socket: nothing in a checkpoint is one, and no reader opens it.
            self.entries.append(Entry(rel, path, "other"))
            self.problems.append(Problem(rel, not_a_file_line(rel, mode), NOT_A_FILE))
            return
        if mode is not None and stat.S_ISDIR(mode):
            if path.name in (L.DCP_MODEL_DIR, L.DCP_OPTIMIZER_DIR) or os.path.exists(path / L.DCP_METADATA):
                self.entries.append(Entry(rel, path, "dcp"))
                self._read_dcp(path, rel)
                return
            self.entries.append(Entry(rel, path, "other"))
            if path.suffix in (".json", ".safetensors"):
                self._problem(rel, "a folder, not a file")
            return
        if path.suffix == ".json":
            self.entries.append(Entry(rel, path, "json"))
            try:
                self.json[rel] = read_json(path, label=rel)
            except CheckpointError as err:
                self.problems.append(Problem.of(rel, err))
                return
            for line in self._json_rule(sub, path.name)(self.json[rel]):
                self._problem(rel, line)
            if sub == self.pretrained and path.name == L.POLICY_CONFIG and not self._has_problem(rel):
                self._check_policy_config(rel, self.json[rel])
        elif path.suffix == ".safetensors":
            self.entries.append(Entry(rel, path, "safetensors"))
            try:
                self.headers[rel] = read_safetensors_header(path, label=rel)
            except CheckpointError as err:
                self.problems.append(Problem.of(rel, err))
                return
            rule = content_rule(rel) if sub == L.TRAINING_STATE_DIR else None
            for line in rule(self.headers[rel]) if rule else []:
                self._problem(rel, line)
        else:
            self.entries.append(Entry(rel, path, "other"))

    def _read_dcp(self, folder: Path, rel: str) -> None:
        try:
            metadata = read_dcp_metadata(folder, label=rel)
        except CheckpointError as err:
            self.problems.append(Problem.of(rel, err))
            return
        shard_problems = check_dcp_shards(folder, metadata, label=rel)
        self.problems.extend(Problem(rel, line) for line in shard_problems)
        if shard_problems:
            self.incomplete.add(rel)
        self.dcp[rel] = metadata

    def _check_policy_config(self, rel: str, value: Any) -> None:
        """``config.json`` validated by its policy type, as ``--policy.path`` validates it."""
        from lerobot_kit.core.layout.pretrained_config import pretrained_config_problem

        found = pretrained_config_problem(self.root / self.pretrained, value)
        if found is not None:
            self.problems.append(Problem(rel, f"{rel}: {found.line}", DAMAGE if found.damage else FOREIGN))

    def _has_problem(self, rel: str) -> bool:
        return any(p.file == rel for p in self.problems)

    def _json_rule(self, sub: str, name: str) -> Callable[[Any], list[str]]:
        if sub == L.TRAINING_STATE_DIR:
            return self._training_step if name == L.TRAINING_STEP else content_rule(f"{sub}/{name}") or no_rule
        if sub != self.pretrained:
            return no_rule
        if name.startswith((L.PREPROCESSOR, L.POSTPROCESSOR)):
            return lambda value: processor_problems(value, self.root / sub, self.inside)
        rules = {
            L.POLICY_CONFIG: policy_config_problems,
            L.DATASET_META: dataset_meta_problems,
            L.TRAIN_CONFIG: object_problems,
            L.ADAPTER_CONFIG: adapter_config_problems,
        }
        return rules.get(name, no_rule)

    def _training_step(self, raw: Any) -> list[str]:
        if not isinstance(raw, dict):
            return [f"must be a JSON object, not {json_type(raw)}"]
        self.other_layout = other_layout(raw)
        if self.other_layout is not None:
            return []  # not damage: the reader words it (it cannot be resumed, its weights may load)
        found = record_problems(raw)
        folder = self.root.name
        if L.is_step_dir_name(folder) and type(raw.get("step")) is int and raw["step"] != int(folder):
            found.append(f"step is {raw['step']}, but the folder is {folder}")
        if not found:
            self.record = TrainingStep.from_json(raw, L.TRAINING_STEP)
        return found

    # --- consistency between files ------------------------------------------------------

    def check_optimizer(self) -> None:
        """The optimizer state must belong to these weights.

        State tensors are ``state.<param>.<key>``, the parameter named by its FQN (what the
        trainer writes) or by its index. A full model's weights carry the same names, so an
        FQN must be among them, with their shape; indices (and a PEFT adapter's parameters,
        stored under peft's names) must find their shapes among the remaining weights'. Only
        for a valid record of this layout, and not for a sharded run's gathered optimizer
        state (an older layout, which readers refuse as such).
        """
        T = L.TRAINING_STATE_DIR
        record = self.record
        if record is None or older_layout(self.root, record.topology.dp_shard) is not None:
            return
        groups_rel, state_rel, dcp_rel = (f"{T}/{L.OPTIMIZER_PARAM_GROUPS}", f"{T}/{L.OPTIMIZER_STATE}",
                                          f"{T}/{L.DCP_OPTIMIZER_DIR}")
        weights = self._reference_weights(record.peft)
        if state_rel in self.headers:
            listed = group_members(self.json.get(groups_rel))
            per_param: dict[str, list[tuple[int, ...]]] = {}
            for name, shape in (self.shapes(state_rel) or {}).items():
                param = state_param(name)
                if param is None or not name.startswith("state."):
                    self._problem(state_rel, f"unexpected tensor {name!r} (expected state.<parameter>.<key>)")
                    continue
                per_param.setdefault(param, []).append(shape)
            if listed is not None:
                stray = sorted((p for p in per_param if p not in listed), key=natural)
                if stray:
                    self._problem(
                        state_rel, f"holds state for parameter {stray[0]}, which no param group of {groups_rel} lists"
                    )
                if weights is not None:
                    self._check_listed(groups_rel, listed, weights, named=not record.peft)
            if weights is not None:
                self._check_state_shapes(state_rel, per_param, weights, named=not record.peft)
        elif self.shapes(dcp_rel) is not None and weights is not None:
            per_param = {}
            for name, shape in (self.shapes(dcp_rel) or {}).items():
                param = state_param(name)
                if param is not None:
                    per_param.setdefault(param, []).append(shape)
            self._check_state_shapes(dcp_rel, per_param, weights, named=not record.peft)

    def _check_listed(self, rel: str, listed: set[str], weights: Weights, *, named: bool) -> None:
        unknown = sorted((p for p in listed if not p.isdigit() and p not in weights.names), key=natural)
        if named and unknown:
            self._problem(rel, f"lists parameter {unknown[0]}, which {weights.source} does not hold: the optimizer "
                               "state is not this model's")
        elif len(listed) > len(weights.names):
            self._problem(rel, f"lists {len(listed)} parameters, but {weights.source} holds only "
                               f"{len(weights.names)} entries: the optimizer state is not this model's")

    def _check_state_shapes(
        self, rel: str, per_param: dict[str, list[tuple[int, ...]]], weights: Weights, *, named: bool
    ) -> None:
        """``named``: the weights are stored under the model's own names (not a PEFT adapter's),
        so a parameter named by FQN must be one of them."""
        source, by_name = weights.source, weights.shapes
        available = Counter(by_name.values())
        unnamed: list[tuple[str, tuple[int, ...]]] = []
        for param, states in sorted(per_param.items(), key=lambda kv: natural(kv[0])):
            if named and not param.isdigit() and param not in weights.names:
                self._problem(rel, f"holds state for parameter {param}, which {source} does not hold: the optimizer "
                                   "state is not this model's")
                return
            shapes = {shape for shape in states if shape}  # scalars (e.g. Adam's step) say nothing
            if len(shapes) > 1:
                self._problem(rel, f"state of parameter {param} has tensors of different shapes "
                                   f"{sorted(list(s) for s in shapes)}")
                return
            if not shapes:
                continue
            shape = shapes.pop()
            if param in weights.names and param not in by_name:
                continue  # a non-tensor entry of the shards: the loader refuses it, naming the entry
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

    def _reference_weights(self, peft: bool) -> Weights | None:
        """The weights the optimizer updated: the gathered file, else whole DCP shards (a step folder's)."""
        for rel in (file.path for file in MODEL.files if file.holds_tensors and file.accepts("peft", peft)):
            shapes = self.shapes(rel)
            if shapes is not None:
                names = frozenset(self.dcp[rel].state_dict_metadata) if rel in self.dcp else frozenset(shapes)
                return Weights(rel, shapes, names)
        return None

    def _problem(self, rel: str, what: str) -> None:
        self.problems.append(Problem(rel, f"{rel}: {what}"))


def check_step_folder(step_dir: Path) -> CheckedFolder:
    """Every file of a step folder's ``pretrained_model/`` and ``training_state/``, read and checked."""
    step_dir = Path(step_dir)
    checked = CheckedFolder(step_dir, L.PRETRAINED_DIR, step_dir)
    checked.scan(L.PRETRAINED_DIR)
    checked.scan(L.TRAINING_STATE_DIR)
    checked.check_optimizer()
    return checked


def check_pretrained_folder(folder: Path) -> CheckedFolder:
    """Every file of a loadable folder: a step folder's ``pretrained_model/`` (nothing may
    leave the step folder; what its record says loading needs must be there, as the layout
    table words it) or a folder ``save_pretrained`` wrote (nothing may leave it; for a
    snapshot in the Hub's cache, nothing may leave that repo's cache folder)."""
    folder = Path(folder)
    if folder.name == L.PRETRAINED_DIR and (folder.parent / L.TRAINING_STATE_DIR).is_dir():
        checked = CheckedFolder(folder.parent, L.PRETRAINED_DIR, folder.parent)
        checked.scan(checked.pretrained)
        try:
            record = recorded_training_step(folder.parent)
        except CheckpointError:  # there, but not a file this user can read: loading stops on it, named so
            record = None
            try:
                read_json(folder.parent / RECORD, label=RECORD)
            except CheckpointError as err:
                checked.problems.append(Problem.of(RECORD, err))
        if record is not None:  # the files its record makes loading need, by the layout table's words
            shards = any(os.path.isdir(folder.parent / file.path) for file in _MODEL_SHARDS)
            try:
                lacking = list(missing(folder.parent, CheckpointKind.of(record)))
            except CheckpointAccessError as err:
                checked.problems.append(Problem.of(err.file or f"{L.PRETRAINED_DIR}/", err))
                lacking = []
            for file, line in lacking:
                # Gathered weights gone beside the shards: loading says how to merge them (convert-dcp).
                if file.for_loading and not (shards and file.path in GATHERED_WEIGHTS):
                    checked.problems = [p for p in checked.problems if p.file != file.path]
                    checked.problems.append(Problem(file.path, line))
        return checked
    checked = CheckedFolder(folder.parent, folder.name, cached_repo_of(folder) or folder)
    checked.scan(checked.pretrained)
    return checked


def check_resumable(step_dir: Path, advice: str) -> TrainingStep:
    """The record of a step folder a resume can continue from (``files.resumable_record``), once
    every file in it passed its check; else one ``CheckpointError`` line naming the first problem.
    ``advice`` (what to do about a damaged checkpoint) follows damage only (``refuse``)."""
    record = resumable_record(step_dir, advice)
    checked = check_step_folder(step_dir)
    refuse(checked.root, checked.problems, advice)
    return record


def check_loadable(pretrained_dir: Path, advice: str = "load an earlier step folder of the run") -> None:
    """Refuse, in one ``CheckpointError`` line, a folder whose files loading would read are damaged."""
    checked = check_pretrained_folder(pretrained_dir)
    refuse(checked.root, [p for p in checked.problems if checked.blocks_loading(p)], advice)


def refuse(root: Path, problems: list[Problem], advice: str) -> None:
    """One ``CheckpointError`` line for ``problems`` (none: nothing raised), naming ``first_problem``.

    Only damage ends with ``the checkpoint is damaged: <advice>``; a file the system refused
    to read is a ``CheckpointAccessError`` whose line carries its own fix.
    """
    if not problems:
        return
    first = first_problem(problems)
    more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
    if first.cause == UNREADABLE:
        raise CheckpointAccessError(f"{root}/{first.line}{more}", f"{root}/{first.file}")
    why = f"; the checkpoint is damaged: {advice}" if first.damage else ""
    raise CheckpointError(f"{root}/{first.line}{more}{why}")


def first_problem(problems: list[Problem]) -> Problem:
    """The problem a verdict names: a file the system refused to read first (until it can be
    read nothing is known about the checkpoint, and advice for damage, which may delete step
    folders, would be wrong), then another library's file (its line says what to do), then
    the first found."""
    for cause in (UNREADABLE, FOREIGN):
        for problem in problems:
            if problem.cause == cause:
                return problem
    return problems[0]


# --- small helpers ------------------------------------------------------------------------


def _not_loaded() -> frozenset[str]:
    """The names in the pretrained folder of the table's files that loading does not read (the run's
    config, the shards): a problem with one of them stops a resume, not a load. Read when asked,
    so that the files of a plugin's piece count too."""
    prefix = f"{L.PRETRAINED_DIR}/"
    return frozenset(file.path.removeprefix(prefix) for file in layout_files()
                     if file.path.startswith(prefix) and not file.for_loading)


def state_param(name: str) -> str | None:
    """The parameter of an optimizer tensor ``[prefix.]state.<parameter>.<key>``, else None."""
    _, found, rest = name.partition("state.")
    param, dot, _key = rest.rpartition(".")
    return param if found and dot and param else None
