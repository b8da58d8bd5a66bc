#!/usr/bin/env bash
# Builds the SGLang-CPU environment (`make sglang-cpu`): a virtual environment of its own, apart from
# the project's .venv and vLLM's (SGLang 0.5.23 pins torch 2.14.1), installed from
# requirements/sglang-cpu.lock with --require-hashes --no-deps, so nothing the lock does not pin
# comes in, plus servelab's stand-in `sgl_kernel` (src/servelab/deploy/standins/sgl_kernel: PyPI has
# no CPU build of sgl-kernel; the module's docstring says what it provides and why). Cached under
# ${XDG_CACHE_HOME:-~/.cache}/servelab/sglang-cpu/<version>/ with the lock's and the stand-in's
# SHA-256: a second call with both unchanged is instant; a change rebuilds.
# Prints the environment's python on stdout; progress goes to stderr.
set -euo pipefail

VERSION=0.5.23
repo=$(cd "$(dirname "$0")/.." && pwd)
LOCK="$repo/requirements/sglang-cpu.lock"
STANDIN="$repo/src/servelab/deploy/standins/sgl_kernel"
PYTHON="${PYTHON:-python3}"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/servelab/sglang-cpu/$VERSION"
VENV="$CACHE/venv"
STAMP="$CACHE/lock.sha256"
want=$(cat "$LOCK" "$STANDIN/__init__.py" | sha256sum | cut -d' ' -f1)

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$VENV/bin/python" ]; then
    echo "$VENV/bin/python"
    exit 0
fi

echo "build-sglang-cpu: installing sglang $VERSION from $LOCK into $VENV" >&2
rm -rf "$CACHE"
mkdir -p "$CACHE"
"$PYTHON" -m venv "$VENV"
start=$(date +%s)
# pip's machine configuration supplies torch and torchvision from the disk (find-links); PyPI the rest.
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --require-hashes \
    -r "$LOCK" >&2
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
rm -rf "$site/sgl_kernel"
cp -r "$STANDIN" "$site/sgl_kernel"
rm -rf "$site/sgl_kernel/__pycache__"
# SGLang's CPU engine, its server and the stand-in import (a missing module fails here, not at a run).
SGLANG_USE_CPU_ENGINE=1 "$VENV/bin/python" -c \
    "import sgl_kernel, sglang.launch_server; from sglang.srt.managers import scheduler; print(sgl_kernel.STANDIN)" >&2
echo "$want" >"$STAMP"
echo "build-sglang-cpu: done in $(($(date +%s) - start)) s ($(du -sh "$VENV" | cut -f1))" >&2
echo "$VENV/bin/python"
