"""A request alone in a loaded run against the same shape in the unloaded floor (issue 26;
docs/simulator.md, "Against the real engines").

The CPU platform is fitted from the floor only. If a request that meets no other request in a
loaded run (nothing else in flight when it is sent, nothing sent before its first token) takes
longer there than the floor's requests of the same shape, part of the light-load TTFT miss is a
state the loaded run carries and the floor does not, which no scheduler rule and no floor-only
fit can see. This prints, per engine and arm, from a `make sim-vs-real` results folder:

- the floor's median TTFT on the condition's shape (all floor repetitions pooled);
- the lone requests' median TTFT in the loaded runs, real and predicted (the same requests), and by
  the engine's idle time before them (how long since the previous request's last token), with
  each idle bin's median predicted ÷ real;
- the lone requests' predicted ÷ real TTFT after less and more than `IDLE_SPLIT_S` of idle, and
  within each run the ratio of the two (the prediction prices each request's own work, so this
  compares like with like, and comparing within a run leaves out the machine's slow periods);
- at each rate up to `LIGHT_RATE` graphs/s, the median predicted ÷ real TTFT of the lone
  requests and of the rest (sent while another was in flight, or met by one before their first
  token), and of the lone ones by their idle before;
- how busy the client's cores were (`machine_load` of every run.json: the busy share of the
  client's pinned cores over the run's window), median over the floor runs (every shape) and over
  the loaded runs: a busy client core slows the engine's (benchmarks/core_interference.py).

    python benchmarks/sim_vs_real_lone.py [--results results] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

# the last split at 1 s since the eleventh measurement: llama-server's pass after 1-9 s idle is
# 1.3-1.6 times slower (idle_wake_cost.py --after), after 0.1-0.3 s about 1.1-1.2
IDLE_BINS_S = ((0.0, 0.005), (0.005, 0.1), (0.1, 1.0), (1.0, float("inf")))
IDLE_SPLIT_S = 0.1
LIGHT_RATE = 1.0  # graphs/s: the light-load rates, where TTFT p50 is checked against lone work


def requests(path: Path) -> dict[str, Any]:
    t = pq.read_table(path).to_pydict()
    first = [c[0] if c else np.nan for c in t["chunk_times_s"]]
    last = [c[-1] if c else np.nan for c in t["chunk_times_s"]]
    return {
        "id": t["request_id"],
        "warmup": np.asarray(t["warmup"]),
        "sent": np.asarray(t["sent_s"], dtype=float),
        "ttft": np.asarray(first, dtype=float) - np.asarray(t["sent_s"], dtype=float),
        "end": np.asarray(last, dtype=float),
    }


def lone(run: dict[str, Any]) -> list[tuple[str, float, float]]:
    """(request id, TTFT, idle before it) of every trace request that met no other request."""
    out = []
    sent, end, ttft = run["sent"], run["end"], run["ttft"]
    for i in range(len(sent)):
        if run["warmup"][i] or not np.isfinite(ttft[i]):
            continue
        in_flight = ((sent < sent[i]) & (end > sent[i])).sum()
        joined = ((sent > sent[i]) & (sent < sent[i] + ttft[i])).sum()
        if in_flight == 0 and joined == 0:
            before = end[end <= sent[i]]
            idle = float(sent[i] - before.max()) if before.size else float("inf")
            out.append((run["id"][i], float(ttft[i]), idle))
    return out


def client_busy(run_dirs: list[Path]) -> float | None:
    """The median busy share of the client's cores over these runs' windows."""
    shares = []
    for run_dir in run_dirs:
        load = json.loads((run_dir / "run.json").read_text(encoding="utf-8")).get("machine_load")
        if load:
            shares.append(float(load["client"]["busy"]))
    return round(float(np.median(shares)), 3) if shares else None


def _median_ratio(values: list[float]) -> float | None:
    return round(float(np.median(values)), 3) if values else None


def summary(results: Path, arm: str, engine: str) -> dict[str, Any]:
    floors = sorted(results.glob(f"floor/{arm}-*/runs/{arm}/{engine}/floor-s0.50-L1024/rep*"))
    floor_runs = [requests(f / "requests.parquet") for f in floors]
    floor_ttft = np.concatenate([r["ttft"][~r["warmup"]] for r in floor_runs] or [np.array([])])
    floor_ttft = floor_ttft[np.isfinite(floor_ttft)]
    real, predicted, idle = [], [], []
    within_run: list[float] = []
    light: dict[str, dict[str, list[float]]] = {}
    lone_idle: dict[str, list[tuple[float, float]]] = {}  # light rate -> (pred ÷ real, idle)
    loaded = sorted((results / "runs" / arm / engine).glob("rate-*/rep*"))
    for run in loaded:
        measured = requests(run / "requests.parquet")
        guess_path = results / "sim_vs_real" / "predicted" / run.relative_to(results / "runs")
        guess = requests(guess_path / "requests.parquet")
        guessed = dict(zip(guess["id"], guess["ttft"], strict=True))
        alone = lone(measured)
        for rid, ttft, before in alone:
            real.append(ttft)
            predicted.append(guessed[rid])
            idle.append(before)
        short = [guessed[rid] / t for rid, t, before in alone if before < IDLE_SPLIT_S]
        long = [guessed[rid] / t for rid, t, before in alone if before >= IDLE_SPLIT_S]
        if short and long:  # real ÷ predicted after a long idle over that after a short one
            within_run.append(float(np.median(short) / np.median(long)))
        rate = float(run.parent.name.removeprefix("rate-"))
        if rate <= LIGHT_RATE:
            classes = light.setdefault(f"{rate:g}", {"lone": [], "with_others": []})
            lone_idle.setdefault(f"{rate:g}", []).extend(
                (guessed[rid] / t, before) for rid, t, before in alone
            )
            alone_ids = {rid for rid, _t, _b in alone}
            for rid, ttft, warmup in zip(
                measured["id"], measured["ttft"], measured["warmup"], strict=True
            ):
                if not warmup and np.isfinite(ttft) and rid in guessed:
                    kind = "lone" if rid in alone_ids else "with_others"
                    classes[kind].append(guessed[rid] / ttft)
    real_a, idle_a, predicted_a = np.asarray(real), np.asarray(idle), np.asarray(predicted)
    by_idle = {}
    for lo, hi in IDLE_BINS_S:
        mask = (idle_a >= lo) & (idle_a < hi)
        by_idle[f"{lo:g}-{hi:g} s"] = {
            "n": int(mask.sum()),
            "real_ms": round(float(np.median(real_a[mask])) * 1e3, 1) if mask.any() else None,
            "predicted_over_real": _median_ratio(list(predicted_a[mask] / real_a[mask])),
        }
    floor_ms = float(np.median(floor_ttft)) * 1e3 if floor_ttft.size else float("nan")
    real_ms = float(np.median(real_a)) * 1e3 if real_a.size else float("nan")
    return {
        "floor_requests": int(floor_ttft.size),
        "floor_ttft_ms": round(floor_ms, 1),
        "lone_requests": int(real_a.size),
        "lone_real_ttft_ms": round(real_ms, 1),
        "lone_predicted_ttft_ms": round(float(np.median(predicted)) * 1e3, 1)
        if predicted
        else None,
        "lone_over_floor": round(real_ms / floor_ms, 3),
        "by_idle_before": by_idle,
        "lone_predicted_over_real": {
            f"idle < {IDLE_SPLIT_S:g} s": _median_ratio(
                [p / r for p, r, i in zip(predicted, real, idle, strict=True) if i < IDLE_SPLIT_S]
            ),
            f"idle >= {IDLE_SPLIT_S:g} s": _median_ratio(
                [p / r for p, r, i in zip(predicted, real, idle, strict=True) if i >= IDLE_SPLIT_S]
            ),
        },
        "long_idle_excess_within_runs": {
            "runs": len(within_run),
            "median": _median_ratio(within_run),
        },
        "light_load_predicted_over_real": {
            rate: {
                **{kind: {"n": len(v), "median": _median_ratio(v)} for kind, v in c.items()},
                "lone_by_idle_before": {
                    f"{lo:g}-{hi:g} s": {"n": len(v), "median": _median_ratio(v)}
                    for lo, hi in IDLE_BINS_S
                    for v in [[r for r, i in lone_idle[rate] if lo <= i < hi]]
                },
            }
            for rate, c in light.items()
        },
        "client_busy_floor": client_busy(
            sorted(results.glob(f"floor/{arm}-*/runs/{arm}/{engine}/*/rep*"))
        ),
        "client_busy_loaded": client_busy(loaded),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    out: dict[str, Any] = {}
    for engine in sorted(p.name for p in (args.results / "runs" / "defaults").iterdir()):
        for arm in ("defaults", "matched"):
            row = summary(args.results, arm, engine)
            out[f"{engine}/{arm}"] = row
            print(f"{engine:9s} {arm:9s} {json.dumps(row)}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
