#!/usr/bin/env bash
# Builds llama.cpp's llama-server (CPU only) from the llama.cpp sources vendored in a pinned
# llama-cpp-python sdist, the one thing this downloads (from PyPI). The binary is cached under
# ${XDG_CACHE_HOME:-~/.cache}/servelab/llama-server/<version>/, so a second call is instant.
# Prints the binary's path on stdout; progress goes to stderr.
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
# The pinned release and the SHA-256 of its sdist as PyPI lists it (read 2026-12-01).
if [ "$VERSION" = 0.3.36 ]; then
    SDIST_SHA256="${LLAMA_CPP_PYTHON_SHA256:-832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e}"
else
    SDIST_SHA256="${LLAMA_CPP_PYTHON_SHA256:-}"
fi
PYTHON="${PYTHON:-python3}"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/servelab/llama-server/$VERSION"
BINARY="$CACHE/bin/llama-server"

if [ -x "$BINARY" ] && [ -f "$CACHE/build.json" ]; then
    echo "$BINARY"
    exit 0
fi

for tool in cmake ninja g++; do
    command -v "$tool" >/dev/null 2>&1 || { echo "build-llama-server: $tool not found" >&2; exit 1; }
done

mkdir -p "$CACHE"
work="$(mktemp -d "$CACHE/.build.XXXXXX")"
trap 'rm -rf "$work"' EXIT

echo "build-llama-server: downloading llama-cpp-python==$VERSION (sdist) from PyPI" >&2
# PyPI's simple index (PEP 691 JSON) names the sdist and its SHA-256; nothing else is fetched.
sdist="$("$PYTHON" - "$VERSION" "$work" <<'PY'
import hashlib, json, pathlib, sys, urllib.request
version, work = sys.argv[1], pathlib.Path(sys.argv[2])
name = f"llama_cpp_python-{version}.tar.gz"
request = urllib.request.Request(
    "https://pypi.org/simple/llama-cpp-python/",
    headers={"Accept": "application/vnd.pypi.simple.v1+json"},
)
with urllib.request.urlopen(request, timeout=60) as response:
    files = json.load(response)["files"]
entry = next((f for f in files if f["filename"] == name), None)
if entry is None:
    sys.exit(f"build-llama-server: PyPI lists no {name}")
target = work / name
with urllib.request.urlopen(entry["url"], timeout=600) as response:
    target.write_bytes(response.read())
digest = hashlib.sha256(target.read_bytes()).hexdigest()
if digest != entry["hashes"]["sha256"]:
    sys.exit(f"build-llama-server: {name} has SHA-256 {digest}, PyPI lists {entry['hashes']['sha256']}")
print(target)
PY
)"
actual="$(sha256sum "$sdist" | cut -d' ' -f1)"
if [ -n "$SDIST_SHA256" ] && [ "$actual" != "$SDIST_SHA256" ]; then
    echo "build-llama-server: $sdist has SHA-256 $actual, expected $SDIST_SHA256" >&2
    exit 1
fi
tar -xzf "$sdist" -C "$work"
src="$(ls -d "$work"/llama_cpp_python-*/vendor/llama.cpp)"

echo "build-llama-server: building llama-server (CPU, Release) in $work" >&2
start=$(date +%s)
cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF \
    >"$work/cmake.log" 2>&1 || { tail -30 "$work/cmake.log" >&2; exit 1; }
ninja -C "$work/build" llama-server >"$work/ninja.log" 2>&1 || { tail -30 "$work/ninja.log" >&2; exit 1; }
seconds=$(( $(date +%s) - start ))

mkdir -p "$CACHE/bin.new"
cp "$work/build/bin/llama-server" "$CACHE/bin.new/llama-server"
rm -rf "$CACHE/bin"
mv "$CACHE/bin.new" "$CACHE/bin"
printf '{"llama_cpp_python": "%s", "sdist_sha256": "%s", "build_seconds": %s, "cores": %s}\n' \
    "$VERSION" "$actual" "$seconds" "$(nproc)" >"$CACHE/build.json"
echo "build-llama-server: built in ${seconds}s" >&2
echo "$BINARY"
