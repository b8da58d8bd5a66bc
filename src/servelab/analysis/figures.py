"""Figures 1 and 6-14 (PNG and PDF), drawn from `figdata` with one shared style.

Determinism: the Agg/PDF backends with a fixed font (DejaVu Sans, shipped with matplotlib), fixed
DPI and size, no timestamps (PDF CreationDate None, PNG without Software), `svg.hashsalt` fixed,
so `SOURCE_DATE_EPOCH` has nothing to set; two analyses of the same runs give byte-identical files.
Visual grammar (every figure): colour and marker shape identify the engine (vLLM blue circles,
SGLang orange squares); filled markers with solid (vLLM) or dashed (SGLang) lines are vendor
defaults, hollow markers with dotted lines are matched chunked prefill.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import (
    FixedLocator,
    FuncFormatter,
    LogLocator,
    MaxNLocator,
    NullFormatter,
    NullLocator,
)

from servelab.analysis import figdata, stats
from servelab.analysis.figdata import FORMATS
from servelab.analysis.restarts import RESTART_PHASES
from servelab.analysis.runs import engine_order
from servelab.artifacts import atomic_path
from servelab.engines.registry import engine_spec

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

__all__ = ["STYLE", "draw_figures"]

STYLE: dict[RcKeyType, Any] = {
    "font.family": "DejaVu Sans",
    "font.size": 9,
    "axes.titlesize": 9.5,
    "axes.labelsize": 9,
    "legend.fontsize": 7.5,
    "legend.frameon": False,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "axes.axisbelow": True,
    "grid.color": "#d9d9d9",
    "grid.linewidth": 0.5,
    "lines.linewidth": 1.3,
    "lines.markersize": 5.5,
    "errorbar.capsize": 2.5,
    "figure.dpi": 100,
    "savefig.dpi": 200,
    "figure.constrained_layout.use": True,
    "pdf.fonttype": 42,
    "ps.fonttype": 42,
    "svg.hashsalt": "servelab",
    "svg.fonttype": "none",
    "path.simplify": True,
}
PNG_METADATA: dict[str, str | None] = {"Software": None}
PDF_METADATA: dict[str, str | None] = {"CreationDate": None, "ModDate": None, "Creator": "servelab"}

# Engine styles in registry order (Okabe-Ito colours): the study's vLLM is blue circles with solid
# lines and SGLang orange squares with dashed lines; a registered engine takes the next style.
_ENGINE_STYLES = (
    {"color": "#0072B2", "marker": "o", "linestyle": "-"},
    {"color": "#D55E00", "marker": "s", "linestyle": "--"},
    {"color": "#009E73", "marker": "^", "linestyle": "-."},
    {"color": "#CC79A7", "marker": "D", "linestyle": (0, (5, 1, 1, 1))},
    {"color": "#56B4E9", "marker": "v", "linestyle": (0, (1, 1))},
)
ARM_LABEL = {"defaults": "", "matched": ", matched"}
ARMS = ("defaults", "matched")


def engine_style(engine: str) -> dict[str, Any]:
    """Colour, marker, line style and legend label of a registered engine."""
    order = engine_order()
    if engine not in order:
        raise ValueError(f"engine {engine!r} is not registered: expected one of {order}")
    style = dict(_ENGINE_STYLES[order.index(engine) % len(_ENGINE_STYLES)])
    style["label"] = engine_spec(engine).title
    return style


def _engine_label(engine: str) -> str:
    return engine_spec(engine).title if engine in engine_order() else engine


def _engine_rank(engine: str) -> int:
    order = engine_order()
    return order.index(engine) if engine in order else len(order)


PHASE_COLOURS = {
    "terminate": "#CC79A7",
    "schedule": "#F0E442",
    "image_pull": "#009E73",
    "unmeasured": "#BBBBBB",
    "initialise": "#56B4E9",
}
PHASE_LABELS = {
    "terminate": "terminate",
    "schedule": "schedule",
    "image_pull": "image pull",
    "unmeasured": "unmeasured gaps",
    "initialise": "initialise (probe-bounded)",
}
RATE_LABEL = "arrival rate (agent graphs s⁻¹)"


def _fin(x: Any) -> TypeGuard[float]:
    return isinstance(x, int | float) and math.isfinite(float(x))


def condition_label(condition: str) -> str:
    sweep, _, value = condition.partition("-")
    if sweep == "length":
        return f"{int(value):,} tokens"
    if sweep == "sharing":
        return f"σ {value}"
    return f"rate {value}"


def metric_label(metric: str) -> str:
    return {
        "ttft_p50": "TTFT p50",
        "ttft_p95": "TTFT p95",
        "tpot_p50": "TPOT p50",
        "e2e_p50": "E2E p50",
        "throughput": "capacity",
    }[metric]


def _series_style(key: str) -> dict[str, Any]:
    arm, engine = key.split("/")
    es = engine_style(engine)
    matched = arm == "matched"
    return {
        "color": es["color"],
        "marker": es["marker"],
        "linestyle": ":" if matched else es["linestyle"],
        "markerfacecolor": "white" if matched else es["color"],
        "markeredgecolor": es["color"],
        "label": es["label"] + ARM_LABEL[arm],
    }


def _ordered(series: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """Series items in the fixed legend order: defaults before matched, vLLM before SGLang."""

    def key(item: tuple[str, Any]) -> tuple[int, int, str]:
        arm, _, engine = item[0].partition("/")
        return (
            ARMS.index(arm) if arm in ARMS else 9,
            _engine_rank(engine),
            item[0],
        )

    return sorted(series.items(), key=key)


def _draw_series(
    ax: Axes,
    key: str,
    points: Sequence[Mapping[str, Any]],
    y: str,
    *,
    scale: float = 1.0,
    x: str = "x",
    errors: bool = True,
) -> bool:
    """Draw one series with its intervals; an interval wider than a factor TOO_WIDE is left out.
    Returns whether one was."""
    pts = [p for p in points if _fin(p.get(y)) and _fin(p.get(x))]
    if not pts:
        return False
    xs = np.array([p[x] for p in pts], dtype=float)
    ys = np.array([p[y] for p in pts], dtype=float) * scale
    style = _series_style(key)
    yerr = None
    wide = False
    if errors and all(_fin(p.get("ci_low")) and _fin(p.get("ci_high")) for p in pts):
        lo = np.array([p["ci_low"] for p in pts], dtype=float) * scale
        hi = np.array([p["ci_high"] for p in pts], dtype=float) * scale
        shown = np.array([not _too_wide(p) for p in pts])
        wide = not shown.all()
        yerr = np.vstack(
            [np.where(shown, np.maximum(ys - lo, 0), 0), np.where(shown, np.maximum(hi - ys, 0), 0)]
        )
    ax.errorbar(xs, ys, yerr=yerr, elinewidth=0.8, **style)
    return wide


def _placeholder(ax: Axes, message: str) -> None:
    ax.set_axis_off()
    ax.text(
        0.5,
        0.5,
        message,
        ha="center",
        va="center",
        wrap=True,
        fontsize=9,
        color="#444444",
        transform=ax.transAxes,
    )


def _log_axis(ax: Axes, axis: str = "y") -> None:
    """Log scale with plain-number labels; tick density follows the span of the current limits.

    Call after the data (and any explicit limits) are set.
    """
    (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
    lo, hi = ax.get_ylim() if axis == "y" else ax.get_xlim()
    span = math.log10(hi / lo) if lo > 0 and hi > lo else 3.0
    target = ax.yaxis if axis == "y" else ax.xaxis
    if span < 0.6:  # less than a factor of 4: evenly spaced plain values read best
        ticks = MaxNLocator(nbins=4, steps=[1, 2, 2.5, 5, 10]).tick_values(lo, hi)
        target.set_major_locator(FixedLocator([t for t in ticks if t > 0]))
    else:
        if span <= 1.0:
            subs: tuple[float, ...] = (1.0, 1.5, 2.0, 3.0, 5.0, 7.0)
        elif span <= 2.6:
            subs = (1.0, 2.0, 5.0)
        elif span <= 4.0:
            subs = (1.0, 3.0)
        else:
            subs = (1.0,)
        target.set_major_locator(LogLocator(base=10.0, subs=subs))
    target.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    # No minor ticks: the labelled majors (1-2-5 or finer) carry the scale, and every tick costs
    # text layout in constrained layout (about a fifth of the drawing time).
    target.set_minor_locator(NullLocator())
    target.set_minor_formatter(NullFormatter())


def _legend(ax: Axes, **kw: Any) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, **kw)


def _stars(
    ax: Axes, xs: Sequence[float], ys: Sequence[float], sig: Sequence[bool], factor: float = 1.25
) -> None:
    for x, y, s in zip(xs, ys, sig, strict=True):
        if s and _fin(y):
            ax.annotate("*", (x, y * factor), ha="center", va="bottom", fontsize=11)


def _star_rule(data: Mapping[str, Any]) -> str:
    """What a star means: the test's own p (the study's), or its Holm-adjusted p when the
    campaign's `analysis.multiplicity` is holm (the figure's data then names the rule)."""
    if data.get("multiplicity") == "holm":
        return "* Holm-adjusted paired p < 0.05"
    return "* paired p < 0.05"


# --------------------------------------------------------------------------- the figures


def _figure1_values(row: Mapping[str, Any]) -> str:
    def gap(part: Mapping[str, Any]) -> str:
        if not _fin(part["gap"]):
            return "—"
        return f"{part['gap']:.2f}" + ("*" if part["significant"] else "")

    phi = f"{100 * row['removed_fraction']:.0f}%" if _fin(row["removed_fraction"]) else "—"
    return f"{gap(row['defaults'])} → {gap(row['matched'])}; {phi}"


# An interval whose ends are further apart than this factor says nothing a reader can see on the
# axis (with n = 2 the t quantile is 12.7): it is left out of the figure, and the figure says so.
TOO_WIDE = 100.0


def _too_wide(part: Mapping[str, Any]) -> bool:
    lo, hi = part.get("ci_low"), part.get("ci_high")
    return _fin(lo) and _fin(hi) and lo > 0 and hi / lo > TOO_WIDE


def _figure1_axis(
    ax: Axes, rows: Sequence[Mapping[str, Any]], parts: Sequence[tuple[str, bool, float]]
) -> tuple[np.ndarray, bool]:
    """Each row's values (filled or open markers, offset by dy) with their intervals on a log x
    axis around 1; returns the rows' y positions and whether an interval was too wide to draw."""
    ys = np.arange(len(rows))[::-1].astype(float)
    values, wide = [], False
    for y, row in zip(ys, rows, strict=True):
        for name, filled, dy in parts:
            part = row[name]
            if not _fin(part["gap"]):
                continue
            ends = [v for v in (part["ci_low"], part["ci_high"]) if _fin(v) and v > 0]
            values.append(part["gap"])
            if len(ends) == 2 and _too_wide(part):
                wide = True
            elif len(ends) == 2:
                values += ends
                ax.plot(ends, [y + dy, y + dy], color="#777777", lw=0.9, solid_capstyle="butt")
            ax.plot(
                part["gap"],
                y + dy,
                marker="o",
                ms=6.5,
                color="#222222",
                markerfacecolor="#222222" if filled else "white",
                linestyle="none",
            )
    ax.axvline(1.0, color="#888888", lw=0.8, zorder=0)
    lo, hi = min([*values, 0.8]), max([*values, 1.25])
    ax.set_xscale("log")
    ax.set_xlim(lo / 1.5, hi * 1.5)
    _log_axis(ax, "x")
    ax.set_yticks(ys)
    ax.set_yticklabels(
        [f"{condition_label(r['condition'])}, {metric_label(r['metric'])}" for r in rows]
    )
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.grid(axis="y", visible=False)
    return ys, wide


