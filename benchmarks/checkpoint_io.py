"""4. Checkpoints: save and resume time of each format on one FSDP(2) model, and sizes.

Two real rank processes assemble an FSDP(2) run of a >=100 M-parameter ACT exactly as
``lerobot train`` does (``core.run.prepare_run``), take one optimizer step so AdamW
holds its moments, then save the same state again and again with
``core.checkpoint.save_restore.save_checkpoint`` — the call the trainer makes, fsync and
atomic publish included — rotating the format each time: ``safetensors`` (weights
gathered to the main process, one file), ``dcp`` (each rank writes its shard) and
``safetensors_dcp`` (both). The optimizer state is DCP shards in every format, so the
whole-save ratio understates the weights' difference; the weights alone
(``CheckpointFormat.save_weights`` + fsync) are timed too, also rotating. Then the
same saves with ``--async_checkpoint=true`` (``core.checkpoint.saver.CheckpointSaver``,
as the trainer uses it): the time training is blocked (staging the shard state in
memory; the gathered file is still written in the foreground) — the judged figure,
since that is what a run pays per save — and the time until the checkpoint is
published. Resume is
``restore_checkpoint`` of each format's checkpoint (just written, so from the page
cache: it measures the loading code, not the disk).

Checksums: after each synchronous save the main process hashes the published step folder
as ``checksums.json`` records it (``manifest.hash_files``), and before each resume it
verifies the folder against that manifest (``manifest.verify_manifest``); each is
reported against the save or resume it rides on (the files are in the page cache both
times, as they are for the save and resume themselves).

The ``dcp`` checkpoint is kept for the ``convert_dcp`` and ``startup`` benchmarks.
Run as a script (``python checkpoint_io.py worker OUTDIR SPEC_JSON``) this module is
the rank worker.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from _common import (
    Context,
    Result,
    Row,
    disk_write_speed,
    judge,
    launch_ranks,
    paired,
    tree_bytes,
    write_rank_result,
)

NAME = "checkpoints"
GOAL = ">= 3"
FORMATS = ["safetensors", "dcp", "safetensors_dcp"]
# 109 M parameters (437 MB fp32; with AdamW's moments 1.3 GB of state).
FULL_MODEL = ["--policy.dim_model=1024", "--policy.dim_feedforward=4096", "--policy.n_heads=8",
              "--policy.n_encoder_layers=4", "--policy.n_decoder_layers=2"]
SMOKE_MODEL = ["--policy.dim_model=32", "--policy.dim_feedforward=64", "--policy.n_heads=2",
               "--policy.n_encoder_layers=2", "--policy.n_vae_encoder_layers=1", "--policy.chunk_size=5",
               "--policy.n_action_steps=5"]
COMMON = ["--batch_size=2", "--dataset.num_episodes=2", "--dataset.episode_length=30", "--parallelism.dp_shard=2"]
KEPT = "large_checkpoint.json"  # in the benchmark folder: where the kept dcp checkpoint is


# ----------------------------------------------------------------------------- rank worker


def _rotated(items: list[str], shift: int) -> list[str]:
    shift %= len(items)
    return items[shift:] + items[:shift]


def _refused(what: str, fix: str) -> None:
    """A background save the benchmark's disk refused: the measurement is void, so it stops here."""
    raise RuntimeError(f"{what}; {fix}")


def _retarget(run: Any, output_dir: Path, **config_changes: Any) -> None:
    """Point the run's saves at another folder, format or saving mode (the run's spec is
    frozen, as in training; the benchmark swaps it for a changed copy)."""
    config = run.config.model_copy(update=config_changes)
    run.spec = dataclasses.replace(run.spec, output_dir=output_dir, config=config)
    run.__dict__.pop("checkpoint_state", None)  # cached: rebuilt from the new spec on next use


