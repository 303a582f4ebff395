"""``--accelerator.activation_checkpointing`` and ``--accelerator.compile`` from the CLI,
on real gloo processes: AC changes no number under FSDP(2) (dropout and the VAE draw
included) and no checkpoint key, so a run saved with it resumes without it; compiled
one-process and FSDP(2) runs train to the eager losses. Compile runs are kept to two,
sharing their kernels: a first ``torch.compile`` costs ~20 s even for this tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from checkpoint_state import crashed_copy, full_weights, losses
from conftest import PARITY_ACT, TINY_ACT, built_once, launch_env, pool_train, run_cli, torchrun_train

STEPS = 4
AC = "--accelerator.activation_checkpointing=true"
COMPILE = "--accelerator.compile=true"
FSDP2 = "--parallelism.dp_shard=2"
COMPILE_TIMEOUT = 1800  # a loaded 2-core runner compiles for minutes (13 at a load of 15)


def _args(out: Path, *flags: str) -> list[str]:
    return [f"--output_dir={out}", f"--steps={STEPS}", "--log_freq=1", "--save_freq=2", *flags]


def _compile(root: Path, name: str, nproc: int, *flags: str, cache: str) -> Path:
    """A compiling run in ``root/name`` in processes of its own (a first compile in each),
    keeping its kernels in ``root/<cache>_inductor``: it compiles unless an earlier run of
    the same graphs did."""
    out = root / name
    env = {"TORCHINDUCTOR_CACHE_DIR": str(root / f"{cache}_inductor")}
    if nproc == 1:
        result = run_cli("train", *_args(out, COMPILE, *flags), env=launch_env(root, env), timeout=COMPILE_TIMEOUT)
        assert result.returncode == 0, result.stderr[-3000:]
    else:
        result = torchrun_train(nproc, *_args(out, COMPILE, *flags), workdir=root, env=env, timeout=COMPILE_TIMEOUT)
    (root / f"{name}.stderr").write_text(result.stderr)
    return out


def _eager(pools, root: Path, name: str, nproc: int, *flags: str) -> Path:
    """An eager run in ``root/name``, in a rank pool."""
    result = pool_train(pools, nproc, *_args(root / name, *flags), workdir=root)
    (root / f"{name}.stderr").write_text(result.stderr)
    return root / name


@pytest.fixture(scope="module")
def ac_runs(tmp_path_factory: pytest.TempPathFactory, rank_pools) -> dict[str, Path]:
    """FSDP(2) ACT with dropout and the VAE on, with and without activation checkpointing."""
    common = [*TINY_ACT, FSDP2, "--batch_size=4"]

    def build(root: Path) -> None:
        _eager(rank_pools, root, "eager", 2, *common)
        _eager(rank_pools, root, "ac", 2, *common, AC)

    root = built_once(tmp_path_factory, "ac", build)
    return {"eager": root / "eager", "ac": root / "ac"}


def test_fsdp_losses_are_the_same_with_activation_checkpointing(ac_runs: dict[str, Path]) -> None:
    plain, checkpointed = losses(ac_runs["eager"]), losses(ac_runs["ac"])
    assert len(plain) == STEPS
    assert checkpointed == pytest.approx(plain, rel=1e-6)
    banner = (ac_runs["ac"].parent / "ac.stderr").read_text()
    assert "wrap units: 4 from policy (ACTDecoderLayer, ACTEncoderLayer), checkpointed" in banner


def test_a_checkpoint_saved_with_activation_checkpointing_resumes_without_it(
    ac_runs: dict[str, Path], tmp_path: Path, rank_pools
) -> None:
    """Same state-dict keys either way: the AC run's step-2 checkpoint resumes with AC off
    and continues exactly as the AC run did (and as the run that never had AC)."""
    with_ac = ac_runs["ac"]
    resumed = crashed_copy(with_ac, 2, tmp_path / "resumed")
    config = resumed / "checkpoints/last/pretrained_model/train_config.json"
    pool_train(rank_pools, 2, "--resume=true", f"--config_path={config}", "--accelerator.activation_checkpointing=false",
               workdir=tmp_path)
    assert losses(resumed, after=2) == pytest.approx(losses(with_ac, after=2), rel=1e-6)
    final = f"checkpoints/{STEPS:06d}/pretrained_model"
    ours, theirs = full_weights(resumed / final, tmp_path), full_weights(ac_runs["eager"] / final, tmp_path)
    assert ours.keys() == theirs.keys()
    for key in ours:
        torch.testing.assert_close(ours[key], theirs[key], rtol=1e-5, atol=1e-7, msg=key)


@pytest.fixture(scope="module")
def compile_runs(tmp_path_factory: pytest.TempPathFactory, rank_pools) -> dict[str, Path]:
    """Without dropout (compiled kernels draw their own random numbers), with activation
    checkpointing, 2 samples per rank: one process eager and compiled, FSDP(2) compiled,
    and the eager one-process run of FSDP(2)'s global batch of 4. The compiled runs share
    one kernel cache, one after the other: FSDP(2) traces the same unit graphs at the same
    per-rank shapes, so its ranks load much of what the one-process run compiled instead
    of both compiling it again (half the CPU time of a cold FSDP(2) compile here)."""
    common = [*PARITY_ACT, AC, "--batch_size=2"]

    def build(root: Path) -> None:
        _eager(rank_pools, root, "eager_batch2", 1, *common)
        _compile(root, "single", 1, *common, cache="shared")
        _eager(rank_pools, root, "eager_batch4", 1, *PARITY_ACT, AC, "--batch_size=4")
        _compile(root, "fsdp", 2, *common, FSDP2, cache="shared")

    root = built_once(tmp_path_factory, "compile", build)
    return {name: root / name for name in ("eager_batch2", "single", "eager_batch4", "fsdp")}


@pytest.mark.parametrize(("name", "reference"), [("single", "eager_batch2"), ("fsdp", "eager_batch4")])
def test_compiled_runs_train_to_the_eager_losses(compile_runs: dict[str, Path], name: str, reference: str) -> None:
    eager, compiled = losses(compile_runs[reference]), losses(compile_runs[name])
    assert len(compiled) == STEPS and all(torch.isfinite(torch.tensor(compiled)))
    assert compiled == pytest.approx(eager, rel=1e-3)
    banner = (compile_runs[name].parent / f"{name}.stderr").read_text()
    assert "(ACTDecoderLayer, ACTEncoderLayer), checkpointed, compiled" in banner


def test_compile_without_a_cxx_compiler_is_one_line(tmp_path: Path) -> None:
    result = run_cli("train", f"--output_dir={tmp_path / 'x'}", *TINY_ACT, "--steps=1", COMPILE,
                     env=launch_env(tmp_path, {"CXX": str(tmp_path / "no-such-g++")}))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if "--accelerator.compile=true" in line]
    assert errors == [
        "error: --accelerator.compile=true on CPU needs a C++ compiler (g++ or $CXX) to build the compiled kernels, "
        "and none runs here: install one, or drop the flag"
    ], result.stderr[-2000:]


def test_a_failure_inside_torch_compile_is_one_line(tmp_path: Path) -> None:
    """A compiler that passes inductor's probe but fails every build: the error raised
    inside torch.compile during the first step becomes one line, not torch's traceback."""
    compiler = tmp_path / "g++"
    compiler.write_text('#!/bin/sh\ncase " $* " in *" -o "*) echo "refusing to build" >&2; exit 1;; esac\n'
                        'exec g++ "$@"\n')
    compiler.chmod(0o755)
    env = {"CXX": str(compiler), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    result = run_cli("train", f"--output_dir={tmp_path / 'x'}", *PARITY_ACT, "--steps=1", COMPILE,
                     env=launch_env(tmp_path, env), timeout=COMPILE_TIMEOUT)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(
        "error: torch.compile failed while compiling the model (CppCompileError: "), result.stderr[-2000:]
    assert not (tmp_path / "x" / "checkpoints").exists()