def _wide_note(ax: Axes) -> None:
    ax.text(
        0.01,
        0.01,
        f"an interval wider than a factor {TOO_WIDE:g} is not drawn (too few repetitions)",
        transform=ax.transAxes,
        fontsize=7,
        color="#444444",
    )


def draw_figure1(fig: Figure, data: Mapping[str, Any]) -> None:
    rows = data["rows"]
    ax = fig.add_subplot(1, 1, 1)
    if data.get("mode") == "arm_effect":
        if not any(_fin(r["change"]["gap"]) for r in rows):
            _placeholder(ax, "Figure 1: no repetition of the engine measured in both arms")
            return
        ys, wide = _figure1_axis(ax, rows, (("change", True, 0.0),))
        engine = _engine_label(data["engines"][0])
        ax.set_xlabel(f"{engine}: matched ÷ vendor defaults (latency; capacity the same way)")
        sec = ax.secondary_yaxis("right")
        sec.set_yticks(ys)
        sec.set_yticklabels(
            [
                f"{r['change']['gap']:.2f}" + ("*" if r["change"]["significant"] else "")
                if _fin(r["change"]["gap"])
                else "—"
                for r in rows
            ]
        )
        sec.set_ylabel("matched ÷ defaults")
        sec.tick_params(length=0)
        if wide:
            _wide_note(ax)
        ax.set_title(f"The arm effect on one engine ({_star_rule(data)})", loc="left")
        return
    if not any(_fin(r["defaults"]["gap"]) or _fin(r["matched"]["gap"]) for r in rows):
        _placeholder(ax, "Figure 1: no seed-paired runs for the conditions of Table 5")
        return
    ys, wide = _figure1_axis(ax, rows, (("defaults", True, 0.15), ("matched", False, -0.15)))
    first, second = (_engine_label(e) for e in data.get("engines", ("vllm", "sglang")))
    ax.set_xlabel(f"engine gap ({first} ÷ {second} for latency; {second} ÷ {first} for capacity)")
    sec = ax.secondary_yaxis("right")
    sec.set_yticks(ys)
    sec.set_yticklabels([_figure1_values(r) for r in rows])
    sec.set_ylabel("defaults → matched; removed φ")
    sec.tick_params(length=0)
    ax.plot([], [], "o", color="#222222", label="vendor defaults")
    ax.plot([], [], "o", color="#222222", markerfacecolor="white", label="matched chunked prefill")
    _legend(ax, loc="lower right")
    if wide:
        _wide_note(ax)
    ax.set_title(f"One setting accounts for most of the gap ({_star_rule(data)})", loc="left")


