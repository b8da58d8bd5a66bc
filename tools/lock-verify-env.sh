#!/usr/bin/env bash
# Regenerates requirements/verify.lock: the exact, hash-checked environment `make verify` builds
# (.venv-verify) to re-run a bundle's analysis. Inputs: the runtime dependencies of pyproject.toml
# (not `dev`) and requirements/verify.in (the build backend). Target: CPython 3.11 on linux x86_64.
#
# The resolver is uv (`uv pip compile --generate-hashes`), installed at a pinned version into a
# scratch venv outside the repository (LOCK_TOOL_VENV), never into .venv. uv reads neither pip's
# config files nor PIP_* variables, and --index-url names PyPI, so a machine's local mirror,
# find-links or constraints cannot leak into the lock: every hash is the one PyPI serves.
#
# Usage: tools/lock-verify-env.sh            rewrite the lock
#        tools/lock-verify-env.sh --check    exit 1 if the lock would change (run it after editing
#                                            pyproject.toml's dependencies)
set -euo pipefail

UV_VERSION=0.13.9
INDEX_URL=https://pypi.org/simple
PYTHON=${PYTHON:-python3}
LOCK_TOOL_VENV=${LOCK_TOOL_VENV:-${TMPDIR:-/tmp}/servelab-lock-tool-uv-$UV_VERSION}

repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

check=false
case "${1:-}" in
  "") ;;
  --check) check=true ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

if [[ ! -x "$LOCK_TOOL_VENV/bin/uv" ]] || [[ "$("$LOCK_TOOL_VENV/bin/uv" --version)" != "uv $UV_VERSION"* ]]; then
  "$PYTHON" -m venv "$LOCK_TOOL_VENV"
  # PIP_CONFIG_FILE=/dev/null: this machine's pip config may add mirrors; the tool comes from PyPI.
  PIP_CONFIG_FILE=/dev/null "$LOCK_TOOL_VENV/bin/python" -m pip install --quiet \
    --index-url "$INDEX_URL" "uv==$UV_VERSION"
fi

out=requirements/verify.lock
if $check; then
  out=$(mktemp)
  trap 'rm -f "$out"' EXIT
fi

"$LOCK_TOOL_VENV/bin/uv" pip compile --quiet --no-config \
  --index-url "$INDEX_URL" \
  --python-version 3.11 --python-platform x86_64-unknown-linux-gnu \
  --generate-hashes \
  --custom-compile-command "tools/lock-verify-env.sh" \
  pyproject.toml requirements/verify.in \
  --output-file "$out"

if $check; then
  if ! diff -u requirements/verify.lock "$out"; then
    echo "requirements/verify.lock is stale: run tools/lock-verify-env.sh" >&2
    exit 1
  fi
  echo "requirements/verify.lock is up to date"
fi