def _worker(outdir: Path, spec: dict[str, Any]) -> None:
    import torch.distributed as dist

    from lerobot_kit.core.checkpoint.save_restore import restore_checkpoint, save_checkpoint
    from lerobot_kit.core.checkpoint.stores import checkpoint_format
    from lerobot_kit.core.checkpoint.saver import CheckpointSaver, SaveSettings
    from lerobot_kit.core.config.flags import parse_train_config
    from lerobot_kit.core.distributed.process_group import init_distributed, shutdown
    from lerobot_kit.core.layout import manifest, paths
    from lerobot_kit.core.layout.fsync import fsync_tree
    from lerobot_kit.core.run.prepare import prepare_run

    ctx = init_distributed(timeout_s=600)
    config = parse_train_config([*spec["flags"], f"--output_dir={outdir / 'run'}"])
    prepared = prepare_run(config, ctx)
    run, parallel = prepared.run, prepared.run.parallel
    loss, _ = parallel.module(run.preprocessor(next(iter(prepared.loader))))
    loss.backward()
    parallel.finish_grad_sync()
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)

    def timed(action: Any) -> float:
        dist.barrier()
        start = time.perf_counter()
        action()
        dist.barrier()
        return time.perf_counter() - start

    formats: list[str] = spec["formats"]
    saves: dict[str, list[float]] = {f: [] for f in formats}
    weights: dict[str, list[float]] = {f: [] for f in formats}
    floors: dict[str, list[float]] = {f: [] for f in formats}
    hashes: dict[str, list[float]] = {f: [] for f in formats}
    step = 0
    for rep in range(spec["reps"]):
        for fmt in _rotated(formats, rep):
            step += 1
            _retarget(run, outdir / fmt, checkpoint_format=fmt)
            previous = paths.last_checkpoint(run.output_dir)
            saves[fmt].append(timed(lambda: save_checkpoint(run.checkpoint_state, step)))
            if ctx.is_main:
                if previous is not None:
                    shutil.rmtree(previous)  # keep the disk to one checkpoint per format
                # The disk's floor for this save, right after it (the other rank waits in the next barrier).
                saved = paths.last_checkpoint(run.output_dir)
                written = tree_bytes(saved)
                floors[fmt].append(written / disk_write_speed(outdir, written))
                start = time.perf_counter()
                manifest.hash_files(saved, manifest.saved_files(saved))
                hashes[fmt].append(time.perf_counter() - start)
            if not spec["weights"]:
                continue
            folder = outdir / "weights" / f"{fmt}{step}"
            if ctx.is_main:
                folder.mkdir(parents=True)

            def write_weights(fmt: str = fmt, folder: Path = folder) -> None:
                checkpoint_format(fmt).save_weights(run.weights, folder, sharded=True, is_main=ctx.is_main)
                dist.barrier()
                if ctx.is_main:
                    fsync_tree(folder)

            weights[fmt].append(timed(write_weights))
            if ctx.is_main:
                shutil.rmtree(folder)
    blocked: dict[str, list[float]] = {f: [] for f in formats}
    published: dict[str, list[float]] = {f: [] for f in formats}
    if spec["background"]:
        _retarget(run, run.output_dir, async_checkpoint=True)
        saver = CheckpointSaver(run.checkpoint_state, SaveSettings(True, run.config.keep_last_checkpoints,
                                                                  run.config.parallelism.timeout_s),
                                refused=_refused)
        for rep in range(spec["reps"]):
            for fmt in _rotated(formats, rep):
                step += 1
                _retarget(run, outdir / f"async_{fmt}", checkpoint_format=fmt)
                saver.state = run.checkpoint_state
                previous = paths.last_checkpoint(run.output_dir)
                blocked[fmt].append(timed(lambda: saver.save(step)))
                published[fmt].append(blocked[fmt][-1] + timed(saver.wait))
                if ctx.is_main and previous is not None:
                    shutil.rmtree(previous)
        saver.finish()
        _retarget(run, run.output_dir, async_checkpoint=False)
    restores: dict[str, list[float]] = {f: [] for f in formats}
    verifies: dict[str, list[float]] = {f: [] for f in formats}
    if spec["restore"]:
        for rep in range(spec["reps"]):
            for fmt in _rotated(formats, rep):
                step_dir = paths.last_checkpoint(outdir / fmt)
                restores[fmt].append(timed(lambda: restore_checkpoint(run.checkpoint_state, step_dir)))
                if ctx.is_main and manifest.has_manifest(step_dir):
                    start = time.perf_counter()
                    problems = manifest.verify_manifest(step_dir)
                    verifies[fmt].append(time.perf_counter() - start)
                    assert not problems, problems
    result: dict[str, Any] = {"save_s": saves, "weights_s": weights, "restore_s": restores, "disk_floor_s": floors,
                              "async_blocked_s": blocked, "async_published_s": published,
                              "hash_s": hashes, "verify_s": verifies}
    if ctx.is_main:
        result["params"] = parallel.param_counts()[0]
        result["sizes"] = {}
        for fmt in formats:
            step_dir = paths.last_checkpoint(outdir / fmt)
            pretrained = step_dir / paths.PRETRAINED_DIR
            gathered = pretrained / paths.MODEL_WEIGHTS
            shards = pretrained / paths.DCP_MODEL_DIR
            result["sizes"][fmt] = {
                "step_dir": str(step_dir),
                "total_bytes": tree_bytes(step_dir),
                "gathered_weights_bytes": gathered.stat().st_size if gathered.is_file() else 0,
                "dcp_weights_bytes": tree_bytes(shards) if shards.is_dir() else 0,
            }
    shutdown(ctx)
    write_rank_result(outdir, ctx.rank, result)


