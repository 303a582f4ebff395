"""Every flag the docs give is a real flag of its command, and every quoted default is the real one.

A ``lerobot <command> ...`` in a shell block or inline code may use only the flags that
command accepts, read in-process as ``--help`` prints them (``cli.help.render_help`` for
the config-driven commands, the click options for the others): ``--policy.*``,
``--dataset.*`` and ``--env.*`` follow the ``--*.type=`` the same command picks (its
default otherwise; LeRobot bridge types ``lerobot_*`` by the bridge's shipped
``schemas.json``). ``torchrun``, ``accelerate launch``, SLURM and pytest flags are theirs
and must be ones they have. A ``--flag`` in a page's prose must belong to a command the
page is about (``PAGE_COMMANDS``), under any type of its section, or to one of those tools.
Nothing here imports torch.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import REPO
from lerobot_kit.core.config.lerobot_flags import INSTEAD, lerobot_flag_advice

ALL = ("train", "plan", "eval", "convert-dcp", "inspect-checkpoint", "plugins", "benchmarks")
PAGE_COMMANDS: dict[str, tuple[str, ...]] = {
    "README.md": ALL,
    "benchmarks/README.md": ("train", "eval", "convert-dcp", "inspect-checkpoint", "benchmarks"),
    "docs/index.md": ALL,
    "docs/configuration.md": ("train", "plan"),
    "docs/data.md": ("train",),
    "docs/mixtures.md": ("train", "plan", "inspect-checkpoint"),
    "docs/parallelism.md": ("train", "plan"),
    "docs/planning.md": ("plan", "train"),
    "docs/checkpoints.md": ("train", "convert-dcp", "inspect-checkpoint"),
    "docs/reliability.md": ("train", "plan", "eval", "convert-dcp", "inspect-checkpoint", "benchmarks"),
    "docs/fault-injection.md": ("train", "benchmarks"),
    "docs/peft.md": ("train", "convert-dcp"),
    "docs/evaluation.md": ("eval", "train"),
    "docs/plugins.md": ("train", "plugins", "inspect-checkpoint", "convert-dcp"),
    "docs/performance.md": ("train", "eval", "convert-dcp", "inspect-checkpoint", "benchmarks"),
    "docs/gpu.md": ("train", "eval", "inspect-checkpoint", "benchmarks"),
    "docs/architecture.md": ALL,
    "docs/contributing.md": ALL,
}
# Other tools' flags the docs use (theirs, not ours): each must still be one the tool has.
TORCHRUN = {"--nproc-per-node", "--nproc_per_node", "--nnodes", "--node-rank", "--node_rank", "--rdzv-endpoint",
            "--rdzv_endpoint", "--rdzv-backend", "--rdzv_backend", "--rdzv-id", "--rdzv_id", "--max-restarts",
            "--max_restarts", "--standalone", "--master-addr", "--master_addr", "--master-port", "--master_port",
            "-m", "--module"}
ACCELERATE = {"--multi_gpu", "--num_processes", "--num_machines", "--machine_rank", "--main_process_ip",
              "--main_process_port", "--config_file", "--mixed_precision", "--cpu", "-m", "--module"}
SLURM = {"--requeue", "--signal", "--nodes", "--ntasks-per-node", "--gres", "--time", "--job-name"}
PYTEST = {"-q", "-n", "-p", "-k", "-x", "--dist"}
LAUNCHERS = {"torchrun": TORCHRUN, "accelerate": ACCELERATE, "srun": SLURM, "sbatch": SLURM}
OTHERS = TORCHRUN | ACCELERATE | SLURM | PYTEST
# Scripts that pass what follows their own flag to `lerobot train`.
TAKES_TRAIN_FLAGS = {"benchmarks/loop_overhead.py": {"--profile"}}

FENCE = re.compile(r"^[ \t]*```(\w*)\n(.*?)^[ \t]*```", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)
FLAG = re.compile(r"(?<![\w-])--[A-Za-z*][\w.*-]*(?:\{[^}\s]*\}[\w.*-]*)?")
HELP_LINE = re.compile(r"^  (--\S+)  (.*?)  \(default: (.*?)\)", re.MULTILINE)
SHELLS = {"bash", "sh", "shell"}
QUOTED_ERROR = re.compile(r"unknown flag|did you mean")
COMMAND_START = re.compile(r"^(lerobot|torchrun|accelerate launch|srun|python (-m \S+|benchmarks/))\b")


# ----------------------------------------------------------------------------- what each command accepts


@dataclass
class Flags:
    """A command's flags with their defaults (as ``--help`` shows them); a ``dict`` flag
    also admits any key below it (``--dataset.image_transforms.tfs.brightness.kwargs``)."""

    defaults: dict[str, str] = field(default_factory=dict)
    open_prefixes: set[str] = field(default_factory=set)

    def add_help(self, text: str) -> None:
        for flag, type_name, default in HELP_LINE.findall(text):
            self.defaults.setdefault(flag, default)
            if type_name.startswith("dict["):
                self.open_prefixes.add(flag + ".")

    def merge(self, other: Flags) -> Flags:
        return Flags({**other.defaults, **self.defaults}, self.open_prefixes | other.open_prefixes)

    def accepts(self, flag: str) -> bool:
        if "*" in flag:  # a family: `--peft.*`, `--*.type`
            pattern = re.compile(re.escape(flag).replace(r"\*", r"[\w.]*"))
            return any(pattern.fullmatch(f) for f in self.defaults)
        return flag in self.defaults or any(flag.startswith(p) for p in self.open_prefixes)


@functools.cache
def _sections() -> dict[str, tuple[str, ...]]:
    """The polymorphic sections and their registered types."""
    from lerobot_kit.core.config.flags import POLYMORPHIC
    from lerobot_kit.core.registry.registry import get_registry

    registry = get_registry()
    return {name: tuple(registry.names(name)) for name in POLYMORPHIC}


@functools.cache
def _bridge_schemas() -> dict[str, list[str]]:
    path = REPO / "contrib" / "lerobot-kit-lerobot" / "src" / "lerobot_kit_lerobot" / "schemas.json"
    return {f"lerobot_{name}": [f["name"] for f in schema["fields"]]
            for name, schema in json.loads(path.read_text())["policies"].items()}


@functools.cache
def config_flags(command: str, types: tuple[tuple[str, str], ...]) -> Flags:
    """``train``/``plan``/``eval`` flags for the section types ``types`` picks (others: default)."""
    from lerobot_kit.cli.help import render_help
    from lerobot_kit.core.config.schema import PolicyConfig, TrainConfig
    from lerobot_kit.core.eval.config import EvalRunConfig

    root = EvalRunConfig if command == "eval" else TrainConfig
    picked = dict(types)
    bridge = picked.get("policy") if picked.get("policy") in _bridge_schemas() else None
    if bridge and bridge not in _sections()["policy"]:  # not installed here: its shipped schema says
        del picked["policy"]
    else:
        bridge = None
    flags = Flags()
    flags.add_help(render_help([], root, [f"--{section}.type={name}" for section, name in picked.items()]))
    if bridge:
        flags.defaults = {f: d for f, d in flags.defaults.items()
                          if not f.startswith("--policy.") or f.removeprefix("--policy.") in PolicyConfig.model_fields}
        flags.defaults |= {f"--policy.{name}": "" for name in _bridge_schemas()[bridge]}
    if command == "plan":
        from lerobot_kit.cli.plan import DEVICE_MEMORY_FLAG, JSON_FLAG, WORLD_SIZE_FLAG

        flags.defaults |= {f"--{name}": "" for name in (WORLD_SIZE_FLAG, DEVICE_MEMORY_FLAG, JSON_FLAG)}
    flags.defaults["--help"] = ""
    return flags


@functools.cache
def click_flags(command: str) -> Flags:
    import importlib

    from lerobot_kit.cli.main import SUBCOMMANDS

    click_command = importlib.import_module(SUBCOMMANDS[command][0]).command
    flags = Flags()
    for param in click_command.params:
        for opt in [*param.opts, *param.secondary_opts]:
            if opt.startswith("--"):
                flags.defaults[opt] = "" if param.default is None else str(param.default)
    flags.defaults["--help"] = ""
    return flags


@functools.cache
def script_flags(script: str) -> Flags:
    """A benchmark script's flags, from its own ``--help`` (or usage line)."""
    result = subprocess.run([sys.executable, str(REPO / script), "--help"], capture_output=True, text=True,
                            timeout=60, cwd=REPO)
    flags = Flags()
    flags.defaults |= {f: "" for f in re.findall(r"(?<![\w-])--[a-z][\w-]*", result.stdout + result.stderr)}
    return flags


