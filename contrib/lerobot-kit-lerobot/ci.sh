#!/usr/bin/env bash
# CI for the LeRobot bridge: its tests need the real LeRobot 0.6.1, which needs Python 3.12
# and torch < 2.12, so they run in a venv of their own, not in lerobot-kit's dev venv.
#
# The venv is cached outside the repository, keyed by the hash of ci-requirements.txt and
# the Python version: a run whose inputs are unchanged reuses it (seconds), a changed input
# builds a new one (many minutes: LeRobot pulls torch). It is built in a temporary folder and
# renamed when complete, so an interrupted build is never reused. lerobot-kit and the bridge
# are installed into it on every run (they are the code under test).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cache="${LEROBOT_KIT_CACHE:-$HOME/.cache/lerobot-kit}"

python312=""
if command -v pyenv >/dev/null 2>&1 && prefix="$(pyenv prefix 3.12.1 2>/dev/null)" && [ -x "$prefix/bin/python3.12" ]; then
    python312="$prefix/bin/python3.12"
elif command -v python3.12 >/dev/null 2>&1 && python3.12 -c "" >/dev/null 2>&1; then
    python312="$(command -v python3.12)"
fi
if [ -z "$python312" ]; then
    echo "error: the LeRobot bridge's tests need Python 3.12 (LeRobot 0.6 requires it); none found: install it (pyenv install 3.12.1) or put python3.12 on PATH" >&2
    exit 1
fi

key="$( { cat "$here/ci-requirements.txt"; "$python312" --version; } | sha256sum | cut -c1-16)"
venv="$cache/lerobot-venv-$key"
if [ ! -x "$venv/bin/python" ]; then
    echo "building $venv (ci-requirements.txt or Python changed)"
    mkdir -p "$cache"
    rm -rf "$venv.tmp"
    "$python312" -m venv "$venv.tmp"
    "$venv.tmp/bin/pip" install --quiet --upgrade pip
    "$venv.tmp/bin/pip" install --quiet -r "$here/ci-requirements.txt"
    # A venv's scripts name their interpreter by absolute path: make them name the final folder.
    grep -rlI "$venv.tmp" "$venv.tmp/bin" | xargs -r sed -i "s#$venv.tmp#$venv#g"
    mv "$venv.tmp" "$venv"
else
    echo "reusing $venv"
fi

# --no-deps: LeRobot's torch must stay; every dependency of both is in ci-requirements.txt.
"$venv/bin/pip" install --quiet --no-deps --no-build-isolation "$repo" "$here"
cd "$here"
exec "$venv/bin/python" -m pytest tests -p no:cacheprovider -q "$@"
