"""Time the full analysis of a synthetic 99-run grid of realistic size.

    .venv/bin/python benchmarks/analysis_grid.py [--root DIR] [--repeat N] [--keep]

Generates the grid of config/config.yaml (servelab.grid.config.runs: 99 runs, 39 trace manifests) with
`servelab.analysis.synthetic` at full run durations (a rate-0.40 run holds about 1,440 requests of
128-256 one-token chunks), then times `servelab.analysis.analyze` end to end and by phase:
loading and reducing the runs, the statistics and tables, numbers.json, and the 20 figure files.
Prints the figures; docs/benchmarks/analysis.md records them with the machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from servelab.analysis import analyze, build_analysis, figdata, figures
from servelab.analysis.numbers import build_numbers, clean
from servelab.analysis.pipeline import _drawable
from servelab.analysis.synthetic import write_synthetic_grid
from servelab.analysis.tables import render_table3, render_table4, render_table5, render_table6
from servelab.grid.config import load_config

REPO = Path(__file__).resolve().parents[1]


def _machine() -> str:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    model = next(
        (ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if "Model name" in ln), "?"
    )
    return f"nproc {os.cpu_count()}, {model}, Python {platform.python_version()}"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--root", type=Path, help="where to write the grid (default: a temp dir)")
    parser.add_argument("--repeat", type=int, default=3, help="timed analyses (default 3)")
    parser.add_argument("--keep", action="store_true", help="keep the generated grid")
    args = parser.parse_args()

    root = args.root or Path(tempfile.mkdtemp(prefix="servelab-analysis-bench-"))
    print(f"machine: {_machine()}")
    cfg = load_config(REPO / "config" / "config.yaml")
    t = time.perf_counter()
    runs, manifests = write_synthetic_grid(root, cfg)
    gen_s = time.perf_counter() - t
    size = sum(p.stat().st_size for d in runs for p in d.iterdir())
    print(
        f"generated {len(runs)} runs, {len(manifests)} manifests, {size / 1e6:.1f} MB in {gen_s:.1f} s"
    )

    totals = []
    for i in range(args.repeat):
        out = root / f"out{i}"
        t = time.perf_counter()
        result = analyze(runs, out, manifests=manifests)
        totals.append(time.perf_counter() - t)
        print(
            f"analyze #{i + 1}: {totals[-1]:.2f} s ({result.parsed} runs, {len(result.outputs)} files)"
        )

    # One more pass, timed by phase (same work as analyze, split up).
    t0 = time.perf_counter()
    an = build_analysis(runs, manifests=manifests)
    t1 = time.perf_counter()
    n_requests = sum(r.metrics.n_requests for r in an.runset.runs.values())
    for render in (render_table3, render_table4, render_table5, render_table6):
        render(an)
    t2 = time.perf_counter()
    numbers = build_numbers(an)
    t3 = time.perf_counter()
    phase_dir = root / "phases"
    figures.draw_figures(_drawable(numbers["figures"]), phase_dir / "figures", ("png",))
    t4 = time.perf_counter()
    figures.draw_figures(_drawable(clean(figdata.figure_data(an))), phase_dir / "figures", ("pdf",))
    t5 = time.perf_counter()
    print(f"requests analysed: {n_requests}")
    print(f"phase load + reduce runs: {t1 - t0:.2f} s")
    print(f"phase tables 3-6:         {t2 - t1:.2f} s")
    print(f"phase numbers.json:       {t3 - t2:.2f} s")
    print(f"phase figures (png):      {t4 - t3:.2f} s")
    print(f"phase figures (pdf):      {t5 - t4:.2f} s")
    print(f"analyze total: min {min(totals):.2f} s, median {statistics.median(totals):.2f} s")
    if not args.keep and args.root is None:
        shutil.rmtree(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