def command_flags(command: str, types: dict[str, str] | None = None) -> Flags:
    """What ``command`` accepts: with ``types`` the sections it picks, else every type of every section."""
    if command == "benchmarks":
        scripts = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "benchmarks").glob("*.py")
                         if p.name in ("run.py", "gpu.py", "render_docs.py", "loop_overhead.py"))
        return functools.reduce(Flags.merge, (script_flags(s) for s in scripts))
    if command in ("train", "plan", "eval"):
        if types is not None:
            return config_flags(command, tuple(sorted(types.items())))
        sections = _sections()
        combos = [config_flags(command, ((section, name),)) for section, names in sections.items() for name in names]
        return functools.reduce(Flags.merge, combos)
    return click_flags(command)


# ----------------------------------------------------------------------------- what the docs say


def expand(flag: str) -> list[str]:
    """``--a.{b,c}`` -> ``--a.b``, ``--a.c``."""
    match = re.search(r"\{([^}]*)\}", flag)
    if not match:
        return [flag]
    return [v for part in match.group(1).split(",") for v in expand(flag[:match.start()] + part + flag[match.end():])]


def shell_commands(text: str) -> Iterator[list[str]]:
    """Simple commands (word lists) of shell text: continuation lines joined, comments and
    operators split off, ``$(which lerobot)`` read as ``lerobot``; ``#SBATCH`` lines are sbatch's."""
    text = text.replace("\\\n", " ").replace("$(which lerobot)", "lerobot")
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("#SBATCH"):
            yield ["sbatch", *line.split()[1:]]
            continue
        lexer = shlex.shlex(line, posix=True)
        lexer.whitespace_split, lexer.commenters = True, "#"
        words: list[str] = []
        for word in lexer:
            ends = word.endswith(";") and word != ";"
            word = word.removesuffix(";") if ends else word
            if word in OPERATORS:
                if words:
                    yield words
                words = []
                continue
            words.append(word)
            if ends:
                yield words
                words = []
        if words:
            yield words


