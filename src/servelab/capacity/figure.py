"""The capacity figure: every probe of every search against its rate, passed or failed, one row
per engine, arms side by side, with the final bracket shaded (results/figures/capacity.png)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from servelab.artifacts import atomic_path
from servelab.capacity.method import bracket_of

__all__ = ["draw_capacity"]


def draw_capacity(states: Sequence[Mapping[str, Any]], out_png: str | Path) -> Path:
    """Draw the probes of `states` (final search states) into `out_png` (PNG, deterministic)."""
    engines = list(dict.fromkeys(s["engine"] for s in states))
    arms = list(dict.fromkeys(s["arm"] for s in states))
    fig, axes = plt.subplots(
        len(engines), len(arms), figsize=(4.2 * len(arms), 1.6 + 1.2 * len(engines)), squeeze=False
    )
    for state in states:
        ax = axes[engines.index(state["engine"])][arms.index(state["arm"])]
        probes = [p for p in state["probes"] if not p.get("saturation")]
        for order, probe in enumerate(probes, start=1):
            ok = bool(probe["passed"])
            ax.plot(
                probe["rate"],
                0,
                marker="o" if ok else "x",
                color="#009E73" if ok else "#D55E00",
                markersize=7,
                linestyle="none",
            )
            ax.annotate(
                str(order),
                (probe["rate"], 0),
                textcoords="offset points",
                xytext=(0, 6),
                ha="center",
                fontsize=7,
            )
        low, high = bracket_of(state)
        if low is not None and high is not None:
            ax.axvspan(low, high, color="#cccccc", alpha=0.6, lw=0)
        ax.set_xscale("log")
        ax.set_yticks([])
        ax.set_title(f"{state['engine']}, {state['arm']} ({state['shape']})", fontsize=9)
        ax.set_xlabel("arrival rate (agent graphs/s); o pass, x fail, n = probe order", fontsize=8)
    fig.tight_layout()
    out = Path(out_png)
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=120, metadata={"Software": None})
    plt.close(fig)
    return out
