"""Bundle a finished campaign and verify the bundle elsewhere: size and time of each.

    .venv/bin/python benchmarks/bundle.py --results DIR --config FILE [--out FILE] [--repeat N]

DIR is a finished campaign's results folder (e.g. the 99-run sim campaign of `snakemake --cores 1
all`), FILE its merged configuration (config/config.yaml for the default campaign). Run it from the
campaign's folder with DIR relative (`--results results`), as the workflow analysed it. Times
`servelab.bundle.archive.write_bundle` (repeat N times: the bytes must be identical each time) and
`servelab.bundle.archive.verify_bundle` into a fresh temporary folder (extract, check every member,
regenerate every output, compare). Prints the machine, the campaign's size, the bundle's size and
both times; docs/benchmarks/bundle.md records them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from servelab.bundle.archive import verify_bundle, write_bundle
from servelab.grid.config import load_config


def _machine() -> str:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    model = next(
        (ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if "Model name" in ln), "?"
    )
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"nproc {os.cpu_count()}, {model}, Python {platform.python_version()}, load {load}"


def _folder_mb(root: Path) -> float:
    """Bytes under `root`, each hard-linked file once, bundles (*.tar.gz) left out."""
    inodes = {}
    for p in root.rglob("*"):
        if p.is_file() and not p.is_symlink() and not p.name.endswith(".tar.gz"):
            st = p.stat()
            inodes[(st.st_dev, st.st_ino)] = st.st_size
    return sum(inodes.values()) / 1e6


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--results", type=Path, required=True, help="the campaign's results")
    parser.add_argument("--config", type=Path, required=True, help="its merged configuration")
    parser.add_argument("--out", type=Path, help="where to write the bundle (default: temp)")
    parser.add_argument("--repeat", type=int, default=2, help="timed bundlings (default 2)")
    parser.add_argument("--json", action="store_true", help="end with a JSON line")
    args = parser.parse_args()

    print(f"machine: {_machine()}")
    config = load_config(args.config)
    print(f"results folder: {_folder_mb(args.results):.1f} MB on disk (logs, Prometheus too)")
    with tempfile.TemporaryDirectory(prefix="servelab-bundle-bench-") as tmp:
        out = args.out or Path(tmp) / "campaign.tar.gz"
        times, digests = [], set()
        for _ in range(args.repeat):
            t = time.perf_counter()
            write_bundle(args.results, config, out)
            times.append(time.perf_counter() - t)
            digests.add(hashlib.sha256(out.read_bytes()).hexdigest())
        size_mb = out.stat().st_size / 1e6
        print(
            f"bundle: {size_mb:.1f} MB, write {statistics.median(times):.1f} s "
            f"(median of {len(times)}: {', '.join(f'{x:.1f}' for x in times)}), "
            f"{'identical bytes each time' if len(digests) == 1 else 'BYTES DIFFER'}"
        )
        t = time.perf_counter()
        report = verify_bundle(out, Path(tmp) / "verify")
        verify_s = time.perf_counter() - t
        members_mb = sum(p.stat().st_size for p in (Path(tmp) / "verify").rglob("*") if p.is_file())
        print(f"verify: {verify_s:.1f} s ({report.members} members, {members_mb / 1e6:.1f} MB)")
        print(report.render(), end="")
    print(f"load average after: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    if args.json:
        summary = {
            "bundle_mb": round(size_mb, 1),
            "write_s": round(statistics.median(times), 1),
            "verify_s": round(verify_s, 1),
        }
        print(json.dumps(summary))
    return 0 if report.ok and len(digests) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