def draw_figure6(fig: Figure, data: Mapping[str, Any]) -> None:
    axes = fig.subplots(1, 2)
    for ax, metric in zip(axes, ("ttft_p50", "ttft_p95"), strict=True):
        series = data[metric]
        if not series:
            _placeholder(ax, "no rate-sweep runs")
            continue
        for key, pts in _ordered(series):
            _draw_series(ax, key, pts, "gmean")
        _log_axis(ax)
        ax.set_xlabel(RATE_LABEL)
        ax.set_ylabel(f"{metric_label(metric)} (s)")
    _legend(axes[0], loc="upper left")
    fig.suptitle(
        "TTFT against arrival rate (σ 0.9, 4,096-token prompts); bars: 95% CI", fontsize=9.5
    )


def draw_figure7(fig: Figure, data: Mapping[str, Any]) -> None:
    left, right = fig.subplots(1, 2)
    if data["tpot_p50"]:
        wide = False
        for key, pts in _ordered(data["tpot_p50"]):
            wide |= _draw_series(left, key, pts, "gmean", scale=1000.0)
        _log_axis(left)  # a time per token: ratio-scale data
        left.set_xlabel(RATE_LABEL)
        left.set_ylabel("TPOT p50 (ms)")
        _legend(left, loc="lower right")
        if wide:
            _wide_note(left)
    else:
        _placeholder(left, "no rate-sweep runs")
    if data["throughput"]:
        top = 0.0
        for key, pts in _ordered(data["throughput"]):
            _draw_series(right, key, pts, "gmean", x="offered")
            top = max(
                [top] + [p["offered"] for p in pts] + [p["gmean"] for p in pts if _fin(p["gmean"])]
            )
        top *= 1.1
        right.plot([0, top], [0, top], color="#888888", lw=0.8, label="achieved = offered")
        right.plot(
            [0, top],
            [0, data["keeps_pace"] * top],
            color="#888888",
            lw=0.6,
            ls=(0, (1, 2)),
            label=f"keeps pace ({data['keeps_pace']:.2f} × offered)",
        )
        right.set_xlim(0, top)
        right.set_ylim(0, top)
        right.set_aspect("equal")
        right.set_xlabel("offered load (req s⁻¹)")
        right.set_ylabel("achieved throughput (req s⁻¹)")
        _legend(right, loc="upper left")
    else:
        _placeholder(right, "no rate-sweep runs")
    fig.suptitle("Decode speed and capacity (geometric means over repetitions)", fontsize=9.5)


