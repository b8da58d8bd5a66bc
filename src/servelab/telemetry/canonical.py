"""Raw engine-metric samples -> the canonical telemetry table (docs/architecture.md, "Artifacts").

Every backend records the same raw form (`scrape.parquet`: the engine's own metric names over the
run's window), so one mapping and one coverage check serve the simulator and Prometheus alike.

Beside the engine's series, scrape.parquet may hold the GPU's: DCGM's energy counter and power
gauge (`GPU_METRIC_MAP`), which only the kubernetes backend pulls. They map to `gpu_energy_mj` and
`gpu_power_w` when they cover the whole window; a GPU series that is absent or covers only part
of an ok run's window is left out (logged), never an error and never filled in: the energy
figures computed from it are then null rather than an undercount.

**The closing samples.** Every backend's window runs on past the run's end to a closing time whose
scrape saw the finished run (servelab.telemetry.prometheus.closing_unix_s; the simulator's first
telemetry time at or after the end), because what an engine counts in its last step would
otherwise be lost. The canonical table keeps those samples for the counts of events (the
`*_total` counters: nothing the run asked for happens after its last token), drops them for the
gauges (a gauge past the end describes an idle engine, not the run), and ends the energy counter
at the window's end, interpolated between the samples around it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from servelab.artifacts import (
    GPU_TELEMETRY_METRICS,
    SCRAPE_SCHEMA,
    TELEMETRY_SCHEMA,
    ArtifactError,
    read_parquet,
    read_run_json,
    write_parquet,
)
from servelab.engines.metrics import METRIC_LAZY, METRIC_MAP

__all__ = ["GPU_METRIC_MAP", "TelemetryWindowError", "canonicalize", "canonicalize_files"]

log = logging.getLogger(__name__)

# Canonical name -> the GPU series dcgm-exporter serves (NVIDIA DCGM fields 156, "total energy
# consumption for the GPU in mJ since the driver was last reloaded", a counter; and 155, "power
# usage for the device in Watts", a gauge: dcgm_fields.h; both in dcgm-exporter's
# etc/default-counters.csv and in GKE's managed DCGM). One GPU per run: the engine's.
GPU_METRIC_MAP = dict(
    zip(
        GPU_TELEMETRY_METRICS,
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_POWER_USAGE"),
        strict=True,
    )
)


# Samples this close past the window's end are the end's own (times are rounded to 1 µs).
_END_SLACK_S = 1e-6
# The one counter of a continuous quantity (mJ): its increase is cut at the window's end.
ENERGY_COUNTER = "gpu_energy_mj"


class TelemetryWindowError(ArtifactError):
    """The run's metric window is missing or only partly covered."""


def canonicalize(
    scrape: pa.Table,
    *,
    engine: str,
    run_id: str,
    duration_s: float,
    step_s: float,
    what: str,
    require_full_window: bool = True,
) -> pa.Table:
    """Map `scrape` to canonical metric names, checking each series covers the whole window.

    A run that did not complete (`require_full_window=False`) keeps what its window holds.
    """
    if engine not in METRIC_MAP:
        raise ValueError(f"unknown engine {engine!r}")
    sources = scrape.column("source_metric")
    lazy = METRIC_LAZY[engine]
    columns: dict[str, list[Any]] = {name: [] for name in TELEMETRY_SCHEMA.names}
    # a canonical metric the engine does not export is absent from its map (docs/engines.md)
    for canonical, source in sorted(METRIC_MAP[engine].items()):
        times, values = _series(scrape, sources, source)
        if source in lazy:  # exists only from its first event: absent or partial, never a gap
            pass
        elif require_full_window:
            problem = _coverage_problem(times, duration_s=duration_s, step_s=step_s, series=source)
            if problem:
                raise TelemetryWindowError(f"{what}: {problem}")
        times, values = _in_window(canonical, times, values, duration_s)
        _append(columns, run_id, canonical, source, times, values)
    # the GPU's series (kubernetes backend only): kept whole or not at all (module docstring)
    for canonical, source in sorted(GPU_METRIC_MAP.items()):
        times, values = _series(scrape, sources, source)
        if times.size == 0:
            continue
        if require_full_window:
            problem = _coverage_problem(times, duration_s=duration_s, step_s=step_s, series=source)
            if problem:
                log.warning(
                    "%s: %s; left out of the telemetry (its figures are null)", what, problem
                )
                continue
        times, values = _in_window(canonical, times, values, duration_s)
        _append(columns, run_id, canonical, source, times, values)
    return pa.table(columns, schema=TELEMETRY_SCHEMA)


