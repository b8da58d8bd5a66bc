"""How much does this machine's own speed move over a run's length, for memory reads and for
in-cache arithmetic? (issue 26; docs/simulator.md, "The repeated miss, made again").

    .venv/bin/python benchmarks/machine_speed_drift.py [--minutes 10] [--window-s 20]
        [--cpu 1] [--json OUT]

Two llama.cpp runs of one trace, a minute apart, differ by up to 8.5% against one prediction,
and vLLM's by less. No engine runs here: pinned to the engine's core (`--cpu`, config `local`),
this alternates two fixed kernels in short slices for `--minutes`:
- memory: summing a 256 MB float32 array (numpy), which streams it from memory, as a
  llama-server pass on the tiny model streams its 32 MB output head;
- in cache: a 64×64 float32 matrix product, many times over (numpy), which stays in the core's
  cache.

Each slice's throughput is recorded with its time. The slices are then grouped into windows of
`--window-s` (a loaded run's length), and it prints, per kernel, the standard deviation of the
slices and of the window means (relative to the mean), the range of window means, and what
independent slices would give for a window (the slices' sd over the square root of the slices a
window holds). Window means that spread more than that say the machine's slow and fast stretches
last longer than a slice. The correlation of the two kernels' window means says whether one thing
moves both.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# One BLAS thread, set before numpy loads BLAS: the main thread, pinned below, does all the work.
os.environ["OPENBLAS_NUM_THREADS"] = "1"
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llamacpp_engine import machine

SLICE_S = 0.25
MEMORY_BYTES = 256 * 2**20
MATRIX = 64


def memory_slice(data: np.ndarray) -> float:
    """GB/s summing `data` as many times as fit in SLICE_S."""
    start = time.perf_counter()
    passes = 0
    while time.perf_counter() - start < SLICE_S:
        data.sum()
        passes += 1
    return passes * data.nbytes / (time.perf_counter() - start) / 1e9


def cache_slice(a: np.ndarray, b: np.ndarray) -> float:
    """GFLOP/s of MATRIX×MATRIX products for SLICE_S."""
    start = time.perf_counter()
    products = 0
    while time.perf_counter() - start < SLICE_S:
        for _ in range(100):
            a @ b
        products += 100
    return products * 2 * MATRIX**3 / (time.perf_counter() - start) / 1e9


def spread(values: list[float]) -> float | None:
    """Standard deviation over mean; None for fewer than two values (a probe of one window)."""
    if len(values) < 2:
        return None
    return statistics.stdev(values) / statistics.fmean(values)


def rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--window-s", type=float, default=20.0)
    parser.add_argument("--cpu", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    os.sched_setaffinity(0, {args.cpu})
    rng = np.random.default_rng(0)
    data = rng.random(MEMORY_BYTES // 4, dtype=np.float32)
    a = rng.random((MATRIX, MATRIX), dtype=np.float32)
    b = rng.random((MATRIX, MATRIX), dtype=np.float32)
    started = time.time()
    t0 = time.perf_counter()
    kinds: dict[str, list[float]] = {"memory GB/s": [], "in cache GFLOP/s": []}
    times: list[float] = []
    while time.perf_counter() - t0 < args.minutes * 60:  # bounded by --minutes
        times.append(time.perf_counter() - t0)
        kinds["memory GB/s"].append(memory_slice(data))
        kinds["in cache GFLOP/s"].append(cache_slice(a, b))
    window_of = [int(t // args.window_s) for t in times]
    n_windows = max(window_of) + 1
    out: dict[str, Any] = {
        "machine": machine(),
        "cpu": args.cpu,
        "minutes": args.minutes,
        "window_s": args.window_s,
        "slice_s": SLICE_S,
        "started_unix_s": round(started, 1),
        "kinds": {},
    }
    means: dict[str, list[float]] = {}
    for kind, values in kinds.items():
        windows = [
            [v for v, w in zip(values, window_of, strict=True) if w == i] for i in range(n_windows)
        ]
        windows = [w for w in windows if len(w) >= 2]
        means[kind] = [statistics.fmean(w) for w in windows]
        per_window = statistics.fmean(len(w) for w in windows)
        grand = statistics.fmean(values)
        of_slices = spread(values)
        out["kinds"][kind] = {
            "mean": round(grand, 3),
            "slices": len(values),
            "sd_of_slices": rounded(of_slices),
            "windows": len(windows),
            "sd_of_window_means": rounded(spread(means[kind])),
            "sd_if_slices_were_independent": rounded(
                None if of_slices is None else of_slices / per_window**0.5
            ),
            "window_means_over_mean": [round(m / grand, 4) for m in means[kind]],
        }
        k = out["kinds"][kind]
        print(
            f"{kind}: mean {k['mean']}; sd of {k['slices']} slices {k['sd_of_slices']}; "
            f"sd of {k['windows']} window means {k['sd_of_window_means']} "
            f"(independent slices would give {k['sd_if_slices_were_independent']}); "
            f"window means {min(k['window_means_over_mean'])}-{max(k['window_means_over_mean'])}"
        )
    names = list(means)
    if len(means[names[0]]) > 2:
        r = float(np.corrcoef(means[names[0]], means[names[1]])[0, 1])
        out["window_means_correlation"] = round(r, 3)
        print(f"correlation of the two kernels' window means: {r:.3f}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