def draw_figure8(fig: Figure, data: Mapping[str, Any]) -> None:
    a, b = fig.subplots(1, 2)
    runs = data["eligible_runs"]
    if runs:
        groups = sorted({(r["condition"], r["arm"]) for r in runs})
        markers = ["o", "s", "^", "D", "v", "P", "X"]
        colours = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000"]
        vals = []
        for i, (cond, arm) in enumerate(groups):
            mine = [r for r in runs if (r["condition"], r["arm"]) == (cond, arm)]
            xs = [r["predicted_vllm_p50"] for r in mine]
            ys = [r["vllm_p50"] for r in mine]
            vals += xs + ys
            hollow = arm == "matched"
            a.plot(
                xs,
                ys,
                linestyle="none",
                marker=markers[i % 7],
                color=colours[i % 7],
                markerfacecolor="white" if hollow else colours[i % 7],
                label=f"{condition_label(cond)}, {arm}",
            )
        lo, hi = min(vals) / 1.5, max(vals) * 1.5
        a.plot([lo, hi], [lo, hi], color="#888888", lw=0.8, label="measured = predicted")
        a.set_xscale("log")
        a.set_yscale("log")
        a.set_xlim(lo, hi)
        a.set_ylim(lo, hi)
        _log_axis(a)
        _log_axis(a, "x")
        a.set_aspect("equal")
        a.set_xlabel("predicted vLLM TTFT p50 (s)")
        a.set_ylabel("measured vLLM TTFT p50 (s)")
        r_text = f"r (log) = {data['r_log']:.2f}" if _fin(data["r_log"]) else "r: fewer than 3 runs"
        a.set_title(f"(a) model against measurement; {r_text}", loc="left", fontsize=8.5)
        _legend(a, loc="upper left")
    else:
        _placeholder(a, "(a) no run where vLLM falls more than 1% behind\nwhile SGLang keeps pace")
    ref = data["reference"]
    if data["curves"]:
        base = float(ref["baseline_p50_s"])
        for curve, ls in zip(data["curves"], ("--", "-", ":"), strict=False):
            delta = np.linspace(0.0, curve["delta_max"], 201)
            gap = [stats.fluid_predicted_gap(d, curve["run_length_s"], base) for d in delta]
            b.plot(
                100 * delta,
                gap,
                color="#333333",
                ls=ls,
                label=f"run of {curve['run_length_s']:.0f} s",
            )
        if _fin(ref["measured_delta"]) and _fin(ref["measured_gap"]):
            b.plot(
                100 * ref["measured_delta"],
                ref["measured_gap"],
                "o",
                color="#0072B2",
                markerfacecolor="white",
                ms=7,
                label=f"measured, {ref['arm']} {condition_label(ref['condition'])}",
            )
        b.set_xlim(0, 100 * data["curves"][0]["delta_max"])
        _log_axis(b)
        b.set_xlabel("vLLM throughput shortfall δ (%)")
        b.set_ylabel("TTFT p50, vLLM ÷ SGLang")
        b.set_title(f"(b) predicted gap, baseline {base:.2f} s", loc="left", fontsize=8.5)
        _legend(b, loc="lower right")
    else:
        _placeholder(b, f"(b) no runs of {ref['arm']} {ref['condition']} with a trace manifest")
    fig.suptitle("Fluid queue model (Eq. 8)", fontsize=9.5)