def _in_window(
    canonical: str, times: np.ndarray, values: np.ndarray, duration_s: float
) -> tuple[np.ndarray, np.ndarray]:
    """A series' samples of the run's window (module docstring, "The closing samples"): a count
    of events keeps the samples past the end, a gauge loses them, and the energy counter ends
    at the window's end, interpolated between the samples around it."""
    if canonical.endswith("_total"):
        return times, values
    order = np.argsort(times, kind="stable")
    times, values = times[order], values[order]
    inside = int(np.searchsorted(times, duration_s + _END_SLACK_S, side="right"))
    if canonical != ENERGY_COUNTER or inside in (0, times.size):
        return times[:inside], values[:inside]
    last = inside - 1
    t0, v0, t1, v1 = times[last], values[last], times[inside], values[inside]
    if t0 >= duration_s or v1 < v0:  # on the end already, or a reset: no interpolation
        return times[: last + 1], values[: last + 1]
    at_end = v0 + (v1 - v0) * (duration_s - t0) / (t1 - t0)
    return np.append(times[: last + 1], duration_s), np.append(values[: last + 1], at_end)


def _series(
    scrape: pa.Table, sources: pa.ChunkedArray, source: str
) -> tuple[np.ndarray, np.ndarray]:
    """(times, values) of one raw series, in the table's order."""
    rows = scrape.filter(pc.equal(sources, source))
    times = np.asarray(rows.column("t_s").to_numpy(), dtype=float)
    values = np.asarray(rows.column("value").to_numpy(), dtype=float)
    return times, values


def _append(
    columns: dict[str, list[Any]],
    run_id: str,
    canonical: str,
    source: str,
    times: np.ndarray,
    values: np.ndarray,
) -> None:
    """One series' rows, in time order, under its canonical name."""
    order = np.argsort(times, kind="stable")
    columns["run_id"].extend([run_id] * len(order))
    columns["t_s"].extend(times[order].tolist())
    columns["metric"].extend([canonical] * len(order))
    columns["value"].extend(values[order].tolist())
    columns["source_metric"].extend([source] * len(order))


def _coverage_problem(
    times: np.ndarray, *, duration_s: float, step_s: float, series: str
) -> str | None:
    """Why `times` do not cover the window [0, duration_s] (None when they do)."""
    if times.size == 0:
        return f"no samples of {series} in the run's window"
    times = np.sort(times)
    # Allow one missed scrape at either end and between samples; more is a partial window.
    slack = 2 * step_s + 1e-9
    if times[0] > slack or times[-1] < duration_s - slack:
        return f"{series} covers {times[0]:.1f}-{times[-1]:.1f} s of a {duration_s:.1f} s window"
    if times.size > 1 and float(np.max(np.diff(times))) > slack:
        gap = int(np.argmax(np.diff(times)))
        return f"{series} has a gap from {times[gap]:.1f} s to {times[gap + 1]:.1f} s"
    return None


def canonicalize_files(
    *, engine: str, step_s: float, scrape_path: str, run_json_path: str, telemetry_path: str
) -> None:
    run = read_run_json(run_json_path)
    scrape = read_parquet(scrape_path, SCRAPE_SCHEMA)
    duration = float(run["end_unix_s"]) - float(run["start_unix_s"])
    table = canonicalize(
        scrape,
        engine=engine,
        run_id=run["run_id"],
        duration_s=duration,
        step_s=step_s,
        what=str(Path(scrape_path)),
        require_full_window=run["status"] == "ok",
    )
    write_parquet(telemetry_path, table, TELEMETRY_SCHEMA)
    log.info(
        "%s: %d samples of %d series",
        telemetry_path,
        table.num_rows,
        len(set(table["metric"].to_pylist())),
    )
