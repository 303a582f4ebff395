#!/usr/bin/env bash
# LeRobot's lerobot-train beside lerobot-kit on one CUDA GPU: π0.5 and SmolVLA at LeRobot's
# default sizes from random weights, in bf16, then ACT at LeRobot's sizes, each by
# tools/benchmark.py (same dataset, batch, workers and steps for both tools). Writes
# gpu-<policy>.json (the result files the bridge README's GPU tables are rendered from)
# and <policy>.log into OUTDIR. Needs LeRobot 0.6.1, lerobot-kit and this bridge importable
# by `python3` and their console scripts on PATH.
#
#   bash tools/gpu_compare.sh OUTDIR [POLICY...]      # POLICY: pi05 smolvla act (default: all)
#
# Each policy has a time limit, so one that hangs or fails leaves the others their time;
# the exit code is 1 when any failed.
set -uo pipefail

out="${1:?usage: gpu_compare.sh OUTDIR [pi05] [smolvla] [act]}"
shift
if [ $# -gt 0 ]; then policies=("$@"); else policies=(pi05 smolvla act); fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mkdir -p "$out"

# One camera at 480x640, as LeRobot's recorders write it; 4 decoding workers each.
common=(--device=cuda --precision=bf16 --image=480x640 --num_workers=4 --workdir=/tmp/lerobot-kit-gpu-compare)
declare -A settings=(
    [pi05]="--batch_size=16 --steps=40 --warmup=10"
    [smolvla]="--batch_size=32 --steps=60 --warmup=20"
    [act]="--batch_size=8 --steps=60 --warmup=20"
)
declare -A limit_s=([pi05]=300 [smolvla]=120 [act]=90)

for policy in "${policies[@]}"; do
    if [ -z "${settings[$policy]:-}" ]; then
        echo "unknown policy '$policy': one of pi05, smolvla, act" >&2
        exit 2
    fi
done
# The dataset and the stand-in files first, outside the policies' time limits.
timeout 300 python3 "$here/benchmark.py" --prepare_only --policy=smolvla "${common[@]}" >"$out/prepare.log" 2>&1 &&
    timeout 60 python3 "$here/benchmark.py" --prepare_only --policy=pi05 "${common[@]}" >>"$out/prepare.log" 2>&1 ||
    { echo "preparing the dataset failed:"; tail -20 "$out/prepare.log"; exit 1; }

failed=0
for policy in "${policies[@]}"; do
    echo "== $policy (limit ${limit_s[$policy]} s)"
    # shellcheck disable=SC2086 # the settings are words
    timeout "${limit_s[$policy]}" python3 "$here/benchmark.py" --policy="$policy" ${settings[$policy]} "${common[@]}" \
        --json "$out/gpu-$policy.json" >"$out/$policy.log" 2>&1
    code=$?
    grep -v "^Svt\|^\[mp4\|^Map" "$out/$policy.log" | tail -12
    if [ $code -ne 0 ]; then
        echo "$policy failed: exit $code (log: $out/$policy.log)"
        failed=1
    fi
done
exit $failed