def draw_figure9(fig: Figure, data: Mapping[str, Any]) -> None:
    left, right = fig.subplots(1, 2)
    if data["ttft_p50"]:
        for key, pts in _ordered(data["ttft_p50"]):
            _draw_series(left, key, pts, "gmean")
        _log_axis(left)
        left.set_xlabel("prefix sharing ratio σ")
        left.set_ylabel("TTFT p50 (s)")
        _legend(left, loc="best")
    else:
        _placeholder(left, "no sharing-sweep runs")
    pts = [p for p in data["gap"] if _fin(p["gap"])]
    if pts:
        xs = [p["x"] for p in pts]
        ys = [p["gap"] for p in pts]
        lo = [p["gap"] - p["ci_low"] if _fin(p["ci_low"]) else 0 for p in pts]
        hi = [p["ci_high"] - p["gap"] if _fin(p["ci_high"]) else 0 for p in pts]
        right.errorbar(
            xs, ys, yerr=[lo, hi], color="#333333", marker="o", linestyle="-", elinewidth=0.8
        )
        right.axhline(1.0, color="#888888", lw=0.8)
        _log_axis(right)
        _stars(
            right,
            xs,
            [p["ci_high"] if _fin(p["ci_high"]) else p["gap"] for p in pts],
            [p["significant"] for p in pts],
            1.05,
        )
        right.set_xlabel("prefix sharing ratio σ")
        right.set_ylabel("TTFT p50, vLLM ÷ SGLang")
    else:
        _placeholder(right, "no seed-paired sharing-sweep runs")
    fig.suptitle(
        f"Sensitivity to prefix sharing (vendor defaults); {_star_rule(data)}", fontsize=9.5
    )


