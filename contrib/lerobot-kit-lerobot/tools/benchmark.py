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
built at those sizes by ``pi_sizes`` around its ``lerobot-train``).

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
* time to first step: from launch to the first step's line.

``--json FILE`` also writes the figures with the date, machine and versions (the bridge
README's tables are rendered from such files in ``benchmarks/results/`` by the
repository's ``benchmarks/render_docs.py``).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import re
import shutil
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
from _common import peak_bf16_flops, result_header  # noqa: E402
from render_docs import comparison_table  # noqa: E402
from toy_dataset import make_dataset  # noqa: E402 - tools/ is not a package
from vla_assets import (  # noqa: E402
    PI_SIZES, REDUCED_PI, REDUCED_SMOLVLA, write_shipped_smolvlm, write_smolvlm, write_tokenizer,
)

REPO_ID = "bench/reach"
THEIRS, OURS = "lerobot-train", "lerobot train"
PALIGEMMA = "google/paligemma-3b-pt-224"  # the tokenizer LeRobot's π0.5 processor names in its code
STEP_LINE = {THEIRS: re.compile(r"step:(\d+)\S* .*data_s:([\d.]+)"),
             OURS: re.compile(r"step (\d+)/\d+ .*data_s ([\d.]+)")}


@dataclass
class Measured:
    name: str
    start: float
    steps: list[tuple[float, int, float]] = field(default_factory=list)  # (arrival, step, data_s)
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
        if size == "reduced":
            return REDUCED_PI, [*ours, f"--policy.sizes={PI_SIZES}"]
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


def run(name: str, args: list[str], workdir: Path, extra_env: dict[str, str], pi_sizes: str | None) -> Measured:
    """``name`` (a tool) with ``args`` in a child of this script, which records the GPU's peak."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_LEROBOT_HOME": str(workdir / "hf"), "PYTHONUNBUFFERED": "1",
           **extra_env}
    peak_file = workdir / f"{name.replace(' ', '_')}.gpu.json"
    peak_file.unlink(missing_ok=True)
    child_args = [sys.executable, __file__, "_tool", name, str(peak_file), pi_sizes or "", *args]
    measured = Measured(name, time.perf_counter())
    child = subprocess.Popen(child_args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=workdir,
                             env=env)
    done = threading.Event()
    watcher = threading.Thread(target=watch_memory, args=(psutil.Process(child.pid), measured, done), daemon=True)
    watcher.start()
    assert child.stdout is not None
    for line in child.stdout:
        measured.output.append(line)
        match = STEP_LINE[name].search(line)
        if match:
            measured.steps.append((time.perf_counter(), int(match.group(1)), float(match.group(2))))
    child.wait()
    done.set()
    watcher.join()
    (workdir / f"{name.replace(' ', '_')}.log").write_text("".join(measured.output))
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
    """``lerobot plan --json`` of lerobot-kit's run, started now, read by ``flops_of``
    (without ``--output_dir``, which a plan checks as the run would: it exists once the run did)."""
    kept = [flag for flag in flags if not flag.startswith("--output_dir=")]
    # the venv's console script, else PATH's (packages installed with pip --target have theirs there)
    lerobot = shutil.which("lerobot", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    if lerobot is None:
        sys.exit("no `lerobot` console script beside this python or on PATH: install lerobot-kit")
    command = [lerobot, "plan", "--world_size=1", *kept, "--json"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}  # a trace on the CPU
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=workdir, env=env)


def flops_of(plan: subprocess.Popen[str]) -> int | None:
    """The plan's step FLOPs; None (said on stderr) when it has none: the figures go without MFU."""
    out, err = plan.communicate()
    if plan.returncode != 0:
        print(f"lerobot plan failed (exit {plan.returncode}), no MFU: {(out + err).strip()[-2000:]}", file=sys.stderr)
        return None
    flops = json.loads(out)["activations"]["step_flops"]
    if not flops:
        print("lerobot plan could not trace the step: no MFU", file=sys.stderr)
    return flops


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
    data_s = sum(d for _, _, d in timed[1:]) / (len(timed) - 1)
    figures: dict[str, Any] = {
        "samples_per_s": batch_size / per_step,
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


def main() -> None:
    if sys.argv[1:2] == ["_tool"]:
        tool_in_this_process(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", choices=["act", "smolvla", "pi05"], default="act")
    parser.add_argument("--size", choices=["full", "reduced"], default="full",
                        help="full: LeRobot's default sizes; reduced: the bridge tests' (π0.5 and SmolVLA only).")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="LeRobot's --policy.device; lerobot-kit trains on the GPU when it sees one, so "
                             "with cpu no run sees any.")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/lerobot-kit-bridge-benchmark"))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--num_workers", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=5, help="First steps left out of samples/s.")
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--episode_length", type=int, default=60)
    parser.add_argument("--image", default="96x128", help="Camera height x width.")
    parser.add_argument("--json", type=Path, help="Also write the figures, date, machine and versions to this file.")
    parser.add_argument("--prepare_only", action="store_true",
                        help="Write the dataset and the policy's stand-in files into --workdir, train nothing.")
    args = parser.parse_args()
    if args.size == "reduced" and args.policy == "act":
        parser.error("--size=reduced is for --policy=smolvla and --policy=pi05; ACT runs at LeRobot's sizes anywhere")
    if args.device == "cuda" and not args.prepare_only:
        import torch

        if not torch.cuda.is_available():
            parser.error("--device=cuda, but torch sees no CUDA GPU here; use --device=cpu")

    args.workdir.mkdir(parents=True, exist_ok=True)
    root = args.workdir / f"data-{args.image}"
    if not (root / "meta" / "info.json").is_file():
        height, width = (int(v) for v in args.image.split("x"))
        shutil.rmtree(root, ignore_errors=True)
        make_dataset(root, REPO_ID, episodes=args.episodes, length=args.episode_length, image_hw=(height, width))
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
            *ours_only, *ours_precision]
    for out in ("lerobot_train", "lerobot_kit"):
        shutil.rmtree(args.workdir / out, ignore_errors=True)

    on_gpu = args.device == "cuda"
    plan = start_plan(ours, args.workdir) if on_gpu else None  # traced while the GPU trains
    pi_sizes_json = PI_SIZES if args.policy == "pi05" and args.size == "reduced" else None
    hidden = {} if on_gpu else {"CUDA_VISIBLE_DEVICES": ""}  # lerobot-kit would take a GPU it sees
    measured = [run(THEIRS, theirs, args.workdir, {**theirs_env, **hidden}, pi_sizes_json),
                run(OURS, ours, args.workdir, hidden, None)]
    flops = flops_of(plan or start_plan(ours, args.workdir))
    header = result_header("contrib/lerobot-kit-lerobot/tools/benchmark.py", sys.argv[1:])
    peak_flops = peak_bf16_flops(header["machine"]["gpu"]) if on_gpu else None
    results = {m.name: summary(m, args.batch_size, args.warmup, flops, peak_flops) for m in measured}
    per_sample = f"{flops / args.batch_size / 1e9:.1f} GFLOP per sample (forward and backward)" if flops else "no FLOPs"
    print(f"{args.policy} ({args.size} size, {args.precision}), {args.steps} steps of batch {args.batch_size}, "
          f"{args.num_workers} data worker(s), image {args.image}; {per_sample}")
    failed = {name: figures for name, figures in results.items() if "error" in figures}
    for name, figures in failed.items():
        print(f"{name} failed: {figures['error']}\n{figures.get('log_tail', '')}", file=sys.stderr)
    if not failed:
        print(comparison_table(results[THEIRS], results[OURS]))
    if args.json is not None:
        settings = {k: v for k, v in vars(args).items() if k not in ("workdir", "json")}
        args.json.write_text(json.dumps({
            **header,
            "comparison": {"settings": {**settings, "step_flops": flops, "gpu_peak_bf16_flops": peak_flops,
                                        "lerobot_train_args": theirs, "lerobot_kit_args": ours,
                                        "lerobot_train_env": theirs_env},
                           THEIRS: results[THEIRS], OURS: results[OURS]},
        }, indent=1) + "\n")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
