"""LeRobot's policies trained side by side: by LeRobot's own ``lerobot-train`` and by
lerobot-kit's ``lerobot train --policy.type=lerobot_<type>``, on the same LeRobot v3.0 video
dataset (with task texts), with the same config, precision, batch, data workers and steps,
one process each, one after the other.

Run it in the bridge's venv (the one ``ci.sh`` builds):

    python tools/benchmark.py --steps=30 --batch_size=8                       # ACT, on this machine
    python tools/benchmark.py --policy=pi05 --precision=bf16 --steps=40 --warmup=10 --num_workers=4

Policies are built at LeRobot's default sizes from random weights, with nothing from the
hub. ACT's backbone starts from random weights. π0.5's prompt is tokenized by a stand-in
for PaliGemma's tokenizer (``vla_assets.write_tokenizer``), written where LeRobot's
processor looks for ``google/paligemma-3b-pt-224`` (that relative folder in the working
directory, which transformers reads before asking the hub) and handed to lerobot-kit by
``--policy.tokenizer_name``. SmolVLA's VLM is the architecture the bridge ships for
SmolVLM2-500M-Video-Instruct, written to a folder with a stand-in processor and given to
both by ``--policy.vlm_model_name``. The prompt is padded to ``tokenizer_max_length``
either way, so a step computes what it would with the real files. ``--size=reduced``
trains the bridge tests' sizes instead, to try the script on a CPU (LeRobot's π0.5 is then
built at those sizes by ``pi_sizes`` around its ``lerobot-train``); ``--size=narrow``
(π0.5) LeRobot's sequence lengths with narrower towers, for the attention comparison on a
CPU (``NARROW_PI_SIZES``; with ``--cameras=3 --image=224x224``: 768 image tokens, the
200-token prompt, 50 actions).

The bridge's joint layers attend through a fused kernel (``--policy.attention=sdpa``, its
default); ``--attention=eager`` gives lerobot-kit LeRobot's own attention code instead.
LeRobot's ``lerobot-train`` runs its own (eager) code either way.

``--precision=bf16``: π0.5 has LeRobot's ``dtype`` field, set to ``bfloat16`` for both
(LeRobot stores the towers in bf16 and turns on bf16 autocast; lerobot-kit gets the same
field and ``--accelerator.mixed_precision=bf16``). SmolVLA and ACT have no such field:
LeRobot's Accelerate then takes its autocast from ``ACCELERATE_MIXED_PRECISION=bf16``, as
``accelerate launch --mixed_precision=bf16`` sets it, and lerobot-kit from
``--accelerator.mixed_precision=bf16``: fp32 weights and bf16 compute in both.

Both tools are timed from the outside, the same way: each runs in a child process of this
script whose output lines are stamped as they arrive (``--log_freq=1``: one line per
step), and whose process tree (workers included) is sampled for memory. Reported per tool:

* samples/s: steps after the first ``warmup`` ones x batch / the time they took, from the
  line stamps (so start-up and the first steps' allocations are excluded);
* CPU seconds per sample of the training process (its user and system time over the same
  steps, data workers apart): on a machine other jobs share, less disturbed by them than
  the elapsed time;
* data-wait share: the tool's own per-step data time (``data_s``, which LeRobot's
  includes its preprocessor in) over the measured time per step;
* peak RSS of the training process, and peak PSS of its whole tree (PSS splits pages
  shared with forked workers, so they are not counted twice);
* on a GPU, the peak of ``torch.cuda.max_memory_allocated``, read in the child as the tool
  exits;
* MFU on a GPU: the FLOPs of one step, counted by ``lerobot plan --json`` for
  lerobot-kit's flags (the same LeRobot model on the same batch shapes: forward and
  backward, traced on the CPU while the runs take the GPU), times steps per second,
  over the GPU's dense bf16 peak;
* time to first step: from launch to the first step's line;
* with ``--activations`` (the VLAs): the activation memory of one training step, planned
  and measured, and the CPU time of the model's forward and backward alone. Planned:
  ``lerobot plan``'s traced peak for lerobot-kit's flags, with ``--policy.attention=eager``
  (LeRobot's attention code) for the LeRobot column. Measured: in a fresh process each,
  LeRobot's policy as LeRobot runs it, and the same policy with the bridge's joint layers
  (what ``lerobot_<type>`` runs; the JSON has both attentions), on a batch of the run's
  shapes; the process's resident high-water mark over one forward and backward (after a
  first one, so gradients and lazily built state exist), above its resident bytes before it
  (glibc maps every block over 128 KiB on its own, so a freed tensor leaves the resident
  set at once); the CPU time is the median of that step and two more.

``--repeats=N`` runs the two tools N times each, alternating (theirs, ours, ours, theirs,
...), so a drift of the machine's load hits both alike; the figures are each tool's
medians, every run's figures kept in the JSON beside them, and the samples/s ratio also as
the median of the per-pair ratios.

``--json FILE`` also writes the figures with the date, machine and versions (the bridge
README's tables are rendered from such files in ``benchmarks/results/`` by the
repository's ``benchmarks/render_docs.py``), and beside it ``FILE`` with ``.log`` for
``.json``: this script's output and every run's own output, as they came.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import gc
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "benchmarks"))  # the repository's result files and their tables
from _common import paired, peak_bf16_flops, result_header, rss_now, rss_peak  # noqa: E402
from render_docs import comparison_table  # noqa: E402
from toy_dataset import ACTION_DIM, STATE_DIM, make_dataset  # noqa: E402 - tools/ is not a package
from vla_assets import (  # noqa: E402
    PI_SIZES, REDUCED_PI, REDUCED_SMOLVLA, write_shipped_smolvlm, write_smolvlm, write_tokenizer,
)

REPO_ID = "bench/reach"
THEIRS, OURS = "lerobot-train", "lerobot train"
PALIGEMMA = "google/paligemma-3b-pt-224"  # the tokenizer LeRobot's π0.5 processor names in its code
STEP_LINE = {THEIRS: re.compile(r"step:(\d+)\S* .*data_s:([\d.]+)"),
             OURS: re.compile(r"step (\d+)/\d+ .*data_s ([\d.]+)")}
CAMERAS = ("top", "left", "right", "wrist")
# π0.5 at LeRobot's sequence lengths (its 224x224 images in 14-pixel patches, 256 tokens a
# camera, as SigLIP so400m cuts them; its 200-token prompt and 50-step chunks; its 8 query
# heads on one key/value head) with towers narrower than LeRobot's (2048/1024 wide, 18
# deep, head size 256): a step a CPU trains in seconds, its attention a larger share of
# the step than at full size.
NARROW_PI_SIZES = (
    '{"vocab_size": 320, '
    '"gemma_2b": {"width": 256, "depth": 6, "mlp_dim": 1024, "num_heads": 8, "num_kv_heads": 1, "head_dim": 32}, '
    '"gemma_300m": {"width": 128, "depth": 6, "mlp_dim": 512, "num_heads": 8, "num_kv_heads": 1, "head_dim": 32}, '
    '"vision": {"hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 2, '
    '"patch_size": 14}}'
)
PI_SIZES_OF = {"reduced": PI_SIZES, "narrow": NARROW_PI_SIZES}
# glibc: every block over 128 KiB mapped on its own and unmapped when freed, so the resident
# set follows the live tensors (a fixed threshold; glibc's default one grows to 32 MiB).
EXACT_RSS = {"MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}


@dataclass
class Measured:
    name: str
    start: float
    # (arrival, step, data_s, CPU seconds the training process had used by then)
    steps: list[tuple[float, int, float, float]] = field(default_factory=list)
    peak_rss: int = 0
    peak_pss: int = 0
    peak_gpu: int | None = None
    returncode: int = 0
    output: list[str] = field(default_factory=list)


def policy_flags(policy: str, size: str, workdir: Path) -> tuple[list[str], list[str]]:
    """(LeRobot config fields both tools take, lerobot-kit's own extra flags: LeRobot's
    preset learning rate and weight decay) for the policy at that size; writes the stand-in
    files it needs."""
    assets = workdir / "assets"
    if policy == "act":  # LeRobot's defaults, the backbone from random weights
        return ["--policy.pretrained_backbone_weights=null"], ["--optimizer.lr=1e-5", "--optimizer.weight_decay=1e-4"]
    if policy == "pi05":
        tokenizer = workdir / PALIGEMMA  # found by LeRobot's processor through the working directory
        if not (tokenizer / "tokenizer.json").is_file():
            write_tokenizer(tokenizer)
        ours = [f"--policy.tokenizer_name={tokenizer}", "--optimizer.lr=2.5e-5", "--optimizer.weight_decay=0.01"]
        if size in PI_SIZES_OF:
            return REDUCED_PI if size == "reduced" else [], [*ours, f"--policy.sizes={PI_SIZES_OF[size]}"]
        return [], ours
    vlm = assets / f"smolvlm-{size}"
    if not (vlm / "config.json").is_file():
        (write_smolvlm if size == "reduced" else write_shipped_smolvlm)(vlm)
    shared = [f"--policy.vlm_model_name={vlm}", *(REDUCED_SMOLVLA if size == "reduced" else [])]
    return shared, ["--optimizer.lr=1e-4", "--optimizer.weight_decay=1e-10"]


def precision_settings(policy: str, precision: str) -> tuple[list[str], list[str], dict[str, str]]:
    """(lerobot-kit's flags, LeRobot's flags, LeRobot's environment) for the precision."""
    if precision == "fp32":
        return [], [], {}
    if policy == "pi05":
        return ["--policy.dtype=bfloat16", "--accelerator.mixed_precision=bf16"], ["--policy.dtype=bfloat16"], {}
    return ["--accelerator.mixed_precision=bf16"], [], {"ACCELERATE_MIXED_PRECISION": "bf16"}


def watch_memory(process: psutil.Process, measured: Measured, done: threading.Event) -> None:
    while not done.is_set():
        try:
            tree = [process, *process.children(recursive=True)]
            measured.peak_rss = max(measured.peak_rss, process.memory_info().rss)
            measured.peak_pss = max(measured.peak_pss, sum(p.memory_full_info().pss for p in tree))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
        done.wait(0.5)


def run(name: str, args: list[str], workdir: Path, extra_env: dict[str, str], pi_sizes: str | None,
        log_name: str) -> Measured:
    """``name`` (a tool) with ``args`` in a child of this script, which records the GPU's peak;
    its output is kept as ``log_name`` in ``workdir``."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_LEROBOT_HOME": str(workdir / "hf"), "PYTHONUNBUFFERED": "1",
           **extra_env}
    peak_file = workdir / f"{name.replace(' ', '_')}.gpu.json"
    peak_file.unlink(missing_ok=True)
    child_args = [sys.executable, __file__, "_tool", name, str(peak_file), pi_sizes or "", *args]
    measured = Measured(name, time.perf_counter())
    child = subprocess.Popen(child_args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=workdir,
                             env=env)
    process = psutil.Process(child.pid)
    done = threading.Event()
    watcher = threading.Thread(target=watch_memory, args=(process, measured, done), daemon=True)
    watcher.start()
    assert child.stdout is not None
    for line in child.stdout:
        measured.output.append(line)
        match = STEP_LINE[name].search(line)
        if match:
            arrival = time.perf_counter()
            with contextlib.suppress(psutil.NoSuchProcess):
                cpu = process.cpu_times()
                measured.steps.append((arrival, int(match.group(1)), float(match.group(2)), cpu.user + cpu.system))
    child.wait()
    done.set()
    watcher.join()
    (workdir / log_name).write_text("".join(measured.output))
    measured.returncode = child.returncode
    if peak_file.is_file():
        measured.peak_gpu = json.loads(peak_file.read_text())["allocated"]
    return measured


def tool_in_this_process(name: str, peak_file: str, pi_sizes_json: str, args: list[str]) -> None:
    """The child: the installed console script of ``lerobot-train`` or ``lerobot`` (``train``),
    called in this process, the GPU's peak recorded at exit."""
    from importlib.metadata import entry_points

    import torch

    def record() -> None:
        if torch.cuda.is_available():
            Path(peak_file).write_text(json.dumps({"allocated": torch.cuda.max_memory_allocated()}))

    atexit.register(record)
    script, argv = ("lerobot", ["train", *args]) if name == OURS else ("lerobot-train", args)
    (entry,) = entry_points(group="console_scripts", name=script)
    sized: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if pi_sizes_json:  # --size=reduced: LeRobot's π0.5 built by its own classes at the bridge tests' sizes
        from lerobot_kit_lerobot.bridge_fields import PiSizes
        from lerobot_kit_lerobot.pi_overrides import pi_sizes

        sized = pi_sizes("pi05", PiSizes.model_validate_json(pi_sizes_json))
    sys.argv = [script, *argv]
    with sized:
        entry.load()()


def start_plan(flags: list[str], workdir: Path) -> subprocess.Popen[str]:
    """``lerobot plan --json`` of lerobot-kit's run, started now, read by ``planned_activations``
    (without ``--output_dir``, which a plan checks as the run would: it exists once the run did)."""
    kept = [flag for flag in flags if not flag.startswith("--output_dir=")]
    # the venv's console script, else PATH's (packages installed with pip --target have theirs there)
    lerobot = shutil.which("lerobot", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    if lerobot is None:
        sys.exit("no `lerobot` console script beside this python or on PATH: install lerobot-kit")
    command = [lerobot, "plan", "--world_size=1", *kept, "--json"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}  # a trace on the CPU
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=workdir, env=env)


def planned_activations(plan: subprocess.Popen[str]) -> dict[str, Any]:
    """The plan's ``activations`` entry (traced peak bytes and step FLOPs); ``{}`` (said on
    stderr) when the plan failed: the figures go without MFU and planned memory."""
    out, err = plan.communicate()
    if plan.returncode != 0:
        print(f"lerobot plan failed (exit {plan.returncode}): {(out + err).strip()[-2000:]}", file=sys.stderr)
        return {}
    activations = json.loads(out)["activations"]
    if not activations.get("step_flops"):
        print("lerobot plan could not trace the step: no MFU", file=sys.stderr)
    return activations


def with_attention(flags: list[str], attention: str) -> list[str]:
    """lerobot-kit's flags with ``--policy.attention`` set to ``attention``."""
    return [*(flag for flag in flags if not flag.startswith("--policy.attention=")), f"--policy.attention={attention}"]


def lerobot_fields(flags: list[str]) -> dict[str, Any]:
    """LeRobot config fields from ``--policy.<field>=<value>`` flags (values as JSON where they parse)."""
    fields = {}
    for flag in flags:
        name, value = flag.removeprefix("--policy.").split("=", 1)
        try:
            fields[name] = json.loads(value)
        except json.JSONDecodeError:
            fields[name] = value
    return fields


def measure_activations(spec: dict[str, Any], workdir: Path) -> dict[str, float] | None:
    """Activation bytes and CPU seconds of one training step (``step_activations_in_this_process``),
    in a fresh process; None (said on stderr) when it failed."""
    env = {**os.environ, **EXACT_RSS, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    child = subprocess.run([sys.executable, __file__, "_activations", json.dumps(spec)], capture_output=True,
                           text=True, cwd=workdir, env=env)
    if child.returncode != 0:
        print(f"measuring activations ({spec['attention']}) failed (exit {child.returncode}): "
              f"{(child.stdout + child.stderr).strip()[-2000:]}", file=sys.stderr)
        return None
    return json.loads(child.stdout.strip().splitlines()[-1])


def step_activations_in_this_process(spec: dict[str, Any]) -> None:
    """The child of ``measure_activations``: LeRobot's policy built by its own constructor
    (at ``spec["pi_sizes"]`` for π0.5's reduced sizes), as LeRobot runs it
    (``attention="lerobot"``: its ``forward``) or with the bridge's joint layers
    (``sdpa``/``eager``: the loss ``lerobot_<type>`` trains on); one step on a batch of the
    run's shapes, then the measured one, then two more: prints the measured step's activation
    bytes and the median CPU seconds of the three (forward and backward, no optimizer) as JSON."""
    import torch
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.factory import get_policy_class, make_policy_config

    from lerobot_kit_lerobot import joint
    from lerobot_kit_lerobot.bridge_fields import PiSizes
    from lerobot_kit_lerobot.modeling import freeze_unreached
    from lerobot_kit_lerobot.pi_overrides import modeling_module, pi_sizes
    from lerobot_kit_lerobot.vla_loss import flow_matching_loss

    kind, attention = spec["policy"], spec["attention"]
    fields = {name: tuple(v) if isinstance(v, list) else v for name, v in spec["fields"].items()}
    config = make_policy_config(kind, device="cpu", **fields)
    height, width = spec["image_hw"]
    cameras = [f"observation.images.{camera}" for camera in spec["cameras"]]
    config.input_features = {**{camera: PolicyFeature(FeatureType.VISUAL, (3, height, width)) for camera in cameras},
                             "observation.state": PolicyFeature(FeatureType.STATE, (STATE_DIM,))}
    config.output_features = {"action": PolicyFeature(FeatureType.ACTION, (ACTION_DIM,))}
    torch.manual_seed(0)
    sizes = PiSizes.model_validate_json(spec["pi_sizes"]) if spec["pi_sizes"] else None
    with pi_sizes(kind, sizes) if kind != "smolvla" else contextlib.nullcontext():
        policy = get_policy_class(kind)(config=config).train()
    if attention == "lerobot":
        def loss(batch: dict[str, Any]) -> Any:
            return policy.forward(batch)[0]
    else:
        if kind == "smolvla":
            joint.install_smolvla(policy.model.vlm_with_expert, attention=attention)
        else:
            joint.install_pi(policy.model.paligemma_with_expert, modeling_module(kind), attention=attention)
            freeze_unreached(policy.model.paligemma_with_expert)

        def loss(batch: dict[str, Any]) -> Any:
            return flow_matching_loss(policy, batch)[0]
    size, chunk, tokens = spec["batch_size"], config.chunk_size, config.tokenizer_max_length
    batch = {**{camera: torch.rand(size, 3, height, width) for camera in cameras},
             "observation.state": torch.randn(size, STATE_DIM), "action": torch.randn(size, chunk, ACTION_DIM),
             "action_is_pad": torch.zeros(size, chunk, dtype=torch.bool),
             "observation.language.tokens": torch.randint(0, 320, (size, tokens)),
             "observation.language.attention_mask": torch.arange(tokens).expand(size, tokens) < 24}

    def step() -> None:
        with torch.autocast("cpu", torch.bfloat16, enabled=spec["bf16"]):
            value = loss(batch)
        value.backward()

    def cpu_seconds() -> float:
        start = time.process_time()
        step()
        return time.process_time() - start

    step()
    policy.zero_grad(set_to_none=False)  # gradients stay allocated: the measured step adds activations only
    gc.collect()
    before = rss_now()
    Path("/proc/self/clear_refs").write_text("5")  # resets the resident high-water mark
    seconds = [cpu_seconds()]
    activation = rss_peak() - before
    seconds += [cpu_seconds(), cpu_seconds()]
    print(json.dumps({"activation_bytes": activation, "step_cpu_s": statistics.median(seconds)}))


def summary(measured: Measured, batch_size: int, warmup: int, flops: int | None,
            peak_flops: float | None) -> dict[str, Any]:
    """The figures of a run, or its ``error`` (and the end of its output) when it failed."""
    if measured.returncode != 0:
        return {"error": f"exit {measured.returncode}", "log_tail": "".join(measured.output[-30:])}
    if len(measured.steps) <= warmup + 1:
        return {"error": f"only {len(measured.steps)} step lines; raise --steps"}
    timed = measured.steps[warmup:]
    seconds = timed[-1][0] - timed[0][0]
    per_step = seconds / (len(timed) - 1)
    data_s = sum(step[2] for step in timed[1:]) / (len(timed) - 1)
    figures: dict[str, Any] = {
        "samples_per_s": batch_size / per_step,
        "cpu_s_per_sample": (timed[-1][3] - timed[0][3]) / (len(timed) - 1) / batch_size,
        "data_wait_share": data_s / per_step,
        "peak_rss_gib": measured.peak_rss / 2**30,
        "peak_pss_gib": measured.peak_pss / 2**30,
        "first_step_s": measured.steps[0][0] - measured.start,
    }
    if measured.peak_gpu is not None:
        figures["peak_gpu_gib"] = measured.peak_gpu / 2**30
    if flops and peak_flops and measured.peak_gpu is not None:
        figures["mfu"] = flops / per_step / peak_flops
    return figures


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over the runs (the figures all runs have)."""
    keys = set.intersection(*(set(figures) for figures in runs))
    return {key: statistics.median(figures[key] for figures in runs) for key in sorted(keys)}


def main() -> None:
    if sys.argv[1:2] == ["_tool"]:
        tool_in_this_process(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:])
        return
    if sys.argv[1:2] == ["_activations"]:
        step_activations_in_this_process(json.loads(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", choices=["act", "smolvla", "pi05"], default="act")
    parser.add_argument("--size", choices=["full", "reduced", "narrow"], default="full",
                        help="full: LeRobot's default sizes; reduced: the bridge tests' (π0.5 and SmolVLA only); "
                             "narrow: LeRobot's sequence lengths, narrower towers (π0.5 only).")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="LeRobot's --policy.device; lerobot-kit trains on the GPU when it sees one, so "
                             "with cpu no run sees any.")
    parser.add_argument("--attention", choices=["sdpa", "eager"],
                        help="lerobot-kit's --policy.attention (the VLAs; unset: its default, sdpa).")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/lerobot-kit-bridge-benchmark"))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--num_workers", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=5, help="First steps left out of samples/s.")
    parser.add_argument("--repeats", type=int, default=1, help="Runs of each tool, alternating; medians reported.")
    parser.add_argument("--activations", action="store_true",
                        help="Also plan and measure one step's activation memory (the VLAs).")
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--episode_length", type=int, default=60)
    parser.add_argument("--image", default="96x128", help="Camera height x width.")
    parser.add_argument("--cameras", type=int, default=1, choices=range(1, len(CAMERAS) + 1),
                        help=f"Cameras in the dataset ({', '.join(CAMERAS)}, in that order).")
    parser.add_argument("--json", type=Path, help="Also write the figures, date, machine and versions to this file.")
    parser.add_argument("--prepare_only", action="store_true",
                        help="Write the dataset and the policy's stand-in files into --workdir, train nothing.")
    args = parser.parse_args()
    if args.size == "reduced" and args.policy == "act":
        parser.error("--size=reduced is for --policy=smolvla and --policy=pi05; ACT runs at LeRobot's sizes anywhere")
    if args.size == "narrow" and args.policy != "pi05":
        parser.error("--size=narrow is for --policy=pi05")
    if args.policy == "act" and (args.attention or args.activations):
        parser.error("--attention and --activations are for the VLAs (--policy=pi05 or smolvla)")
    if args.device == "cuda" and not args.prepare_only:
        import torch

        if not torch.cuda.is_available():
            parser.error("--device=cuda, but torch sees no CUDA GPU here; use --device=cpu")

    args.workdir.mkdir(parents=True, exist_ok=True)
    cameras = CAMERAS[:args.cameras]
    root = args.workdir / (f"data-{args.image}" + (f"-{args.cameras}cams" if args.cameras > 1 else ""))
    height, width = (int(v) for v in args.image.split("x"))
    if not (root / "meta" / "info.json").is_file():
        shutil.rmtree(root, ignore_errors=True)
        make_dataset(root, REPO_ID, episodes=args.episodes, length=args.episode_length, image_hw=(height, width),
                     cameras=cameras)
    shared, ours_only = policy_flags(args.policy, args.size, args.workdir)
    if args.prepare_only:
        return
    ours_precision, theirs_precision, theirs_env = precision_settings(args.policy, args.precision)
    common = [f"--dataset.repo_id={REPO_ID}", f"--dataset.root={root}", f"--batch_size={args.batch_size}",
              f"--steps={args.steps}", f"--num_workers={args.num_workers}", "--log_freq=1", "--seed=1000",
              "--save_checkpoint=false", *shared]
    theirs = [*common, f"--policy.type={args.policy}", f"--policy.device={args.device}", "--policy.push_to_hub=false",
              "--dataset.video_backend=pyav", "--wandb.enable=false", f"--output_dir={args.workdir / 'lerobot_train'}",
              *theirs_precision]
    ours = [*common, f"--policy.type=lerobot_{args.policy}", f"--output_dir={args.workdir / 'lerobot_kit'}",
            *ours_only, *ours_precision, *([f"--policy.attention={args.attention}"] if args.attention else [])]

    on_gpu = args.device == "cuda"
    plan = start_plan(ours, args.workdir) if on_gpu else None  # traced while the GPU trains
    pi_sizes_json = PI_SIZES_OF.get(args.size) if args.policy == "pi05" else None
    hidden = {} if on_gpu else {"CUDA_VISIBLE_DEVICES": ""}  # lerobot-kit would take a GPU it sees
    tools = {THEIRS: (theirs, {**theirs_env, **hidden}, pi_sizes_json), OURS: (ours, hidden, None)}
    measured: dict[str, list[Measured]] = {THEIRS: [], OURS: []}
    for repeat in range(args.repeats):  # theirs, ours, ours, theirs, ...: a drift of the load hits both
        for name in (THEIRS, OURS) if repeat % 2 == 0 else (OURS, THEIRS):
            flags, env, sizes = tools[name]
            shutil.rmtree(args.workdir / ("lerobot_train" if name == THEIRS else "lerobot_kit"), ignore_errors=True)
            log_name = f"{name.replace(' ', '_')}{f'-{repeat + 1}' if args.repeats > 1 else ''}.log"
            measured[name].append(run(name, flags, args.workdir, env, sizes, log_name))
            print(f"{name} run {repeat + 1}: {len(measured[name][-1].steps)} step lines, exit "
                  f"{measured[name][-1].returncode}", flush=True)
    planned = planned_activations(plan or start_plan(ours, args.workdir))
    flops = planned.get("step_flops")
    header = result_header("contrib/lerobot-kit-lerobot/tools/benchmark.py", sys.argv[1:])
    peak_flops = peak_bf16_flops(header["machine"]["gpu"]) if on_gpu else None
    runs = {name: [summary(m, args.batch_size, args.warmup, flops, peak_flops) for m in tool_runs]
            for name, tool_runs in measured.items()}
    failed = {f"{name} run {i + 1}": figures for name, tool_runs in runs.items()
              for i, figures in enumerate(tool_runs) if "error" in figures}
    results = {name: medians(tool_runs) for name, tool_runs in runs.items()} if not failed else {}
    activations: dict[str, Any] | None = None
    if results and args.activations:
        eager_plan = planned_activations(start_plan(with_attention(ours, "eager"), args.workdir))
        for name, plan_of in ((THEIRS, eager_plan), (OURS, planned)):
            if plan_of.get("peak_bytes"):
                results[name]["plan_activation_gib"] = plan_of["peak_bytes"] / 2**30
        spec = {"policy": args.policy, "fields": lerobot_fields(shared), "pi_sizes": pi_sizes_json,
                "image_hw": [height, width], "cameras": list(cameras), "batch_size": args.batch_size,
                "bf16": args.precision == "bf16"}
        steps = {attention: measure_activations({**spec, "attention": attention}, args.workdir)
                 for attention in ("lerobot", "eager", "sdpa")}
        for name, attention in ((THEIRS, "lerobot"), (OURS, args.attention or "sdpa")):
            if steps[attention] is not None:
                results[name]["activation_gib"] = steps[attention]["activation_bytes"] / 2**30
                results[name]["step_cpu_s"] = steps[attention]["step_cpu_s"]
        activations = {"planned_bytes": {"eager": eager_plan.get("peak_bytes"), "sdpa": planned.get("peak_bytes")},
                       "measured": steps}
    per_sample = f"{flops / args.batch_size / 1e9:.1f} GFLOP per sample (forward and backward)" if flops else "no FLOPs"
    report = [f"{args.policy} ({args.size} size, {args.precision}), {args.steps} steps of batch {args.batch_size}, "
              f"{args.num_workers} data worker(s), {args.cameras} camera(s) {args.image}, {args.repeats} run(s) "
              f"each; {per_sample}"]
    for name, figures in failed.items():
        print(f"{name} failed: {figures['error']}\n{figures.get('log_tail', '')}", file=sys.stderr)
    speed = None
    if results:
        speed = paired([r["samples_per_s"] for r in runs[OURS]], [r["samples_per_s"] for r in runs[THEIRS]])
        for name, tool_runs in runs.items():
            each = ", ".join(f"{figures['samples_per_s']:.3f}" for figures in tool_runs)
            report.append(f"samples/s, each run: {name}: {each}")
        report.append(f"samples/s ratio, median of {speed['pairs']} pair(s): {speed['ratio']:.2f}x "
                      f"({speed['ratio_min']:.2f}x-{speed['ratio_max']:.2f}x)")
        report.append(comparison_table(results[THEIRS], results[OURS]))
    print("\n".join(report))
    if args.json is not None:
        settings = {k: v for k, v in vars(args).items() if k not in ("workdir", "json")}
        args.json.write_text(json.dumps({
            **header,
            "comparison": {"settings": {**settings, "step_flops": flops, "gpu_peak_bf16_flops": peak_flops,
                                        "lerobot_train_args": theirs, "lerobot_kit_args": ours,
                                        "lerobot_train_env": theirs_env},
                           **({THEIRS: results[THEIRS], OURS: results[OURS]} if results else {}),
                           "samples_per_s_pairs": speed, "runs": runs, "activations": activations},
        }, indent=1) + "\n")
        outputs = [f"===== {m.name} run {i + 1} =====\n{''.join(m.output)}" for name in measured
                   for i, m in enumerate(measured[name])]
        args.json.with_suffix(".log").write_text("\n".join([*report, *outputs]) + "\n")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