def draw_figure10(fig: Figure, data: Mapping[str, Any]) -> None:
    ax = fig.add_subplot(1, 1, 1)
    series = data["kv_peak"]
    if not series or not any(_fin(p["mean"]) for pts in series.values() for p in pts):
        _placeholder(ax, "no sharing-sweep runs with kv_cache_usage telemetry")
        return
    for key, pts in _ordered(series):
        style = _series_style(key)
        good = [p for p in pts if _fin(p["mean"])]
        ax.plot([p["x"] for p in good], [p["mean"] for p in good], **style)
        for p in good:
            ax.plot(
                [p["x"]] * len(p["reps"]),
                p["reps"],
                linestyle="none",
                marker=style["marker"],
                ms=2.5,
                color=style["color"],
                alpha=0.5,
            )
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("prefix sharing ratio σ")
    ax.set_ylabel("peak KV-cache utilisation")
    ax.set_title(
        "Vendor defaults; lines: mean of repetitions, dots: runs", loc="left", fontsize=8.5
    )
    _legend(ax, loc="upper right")


def draw_figure11(fig: Figure, data: Mapping[str, Any]) -> None:
    panels = data["panels"]
    axes = fig.subplots(1, len(panels), sharey=True)
    for ax, panel in zip(np.atleast_1d(axes), panels, strict=True):
        ax.set_title(condition_label(panel["condition"]), loc="left", fontsize=9)
        series = {k: v for k, v in panel["series"].items() if v["quantiles"]}
        if not series:
            _placeholder(ax, f"no runs at {condition_label(panel['condition'])}")
            continue
        for key, s in _ordered(series):
            style = _series_style(key)
            q = np.asarray(s["quantiles"])
            y = np.linspace(0.0, 1.0, q.size)
            ax.plot(q, y, color=style["color"], linestyle=style["linestyle"], label=style["label"])
            ax.plot(
                [s["p95"]],
                [0.95],
                marker=style["marker"],
                color=style["color"],
                markerfacecolor=style["markerfacecolor"],
                linestyle="none",
            )
        ax.axhline(0.95, color="#aaaaaa", lw=0.6, ls=(0, (2, 2)))
        ax.text(0.02, 0.955, "p95", transform=ax.get_yaxis_transform(), fontsize=7, va="bottom")
        _log_axis(ax, "x")
        ax.set_xlabel("TTFT (s)")
        ax.set_ylim(0, 1.0)
    first = np.atleast_1d(axes)[0]
    first.set_ylabel("fraction of requests")
    handles, labels = {}, []
    for ax in np.atleast_1d(axes):
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in handles:
                handles[lab] = h
                labels.append(lab)
    if labels:
        fig.legend(
            [handles[lab] for lab in labels], labels, loc="outside lower center", ncol=len(labels)
        )
    fig.suptitle(
        "Empirical distribution of TTFT, pooled over repetitions (markers: p95)", fontsize=9.5
    )


