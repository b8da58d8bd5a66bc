"""What the simulator answers to each ablation's question: the numbers docs/ablations.md quotes.

    .venv/bin/snakemake --cores 1 ablations
    .venv/bin/python benchmarks/ablations.py --results results

Reads only analysis outputs: results/ablations/summary.csv (every ablation's Table 5 beside the
study's; without it, the study's and each built ablation's own table5.csv), each ablation's
table4.csv, numbers.json (the fluid model, throughput), ablation.json (what was derived) and its
traces' manifests (the topologies drawn, the trace lines replayed). An ablation not built is named
as such. Prints markdown, one section per ablation: the study grid's value beside the
ablation's for the rows that answer its question.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from pathlib import Path
from typing import Any

GAP_METRICS = ("ttft_p50", "ttft_p95")


def _float(text: str) -> float:
    return float(text) if text not in ("", "nan") else math.nan


def _gap(row: dict[str, str] | None, arm: str) -> str:
    """`1.97*` (paired p < 0.05), `—` when absent."""
    if row is None:
        return "—"
    gap, p = _float(row[f"{arm}_gap"]), _float(row[f"{arm}_p"])
    if not math.isfinite(gap):
        return "—"
    return f"{gap:.3g}{'*' if math.isfinite(p) and p < 0.05 else ''}"


def _phi(row: dict[str, str] | None) -> str:
    if row is None or not math.isfinite(_float(row["removed_fraction"])):
        return "—"
    return f"{_float(row['removed_fraction']):.0%}"


def summary(results: Path) -> dict[tuple[str, str], dict[tuple[str, str], dict[str, str]]]:
    """(ablation, variant) -> (condition, metric) -> its Table 5 row: from summary.csv (target
    `ablations`), else from the study's and each built ablation's own table5.csv (an ablation
    built alone)."""
    out: dict[tuple[str, str], dict[tuple[str, str], dict[str, str]]] = {}
    path = results / "ablations" / "summary.csv"
    if path.is_file():
        with path.open(newline="") as f:
            for row in csv.DictReader(f):
                key = (row["ablation"], row["variant"])
                out.setdefault(key, {})[(row["condition"], row["metric"])] = row
        return out
    tables = {("study", ""): results / "table5.csv"}
    for table in sorted((results / "ablations").glob("**/table5.csv")):
        parts = table.parent.relative_to(results / "ablations").parts
        tables[(parts[0], "/".join(parts[1:]))] = table
    for key, table in tables.items():
        if table.is_file():
            for row in _csv(table):
                out.setdefault(key, {})[(row["condition"], row["metric"])] = row
    return out


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def beside_study(
    tables: dict[tuple[str, str], dict[tuple[str, str], dict[str, str]]],
    key: tuple[str, str],
    arms: tuple[str, ...] = ("defaults", "matched"),
) -> str:
    """The ablation's Table 5 rows beside the study grid's, arm by arm."""
    study, ours = tables[("study", "")], tables[key]
    header = ["condition, metric"]
    for arm in arms:
        header += [f"{arm}: study", f"{arm}: {key[0]}"]
    header += ["φ study", f"φ {key[0]}"]
    rows = []
    for cm, row in ours.items():
        line = [f"{cm[0]}, {cm[1]}"]
        for arm in arms:
            line += [_gap(study.get(cm), arm), _gap(row, arm)]
        rows.append([*line, _phi(study.get(cm)), _phi(row)])
    return _table(header, rows)


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def sglang_fcfs(results: Path, tables: Any) -> str:
    folder = results / "ablations" / "sglang-fcfs"
    t4 = [
        [
            r["condition"],
            r["metric"],
            f"{_float(r['first']):.3g}",
            f"{_float(r['second']):.3g}",
            f"{_float(r['change_pct']):+.1f}%",
            f"{_float(r['p']):.3g}",
        ]
        for r in _csv(folder / "table4.csv")
    ]
    return "\n\n".join(
        [
            "### sglang-fcfs\n\nTable 5, the study grid (SGLang lpm in both arms) beside the "
            "ablation (fcfs in the matched arm):",
            beside_study(tables, ("sglang-fcfs", "")),
            "Table 4 of the ablation: SGLang under lpm (defaults arm) and fcfs (matched arm), "
            "seconds, the change and its paired p:",
            _table(["condition", "metric", "lpm", "fcfs", "change", "p"], t4),
        ]
    )


def fluid(results: Path, ablation: str) -> list[list[str]]:
    numbers = json.loads((results / "ablations" / ablation / "numbers.json").read_text())
    by_condition = numbers["fluid_model"]["summary"]["by_condition"]
    return [
        [
            ablation,
            key,
            f"{v['n_eligible']:.0f}",
            f"{v['measured_gap']:.3g}",
            f"{v['predicted_gap']:.3g}",
            f"{v['predicted_gap'] / v['measured_gap']:.2f}",
        ]
        for key, v in sorted(by_condition.items())
    ]


def run_length(results: Path, tables: Any) -> str:
    rows = []
    for variant in ("300s", "600s", "1200s"):
        t5 = tables[("run-length", variant)]
        for cm in [("rate-0.28", "ttft_p50"), ("rate-0.40", "ttft_p50"), ("rate-0.28", "ttft_p95")]:
            row = t5.get(cm)
            rows.append([variant, f"{cm[0]}, {cm[1]}", _gap(row, "defaults"), _gap(row, "matched")])
    fluid_rows = []
    for variant in ("300s", "600s", "1200s"):
        fluid_rows += fluid(results, f"run-length/{variant}")
    return "\n\n".join(
        [
            "### run-length\n\nThe gap at each run length:",
            _table(["length", "condition, metric", "defaults", "matched"], rows),
            "The fluid model (§6.3, Eq. 8) on the eligible pairs (vLLM more than 1% behind, SGLang "
            "keeping pace): the median gap measured and predicted, and predicted ÷ measured:",
            _table(
                ["ablation", "arm/condition", "pairs", "measured", "predicted", "ratio"], fluid_rows
            ),
        ]
    )


def matched_memory(results: Path, tables: Any) -> str:
    record = json.loads((results / "ablations" / "matched-memory" / "ablation.json").read_text())
    derived = [
        [
            d["arm"],
            d["engine"],
            f"{d['flag']}={d['default_value']}",
            str(d["default_kv_capacity_tokens"]),
            f"{d['flag']}={d['value']}",
            str(d["kv_capacity_tokens"]),
        ]
        for d in record["derived"]
    ]
    return "\n\n".join(
        [
            "### matched-memory\n\nThe memory fractions derived from each engine's own rule:",
            _table(
                ["arm", "engine", "study flag", "study KV tokens", "derived flag", "KV tokens"],
                derived,
            ),
            beside_study(tables, ("matched-memory", "")),
        ]
    )


def gpus(results: Path, tables: Any) -> str:
    study = tables[("study", "")]
    header = ["condition, metric", "L4 (study grid)", "A100-40GB", "A100-80GB", "H100-80GB"]
    parts = ["### gpus"]
    for arm in ("defaults", "matched"):
        rows = []
        for cm in study:
            line = [f"{cm[0]}, {cm[1]}", _gap(study[cm], arm)]
            for variant in ("a100-40gb", "a100-80gb", "h100-80gb"):
                line.append(_gap(tables[("gpus", variant)].get(cm), arm))
            rows.append(line)
        parts += [f"The {arm} arm's gap on each GPU:", _table(header, rows)]
    return "\n\n".join(parts)


def matched_sharing(results: Path, tables: Any) -> str:
    rows = [
        [f"{cm[0]}, {cm[1]}", _gap(row, "defaults"), _gap(row, "matched"), _phi(row)]
        for cm, row in tables[("matched-sharing", "")].items()
    ]
    return "\n\n".join(
        [
            "### matched-sharing\n\nThe sharing sweep in both arms (the study grid ran it under "
            "defaults only; the defaults arm here is the study grid's own, the same runs):",
            _table(["condition, metric", "defaults", "matched", "φ"], rows),
        ]
    )


def topologies(results: Path, tables: Any) -> str:
    study = tables[("study", "")]
    variants = ("chain-2", "mix")
    header = ["condition, metric", "defaults: study", *(f"defaults: {v}" for v in variants)]
    header += ["matched: study", *(f"matched: {v}" for v in variants)]
    rows = []
    for cm in study:
        line = [f"{cm[0]}, {cm[1]}"]
        for arm in ("defaults", "matched"):
            line.append(_gap(study[cm], arm))
            line += [_gap(tables.get(("topologies", v), {}).get(cm), arm) for v in variants]
        rows.append(line)
    drawn = []
    for v in variants:
        for manifest in sorted(
            (results / "ablations" / "topologies" / v).glob("traces/*/*/manifest.json")
        ):
            m = json.loads(manifest.read_text())
            shapes = ", ".join(f"{s['name']} {s['graphs']}" for s in m["topologies"])
            drawn.append([v, m["condition"], m["rep"], f"{m['requests_per_graph']:g}", shapes])
    return "\n\n".join(
        [
            "### topologies\n\nTable 5, the study grid (fanout of 4) beside each topology:",
            _table(header, rows),
            "The graphs each trace drew (requests per graph, graphs per shape):",
            _table(["variant", "condition", "rep", "requests/graph", "graphs"], drawn),
        ]
    )


def real_trace(results: Path, tables: Any) -> str:
    folder = results / "ablations" / "real-trace"
    rows = [
        [f"{cm[0]}, {cm[1]}", _gap(row, "defaults"), _gap(row, "matched"), _phi(row)]
        for cm, row in tables[("real-trace", "")].items()
    ]
    replayed = []
    for manifest in sorted(folder.glob("traces/*/*/manifest.json")):
        m = json.loads(manifest.read_text())
        how = m["imported"]
        replayed.append(
            [
                m["condition"],
                m["rep"],
                str(m["n_requests"]),
                f"{m['n_requests'] / m['duration_s']:.3f}",
                f"{how['first_line']}-{how['last_line']}",
                f"{how['time_scale']:.3g}",
                f"{m['achieved_sharing']:.3f}",
                f"{how['prompt_tokens']['mean']:.0f}",
            ]
        )
    return "\n\n".join(
        [
            "### real-trace\n\nTable 5 of the replayed trace, both arms:",
            _table(["condition, metric", "defaults", "matched", "φ"], rows),
            "What each replay took from the trace (realised rate = requests ÷ duration):",
            _table(
                [
                    "condition",
                    "rep",
                    "requests",
                    "realised rps",
                    "lines",
                    "time scale",
                    "sharing",
                    "mean prompt",
                ],
                replayed,
            ),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("results"), help="results folder")
    args = parser.parse_args()
    tables = summary(args.results)
    sections = {
        "sglang-fcfs": sglang_fcfs,
        "matched-sharing": matched_sharing,
        "matched-memory": matched_memory,
        "run-length": run_length,
        "gpus": gpus,
        "topologies": topologies,
        "real-trace": real_trace,
    }
    built = {name for name, _ in tables}
    for name, section in sections.items():
        if name not in built:
            print(f"### {name}\n\nnot built: no results/ablations/{name}/ under {args.results}\n")
            continue
        print(section(args.results, tables))
        print()


if __name__ == "__main__":
    main()