# ----------------------------------------------------------------------------- benchmark


def _launch(ctx: Context, folder: Path, formats: list[str], reps: int, full: bool) -> dict[str, Any]:
    """``full``: also the weights-only, asynchronous and resume timings (else only saves)."""
    spec = {"flags": [*ctx.pick(SMOKE_MODEL, FULL_MODEL), *COMMON], "formats": formats, "reps": reps,
            "weights": full, "background": full, "restore": full}
    main = launch_ranks([__file__, "worker", str(folder), json.dumps(spec)], 2, folder, timeout=900)[0]
    (folder / KEPT).write_text(json.dumps({"step_dir": main["sizes"]["dcp"]["step_dir"], "params": main["params"]}))
    return main


def large_checkpoint(ctx: Context) -> tuple[Path, int]:
    """The FSDP(2) ``dcp`` checkpoint this benchmark keeps (made now if it did not run),
    and its parameter count."""
    kept = ctx.workdir / NAME / KEPT
    if not kept.is_file():
        _launch(ctx, ctx.folder(NAME), ["dcp"], reps=1, full=False)
    info = json.loads(kept.read_text())
    return Path(info["step_dir"]), int(info["params"])


def run(ctx: Context) -> Result:
    main = _launch(ctx, ctx.folder(NAME), FORMATS, reps=ctx.pick(1, 3), full=True)
    result = Result(details=main)
    measures = [("async_blocked_s", "save, training blocked (--async_checkpoint=true)", GOAL),
                ("async_published_s", "save until published (--async_checkpoint=true)", ""),
                ("save_s", "save, synchronous (save_checkpoint)", ""),
                ("weights_s", "weights only, fsynced", ""),
                ("restore_s", "resume (restore_checkpoint)", "")]
    for key, label, goal in measures:
        for fmt in ("dcp", "safetensors_dcp"):
            # Speed-up of ``fmt`` over the gathered file: gathered time / fmt time, per rotation.
            speedup = paired(main[key]["safetensors"], main[key][fmt])
            judged = goal if fmt == "dcp" else ""
            result.rows.append(Row(
                f"{label}: {fmt} speed-up over safetensors (gathered)", speedup["reference"], speedup["ours"], "s",
                speedup["ratio"], judged, judge(speedup["ratio"], judged),
                f"{main['params'] / 1e6:.0f} M params, FSDP(2); ours = {fmt}, reference = gathered",
            ))
    for fmt in FORMATS:
        floor = paired(main["save_s"][fmt], main["disk_floor_s"][fmt])
        size = main["sizes"][fmt]["total_bytes"]
        result.rows.append(Row(
            f"save ({fmt}) vs writing its bytes at disk speed", floor["ours"], floor["reference"], "s",
            floor["ratio"], note=f"{size / 1e6:.0f} MB, one file + fsync right after each save",
        ))
    for key, base, label in (("hash_s", "save_s", "save"), ("verify_s", "restore_s", "resume")):
        if not main[key]["dcp"]:
            continue  # checkpoints without checksums.json: nothing to verify
        cost = paired(main[key]["dcp"], main[base]["dcp"])
        result.rows.append(Row(
            f"checksums (sha256 of every file) vs the {label} itself (dcp)", cost["ours"], cost["reference"], "s",
            cost["ratio"], note=f"reported, aim <= 0.10; ratio {cost['ratio_min']:.2f}-{cost['ratio_max']:.2f} "
            f"over {cost['pairs']} {label}s",
        ))
    sizes = main["sizes"]
    for fmt in ("dcp", "safetensors_dcp"):
        ours, gathered = sizes[fmt]["total_bytes"], sizes["safetensors"]["total_bytes"]
        result.rows.append(Row(
            f"checkpoint size: {fmt} vs safetensors", ours / 1e6, gathered / 1e6, "MB", ours / gathered,
            note="whole step folder (weights + optimizer + training state)",
        ))
    return result


if __name__ == "__main__":
    if sys.argv[1:2] != ["worker"]:
        sys.exit("usage: python checkpoint_io.py worker OUTDIR SPEC_JSON (started by benchmarks/run.py)")
    _worker(Path(sys.argv[2]), json.loads(sys.argv[3]))