def draw_figure12(fig: Figure, data: Mapping[str, Any]) -> None:
    a, b = fig.subplots(1, 2)
    if data["tail_ratio"]:
        for key, pts in _ordered(data["tail_ratio"]):
            _draw_series(a, key, pts, "tail_ratio", errors=False)
        _log_axis(a)
        a.set_xlabel(RATE_LABEL)
        a.set_ylabel("TTFT p95 ÷ p50 (pooled requests)")
        a.set_title("(a) tail ratio", loc="left", fontsize=8.5)
        _legend(a, loc="best")
    else:
        _placeholder(a, "no rate-sweep runs")
    if data["sd_ln_p50"]:
        for key, pts in _ordered(data["sd_ln_p50"]):
            _draw_series(b, key, pts, "sd_ln_p50", errors=False)
        b.set_ylim(bottom=0)
        b.set_xlabel(RATE_LABEL)
        b.set_ylabel("sd of ln TTFT p50 across repetitions")
        b.set_title("(b) spread of the run median", loc="left", fontsize=8.5)
    else:
        _placeholder(b, "no rate-sweep runs")
    fig.suptitle("Variability against arrival rate", fontsize=9.5)


def draw_figure13(fig: Figure, data: Mapping[str, Any]) -> None:
    ax = fig.add_subplot(1, 1, 1)
    drew = False
    for metric, colour, marker, dx in (
        ("ttft_p50", "#333333", "o", -0.004),
        ("ttft_p95", "#E69F00", "D", 0.004),
    ):
        pts = [p for p in data[metric] if _fin(p["gap"])]
        if not pts:
            continue
        drew = True
        xs = [p["x"] + dx for p in pts]
        ys = [p["gap"] for p in pts]
        lo = [p["gap"] - p["ci_low"] if _fin(p["ci_low"]) else 0 for p in pts]
        hi = [p["ci_high"] - p["gap"] if _fin(p["ci_high"]) else 0 for p in pts]
        label = "median (p50)" if metric == "ttft_p50" else "tail (p95)"
        ax.errorbar(xs, ys, yerr=[lo, hi], color=colour, marker=marker, label=label, elinewidth=0.8)
        _stars(
            ax,
            xs,
            [p["ci_high"] if _fin(p["ci_high"]) else p["gap"] for p in pts],
            [p["significant"] for p in pts],
            1.05,
        )
    if not drew:
        _placeholder(ax, "no seed-paired rate-sweep runs under vendor defaults")
        return
    ax.axhline(1.0, color="#888888", lw=0.8)
    _log_axis(ax)
    ax.set_xlabel(RATE_LABEL)
    ax.set_ylabel("TTFT, vLLM ÷ SGLang")
    ax.set_title(
        f"Paired engine gap across the rate sweep (vendor defaults); {_star_rule(data)}",
        loc="left",
        fontsize=8.5,
    )
    _legend(ax, loc="upper left")


