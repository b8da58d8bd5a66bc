"""Every real run's prompt-cache count against its bound (docs/campaigns.md, "A cold prompt
cache"; servelab.deploy.prompt_cache).

For each run of a results folder, loaded (`results/runs/`) and floor (`results/floor/`), it reads
the engine's cached-prompt-token count from the run's scrape.parquet and the bound from the run's
trace, as the live backends' check does after every run, and prints the count, the bound and
their ratio; then how many runs it judged, how many exceed the bound, and the largest ratio.

    python benchmarks/prompt_cache_bound.py [--results results]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pyarrow.parquet as pq

from servelab.deploy.prompt_cache import prompt_cache_check
from servelab.dispatch.run import WARMUP_PROMPT_TOKENS


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--results", type=Path, default=Path("results"))
    args = parser.parse_args()
    results: Path = args.results
    loaded = sorted((results / "runs").glob("*/*/*/rep*/run.json"))
    floors = sorted((results / "floor").glob("*/runs/*/*/*/rep*/run.json"))
    judged, warm, largest = 0, 0, 0.0
    for path in loaded + floors:
        run = json.loads(path.read_text())
        traces = results / ("floor/traces" if path in floors else "traces")
        check = prompt_cache_check(
            scrape=pq.read_table(path.parent / "scrape.parquet"),
            engine=run["engine"],
            trace_path=traces / run["condition"] / run["rep"] / "trace.parquet",
            warmup_requests=run["n_warmup"],
            warmup_prompt_tokens=WARMUP_PROMPT_TOKENS,
        )
        if check["warm"] is None:
            continue
        judged += 1
        warm += bool(check["warm"])
        ratio = check["cached_tokens"] / check["reusable_tokens"]
        largest = max(largest, ratio)
        where = path.parent.relative_to(results)
        print(f"{where}  {check['cached_tokens']:.0f} / {check['reusable_tokens']} = {ratio:.3f}")
    print(
        f"judged {judged} runs ({len(loaded)} loaded, {len(floors)} floor found); "
        f"over the bound: {warm}; largest count / bound: {largest:.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