OPERATORS = {"&&", "||", ";", "|", "then", "if", "fi", "do", "done", "!", "else"}


def _strip(word: str) -> str:
    return word.strip("[]")  # `[--json]`: an optional flag in a usage line


def check_command(words: list[str]) -> list[str]:
    """Problems with one simple command's flags (empty for commands that are not checked)."""
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):  # VAR=value before a command
        words = words[1:]
    if not words:
        return []
    program, rest = words[0], words[1:]
    if program == "python" and rest[:2] == ["-m", "torch.distributed.run"]:
        program, rest = "torchrun", rest[2:]
    if program == "python" and rest[:2] == ["-m", "lerobot_kit.cli"]:
        program, rest = "lerobot", rest[2:]
    if program == "lerobot_kit.cli":  # the module a launcher's -m starts
        program = "lerobot"
    if program == "accelerate" and rest[:1] == ["launch"]:
        rest = rest[1:]
    if program in LAUNCHERS:
        problems = []
        while rest and _strip(rest[0]).startswith("-"):
            flag = _strip(rest.pop(0)).split("=", 1)[0]
            if flag not in LAUNCHERS[program]:
                problems.append(f"{program} {flag}: not a {program} flag this test knows")
        return problems + (check_command(rest) if rest else [])
    if program == "lerobot" and rest and not rest[0].startswith("-"):
        return check_lerobot(rest[0], [_strip(w) for w in rest[1:]])
    if program == "lerobot":
        return check_lerobot("", [_strip(w) for w in rest])
    if program == "python" and rest and rest[0].startswith("benchmarks/"):
        script, args = rest[0], [_strip(w) for w in rest[1:]]
        own = TAKES_TRAIN_FLAGS.get(script)
        if own is not None:
            head = [a for a in args if a in own]
            return [f"{script} {a}: unknown flag" for a in args[:1] if a not in own] + (
                check_lerobot("train", args[len(head):]))
        known = script_flags(script)
        return [f"{script} {f}: not a flag of the script" for f in _flags_of(args) if not known.accepts(f)]
    return []