def draw_figure14(fig: Figure, data: Mapping[str, Any]) -> None:
    ax = fig.add_subplot(1, 1, 1)
    engines = data["engines"]
    if not engines:
        _placeholder(
            ax,
            "Figure 14: no restart records.\nNo results/restarts/{engine}/{rep}/restart.json was found,\n"
            "so the restart time by phase is not drawn.",
        )
        return
    names = sorted(engines, key=lambda n: (_engine_rank(n), n))
    ys = np.arange(len(names))[::-1]
    right = 0.0
    for y, name in zip(ys, names, strict=True):
        e = engines[name]
        left = 0.0
        for phase in RESTART_PHASES:
            w = float(e["phase_mean_s"][phase])
            ax.barh(
                y,
                w,
                left=left,
                color=PHASE_COLOURS[phase],
                edgecolor="white",
                height=0.55,
                label=PHASE_LABELS[phase] if y == ys[0] else None,
            )
            left += w
        right = max(right, left)
        ax.text(
            left + 2,
            y,
            f"{e['total_mean_s']:.0f} s ({e['total_min_s']:.0f}–{e['total_max_s']:.0f})",
            va="center",
            fontsize=8,
        )
    ax.set_yticks(ys)
    ax.set_yticklabels([_engine_label(n) for n in names])
    ax.set_xlim(0, right * 1.3 + 1)
    ax.grid(axis="y", visible=False)
    counts = sorted({int(e["n"]) for e in engines.values()})
    per = f"mean of {counts[0]} restarts" if len(counts) == 1 else "mean of the restarts"
    ax.set_xlabel(f"seconds from pod deletion to readiness ({per} per engine)")
    ax.set_title("Restart time by phase; totals: mean (range)", loc="left", fontsize=8.5)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=3)


DRAW: dict[str, tuple[Callable[[Figure, Mapping[str, Any]], None], tuple[float, float]]] = {
    "figure1": (draw_figure1, (7.0, 3.6)),
    "figure6": (draw_figure6, (7.0, 3.0)),
    "figure7": (draw_figure7, (7.0, 3.2)),
    "figure8": (draw_figure8, (7.0, 3.4)),
    "figure9": (draw_figure9, (7.0, 3.0)),
    "figure10": (draw_figure10, (4.6, 3.0)),
    "figure11": (draw_figure11, (7.0, 2.8)),
    "figure12": (draw_figure12, (7.0, 3.0)),
    "figure13": (draw_figure13, (5.6, 3.2)),
    "figure14": (draw_figure14, (6.4, 2.4)),
}


def save_figure(fig: Figure, path: Path, fmt: str) -> None:
    """Write `fig` atomically in `fmt` with fixed metadata."""
    with atomic_path(path) as tmp:
        if fmt == "png":
            fig.savefig(tmp, format="png", metadata=PNG_METADATA)
        elif fmt == "pdf":
            fig.savefig(tmp, format="pdf", metadata=PDF_METADATA)
        else:
            raise ValueError(f"unsupported figure format {fmt!r}")


def draw_figures(
    data: Mapping[str, Mapping[str, Any]],
    out_dir: str | os.PathLike[str],
    formats: Sequence[str] = FORMATS,
) -> list[Path]:
    """Draw each figure of `data` (from `figdata.figure_data`) into `out_dir` as `{name}.{fmt}`."""
    out = Path(out_dir)
    written: list[Path] = []
    with plt.rc_context(STYLE):
        for name in figdata.FIGURES:
            if name not in data:
                continue
            draw, size = DRAW[name]
            fig = plt.figure(figsize=size)
            try:
                draw(fig, data[name])
                for i, fmt in enumerate(formats):
                    path = out / f"{name}.{fmt}"
                    save_figure(fig, path, fmt)
                    written.append(path)
                    if i == 0:
                        # Keep the layout of the first format for the others (and skip re-solving it).
                        fig.set_layout_engine("none")
            finally:
                plt.close(fig)
    return written