def _flags_of(args: list[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in args if a.startswith("--")]


def check_lerobot(command: str, args: list[str]) -> list[str]:
    from lerobot_kit.cli.main import SUBCOMMANDS

    if command.startswith("<"):  # `lerobot <command>`: a placeholder
        return []
    if command not in SUBCOMMANDS:
        allowed = {"--help", "-h", "--version"}
        return [f"lerobot {a}: no such command or option" for a in args[:1] + [command] if a and a not in allowed][:1]
    types = {key.removeprefix("--").removesuffix(".type"): value for key, _, value in
             (a.partition("=") for a in args) if re.fullmatch(r"--\w+\.type", key)}
    if "dataset" not in types and any(a.startswith(("--dataset.repo_id=", "--dataset.mixture=")) for a in args):
        types["dataset"] = "lerobot"  # as the flag parser picks it
    if any("<" in v for v in types.values()):  # a placeholder type: any of them
        known = command_flags(command)
    else:
        known = command_flags(command, types) if command in ("train", "plan", "eval") else command_flags(command)
    return [f"lerobot {command} {flag}: not a flag of this command{_type_note(types)}"
            for flag in _flags_of(args) if not known.accepts(flag)]


def _type_note(types: dict[str, str]) -> str:
    return f" (with {', '.join(f'--{k}.type={v}' for k, v in types.items())})" if types else ""


def page_problems(rel: str) -> list[str]:
    text = (REPO / rel).read_text()
    problems: list[str] = []
    prose_flags: list[str] = []
    for lang, block in FENCE.findall(text):
        if lang in SHELLS:
            for words in shell_commands(block):
                problems += check_command(words)
    outside = FENCE.sub("", text)
    for _, span in CODE_SPAN.findall(outside):
        if QUOTED_ERROR.search(span):  # an error message quoted for its wrong flag
            continue
        if COMMAND_START.match(span.strip()):
            for words in shell_commands(span.strip()):
                problems += check_command(words)
        else:
            prose_flags += FLAG.findall(span)
    prose_flags += FLAG.findall(CODE_SPAN.sub("", outside))
    allowed = functools.reduce(Flags.merge, (command_flags(c) for c in PAGE_COMMANDS[rel]))
    for flag in prose_flags:
        for one in expand(flag.rstrip(".")):
            if one not in OTHERS and not allowed.accepts(one) and not lerobot_flag_advice(one.removeprefix("--")) \
                    and not _bridge_policy_flag(one):
                problems.append(f"{one}: named in the prose, but no flag of {', '.join(PAGE_COMMANDS[rel])}")
    return problems


def _bridge_policy_flag(flag: str) -> bool:
    """A ``--policy.*`` flag of a LeRobot bridge type (its shipped schema), which prose may name
    where it says what the bridge does."""
    return flag.startswith("--policy.") and any(
        flag.removeprefix("--policy.") in fields for fields in _bridge_schemas().values())


def quoted_defaults(rel: str) -> Iterator[tuple[str, str]]:
    """``(flag, value)`` for every "`--flag` (value)" or "`--flag=X` (value)" with a number as value."""
    for flag, value in re.findall(r"`(--[\w.]+)(?:=[^`]*)?` \((-?\d+(?:\.\d+)?)(?: s)?\)", (REPO / rel).read_text()):
        yield flag, value


# ----------------------------------------------------------------------------- the tests


def test_every_page_says_which_commands_it_is_about() -> None:
    docs = {p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md")}
    pages = {"README.md", "benchmarks/README.md", *docs}
    assert pages == set(PAGE_COMMANDS)


@pytest.mark.parametrize("rel", sorted(PAGE_COMMANDS))
def test_flags_are_real(rel: str) -> None:
    assert page_problems(rel) == []


@pytest.mark.parametrize("rel", sorted(PAGE_COMMANDS))
def test_quoted_defaults_are_the_real_ones(rel: str) -> None:
    wrong = []
    for flag, value in quoted_defaults(rel):
        candidates = [command_flags(c).defaults for c in PAGE_COMMANDS[rel] if c != "benchmarks"]
        defaults = [d[flag] for d in candidates if flag in d]
        per_type = [config_flags(c, ((section, name),)).defaults.get(flag) for c in ("train", "eval")
                    for section, names in _sections().items() for name in names]
        real = {v for v in [*defaults, *per_type] if v not in (None, "")}
        if not any(_same_number(value, v) for v in real):
            wrong.append(f"{flag} ({value}): the default is {' or '.join(sorted(real)) or 'not a number'}")
    assert wrong == []


def _same_number(quoted: str, default: str) -> bool:
    try:
        return math.isclose(float(quoted), float(default))
    except ValueError:
        return False


def test_lerobots_act_sizes_build_lerobots_act() -> None:
    """The flags the configuration page gives for LeRobot's ACT build its 51.6 M parameters
    (one camera, 14-dimensional state and action), counted from the policy's own weight
    shapes without building it; without `--policy.n_vae_encoder_layers=4` it is 43 M."""
    from lerobot_kit.api import DatasetMeta, FeatureSpec, parse_train_config

    text = (REPO / "docs" / "configuration.md").read_text()
    block = next(b for lang, b in FENCE.findall(text) if "--policy.n_vae_encoder_layers" in b)
    args = next(w for w in shell_commands(block) if w[:2] == ["lerobot", "train"])[2:]
    meta = DatasetMeta(
        features={"observation.state": FeatureSpec("float32", (14,)), "action": FeatureSpec("float32", (14,)),
                  "observation.images.top": FeatureSpec("image", (3, 480, 640))},
        stats={}, fps=50, num_episodes=1, num_frames=1,
    )

    def parameters(flags: list[str]) -> float:
        shapes = parse_train_config(flags).policy.weight_shapes(meta)
        buffers = ("running_mean", "running_var", "num_batches_tracked")
        return sum(math.prod(s) for k, s in shapes.items() if not k.endswith(buffers)) / 1e6

    assert round(parameters(args), 1) == 51.6
    assert "51.6 M parameters" in text
    assert round(parameters([a for a in args if not a.startswith("--policy.n_vae_encoder_layers")]), 0) == 43


def test_the_checks_catch_what_they_are_for() -> None:
    assert check_command(["lerobot", "train", "--policy.dim_modl=3"]) == [
        "lerobot train --policy.dim_modl: not a flag of this command"]
    assert check_command(["lerobot", "train", "--policy.type=diffusion", "--policy.n_vae_encoder_layers=4"]) == [
        "lerobot train --policy.n_vae_encoder_layers: not a flag of this command (with --policy.type=diffusion)"]
    assert check_command(["lerobot", "train", "--policy.type=lerobot_act", "--policy.n_vae_encoder_layers=4",
                          "--policy.optimizer_lr_backbone=1e-5"]) == []
    assert check_command(["lerobot", "train", "--policy.type=lerobot_act", "--policy.kl_weigth=1"]) != []
    assert check_command(["torchrun", "--nproc-per-node=2", "lerobot", "train", "--parallelism.dp_shard=2"]) == []
    assert check_command(["torchrun", "--nproc-per-nod=2", "lerobot", "train"]) != []
    assert check_command(["torchrun", "-m", "lerobot_kit.cli", "train", "--stpes=3"]) != []
    assert check_command(["python", "-m", "lerobot_kit.cli", "trian"]) != []
    assert check_command(["lerobot", "plan", "--world_size=8", "--json", "--batch_size=4"]) == []
    assert check_command(["lerobot", "inspect-checkpoint", "path", "--no-verify", "--verify-max-bytes=9"]) == []
    assert check_command(["lerobot", "convert-dcp", "--checkpoint_dir=x", "--delete_dcp=true", "--verify"]) != []
    assert check_command(["python", "benchmarks/run.py", "--only", "startup", "--jsn", "x.json"]) != []
    assert check_command(["lerobot", "train", "--dataset.image_transforms.tfs.brightness.kwargs={}"]) == []
    assert list(shell_commands("A=1 lerobot train --steps=3 && lerobot eval --x=1 # --no\n")) == [
        ["A=1", "lerobot", "train", "--steps=3"], ["lerobot", "eval", "--x=1"]]
    assert expand("--a.{b,c}") == ["--a.b", "--a.c"]
    assert list(itertools.islice(quoted_defaults("docs/evaluation.md"), 1))  # the page quotes defaults


def test_every_lerobot_flag_refused_by_name_is_in_the_docs_table() -> None:
    text = (REPO / "docs" / "configuration.md").read_text()
    table = text.split("## Coming from `lerobot-train`", 1)[1].split("\n## ", 1)[0]
    assert [key for key in INSTEAD if f"`--{key}" not in table] == []
