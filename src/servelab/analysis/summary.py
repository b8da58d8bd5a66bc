"""The analysis proper: per-condition summaries, paired engine gaps, table rows, the fluid model.

`Analysis` wraps a `RunSet` and computes everything the tables, figures and numbers.json show,
so each output is a formatting of the same numbers. Missing data policy (docs/analysis.md):

- a cell is computed from the repetitions available; paired quantities use only repetitions
  where both runs were parsed, and every absolute value shown beside a ratio is computed from the
  same repetitions, so ratios and absolute values stay consistent;
- a gap needs one pair, its interval and p-value two; otherwise the cell is left empty;
- every cell computed from fewer repetitions than were found is listed in `Analysis.notes()` (and in
  numbers.json / analysis_notes.txt) with the repetitions missing and why.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import numpy.typing as npt

from servelab.analysis import stats
from servelab.analysis.restarts import RestartRecord, summarise_restarts
from servelab.analysis.runs import (
    PoolingError,
    Run,
    RunSet,
    TraceInfo,
    condition_value,
    rep_index,
)
from servelab.artifacts import ROLES, ArtifactError
from servelab.engines.registry import engine_spec
from servelab.grid.settings import STUDY_TABLE_CONDITIONS, AnalysisSettings

__all__ = [
    "LATENCY_METRICS",
    "METRICS",
    "STUDY_ENGINES",
    "TABLE4_ROWS",
    "TABLE5_ROWS",
    "TABLE6_ROWS",
    "Analysis",
    "FluidRun",
    "GapResult",
    "GroupSummary",
]

NAN = float("nan")
LATENCY_METRICS = ("ttft_p50", "ttft_p95", "tpot_p50", "e2e_p50")
METRICS = (*LATENCY_METRICS, "throughput")

# The engines the study compares, in gap order (vLLM ÷ SGLang for latency).
STUDY_ENGINES: tuple[str, ...] = ("vllm", "sglang")


def table5_keys(conditions: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """Table 5's rows: TTFT p50 and p95 at each condition, then throughput at the highest rate
    of the rate sweep among them (the study's: rate-0.28)."""
    rows = [(c, m) for c in conditions for m in ("ttft_p50", "ttft_p95")]
    rates = [c for c in conditions if condition_value(c)[0] == "rate"]
    if rates:
        rows.append((max(rates, key=lambda c: condition_value(c)[1]), "throughput"))
    return tuple(rows)


def table4_keys(conditions: Sequence[str]) -> tuple[tuple[str, str], ...]:
    return tuple((c, m) for c in conditions for m in ("ttft_p50", "ttft_p95", "e2e_p50"))


def table6_keys(conditions: Sequence[str]) -> tuple[tuple[str, str], ...]:
    return tuple((c, a) for c in conditions for a in ("defaults", "matched"))


TABLE5_ROWS = table5_keys(STUDY_TABLE_CONDITIONS)
TABLE4_ROWS = table4_keys(STUDY_TABLE_CONDITIONS)
TABLE6_ROWS = table6_keys(STUDY_TABLE_CONDITIONS)
TABLE3_GROUPS: tuple[tuple[str, str | None, str | None], ...] = (
    ("rate", "defaults", "rate"),
    ("sharing", "defaults", "sharing"),
    ("length", "defaults", "length"),
    ("matched", "matched", None),
    ("total", None, None),
)


def run_value(run: Run, metric: str) -> float:
    m = run.metrics
    return float(
        {
            "ttft_p50": m.ttft_p50,
            "ttft_p95": m.ttft_p95,
            "tpot_p50": m.tpot_p50,
            "e2e_p50": m.e2e_p50,
            "throughput": m.throughput,
        }[metric]
    )


@dataclass(frozen=True)
class GroupSummary:
    """One (arm, engine, condition) over its parsed repetitions."""

    arm: str
    engine: str
    condition: str
    reps: tuple[str, ...]
    values: dict[str, tuple[float, ...]]  # metric -> per-rep value (order of reps)
    summaries: dict[str, stats.LogSummary]  # metric -> geometric mean and log-scale CI
    offered: float
    keeps_pace: tuple[bool, ...]
    kv_peak: tuple[float, ...]
    preemptions: tuple[float, ...]
    pooled_ttft: npt.NDArray[np.float64] = field(repr=False)
    pooled_role: npt.NDArray[np.int8] = field(repr=False)

    @property
    def n(self) -> int:
        return len(self.reps)

    @cached_property
    def pooled(self) -> dict[str, float]:
        t = self.pooled_ttft
        p25, p75 = stats.percentile(t, 25), stats.percentile(t, 75)
        return {
            "n": float(t.size),
            "p25": p25,
            "p50": stats.percentile(t, 50),
            "p75": p75,
            "p95": stats.percentile(t, 95),
            "tail_ratio": stats.tail_ratio(t),
            "g1": stats.log_skewness(t),
            "iqr_ratio": p75 / p25 if p25 > 0 else NAN,
        }

    @cached_property
    def roles(self) -> dict[str, dict[str, float]]:
        out = {}
        for code, role in enumerate(ROLES):
            t = self.pooled_ttft[self.pooled_role == code]
            out[role] = {
                "n": float(t.size),
                "p50": stats.percentile(t, 50),
                "p95": stats.percentile(t, 95),
                "tail_ratio": stats.tail_ratio(t),
            }
        return out

    @property
    def kv_peak_mean(self) -> float:
        kv = np.asarray(self.kv_peak)
        kv = kv[np.isfinite(kv)]
        return float(kv.mean()) if kv.size else NAN


@dataclass(frozen=True)
class GapResult:
    arm: str
    condition: str
    metric: str
    gap: stats.PairedGap
    expected_reps: tuple[str, ...]
    vllm: stats.LogSummary  # absolute values over the paired reps
    sglang: stats.LogSummary


@dataclass(frozen=True)
class FluidRun:
    """One seed-paired repetition seen through the fluid queue model (§6.3)."""

    arm: str
    condition: str
    rep: str
    offered: float
    x_vllm: float
    x_sglang: float
    delta: float
    sglang_keeps_pace: bool
    eligible: bool  # vLLM > 1% behind SGLang and SGLang keeps pace
    run_length_s: float
    w50_s: float
    sglang_p50: float
    vllm_p50: float
    predicted_vllm_p50: float


class Analysis:
    """Everything the outputs show, computed once from a RunSet."""

    def __init__(
        self,
        runset: RunSet,
        *,
        settings: AnalysisSettings | None = None,
        manifests: Mapping[tuple[str, str], TraceInfo] | None = None,
        restarts: Sequence[RestartRecord] = (),
        fluid_reference: tuple[str, str] = ("matched", "rate-0.28"),
        fluid_shortfall: float = 0.01,
    ) -> None:
        self.runset = runset
        # config `analysis:` and the campaign's engines; None: the defaults (AnalysisSettings)
        settings = AnalysisSettings() if settings is None else settings
        self.settings = settings
        # The campaign's engines in gap order (config `engines`, registry order); None: those
        # the runs show. Two engines: the study's comparison. One: its arms are compared.
        engines = settings.engines
        self.engines = tuple(runset.engines() if engines is None else engines) or STUDY_ENGINES
        if len(self.engines) > 2:
            raise ValueError(
                f"the analysis compares two engines (or one engine's two arms), not "
                f"{len(self.engines)}: {', '.join(self.engines)}"
            )
        self.table_conditions = tuple(settings.table_conditions)
        self.multiplicity = settings.multiplicity
        self.keeps_pace = settings.keeps_pace
        self.phi_guard = settings.phi_guard
        self.manifests = dict(manifests or {})
        self.restarts = list(restarts)
        self.fluid_reference = fluid_reference
        self.fluid_shortfall = fluid_shortfall
        self._groups: dict[tuple[str, str, str], GroupSummary] = {}
        self._gaps: dict[tuple[str, str, str], GapResult] = {}
        self._arm_effects: dict[tuple[str, str, str], stats.PairedGap] = {}
        self._notes: dict[str, str] = {}

    # ------------------------------------------------------------------ bookkeeping

    def _missing_note(
        self,
        key: str,
        have: Sequence[str],
        expected: Sequence[str],
        what: str,
        scopes: Sequence[tuple[str, Sequence[str], str]],
    ) -> None:
        """Record that `key` used reps `have` of `expected`; `scopes` = (arm, engines, condition)."""
        missing = [r for r in expected if r not in have]
        if not missing:
            return
        reasons = []
        for rep in missing:
            why = [
                f"{s.run_id} skipped ({s.reason})"
                for s in self.runset.skipped
                if any(
                    s.run_id.split("/") == [arm, engine, condition, rep]
                    for arm, engines, condition in scopes
                    for engine in engines
                )
            ]
            reasons.append(rep + (f" ({'; '.join(why)})" if why else " (no parsed run)"))
        self._notes[key] = (
            f"{key}: {what} from {len(have)} of {len(expected)} repetitions; missing "
            + ", ".join(reasons)
        )

    def _empty_note(self, key: str, why: str) -> None:
        """Record that a table cell is empty because there is nothing to compute it from."""
        self._notes[key] = f"{key}: left empty, {why}"

    def notes(self) -> list[str]:
        """Cells computed from fewer repetitions than were found, and other caveats (sorted)."""
        return [self._notes[k] for k in sorted(self._notes)]

    def arms(self) -> list[str]:
        return sorted({r.arm for r in self.runset.runs.values()})

    # ------------------------------------------------------------------ groups and gaps

    def group(self, arm: str, engine: str, condition: str) -> GroupSummary:
        key = (arm, engine, condition)
        if key not in self._groups:
            runs = self.runset.group(arm, engine, condition)
            reps = tuple(r.rep for r in runs)
            values = {m: tuple(run_value(r, m) for r in runs) for m in METRICS}
            self._groups[key] = GroupSummary(
                arm=arm,
                engine=engine,
                condition=condition,
                reps=reps,
                values=values,
                summaries={m: stats.log_summary(v) for m, v in values.items()},
                offered=float(np.mean([r.offered_load for r in runs])) if runs else NAN,
                keeps_pace=tuple(
                    stats.keeps_pace(r.metrics.throughput, r.offered_load, self.keeps_pace)
                    for r in runs
                ),
                kv_peak=tuple(r.kv_peak for r in runs),
                preemptions=tuple(r.preemptions for r in runs),
                pooled_ttft=np.concatenate([r.metrics.ttft for r in runs]) if runs else np.empty(0),
                pooled_role=(
                    np.concatenate([r.metrics.role for r in runs]) if runs else np.empty(0, np.int8)
                ),
            )
            expected = self.runset.expected_reps(arm, condition, engines=(engine,))
            if runs:
                self._missing_note(
                    f"{arm}/{engine}/{condition}",
                    reps,
                    expected,
                    "pooled and averaged",
                    [(arm, (engine,), condition)],
                )
        return self._groups[key]

    def has_group(self, arm: str, engine: str, condition: str) -> bool:
        return bool(self.group(arm, engine, condition).n)

    def gap(self, arm: str, condition: str, metric: str) -> GapResult:
        """Engine gap R̄ (vLLM ÷ SGLang for latency, SGLang ÷ vLLM for throughput) over paired reps."""
        key = (arm, condition, metric)
        if key not in self._gaps:
            pairs = self.runset.pairs(arm, condition, self.engine_pair)
            v = [run_value(p[0], metric) for p in pairs]
            s = [run_value(p[1], metric) for p in pairs]
            reps = [p[0].rep for p in pairs]
            num, den = (s, v) if metric == "throughput" else (v, s)
            gap = stats.paired_gap(num, den, reps)
            used = set(gap.reps)
            self._gaps[key] = GapResult(
                arm=arm,
                condition=condition,
                metric=metric,
                gap=gap,
                expected_reps=tuple(self.runset.expected_reps(arm, condition)),
                vllm=stats.log_summary([x for x, r in zip(v, reps, strict=True) if r in used]),
                sglang=stats.log_summary([x for x, r in zip(s, reps, strict=True) if r in used]),
            )
            expected = self._gaps[key].expected_reps
            if expected:
                self._missing_note(
                    f"gap {arm}/{condition}/{metric}",
                    gap.reps,
                    expected,
                    "computed",
                    [(arm, self.engines, condition)],
                )
        return self._gaps[key]

    @property
    def engine_pair(self) -> tuple[str, str]:
        """The two engines a gap compares (numerator first for latency)."""
        if len(self.engines) != 2:
            raise ValueError(
                f"an engine gap needs two engines; this campaign has {', '.join(self.engines)} "
                "(its Table 5 compares the arms: `arm_effect_rows`)"
            )
        return (self.engines[0], self.engines[1])

    def paired_conditions(self, arm: str) -> list[str]:
        if len(self.engines) != 2:
            return []
        return [
            c for c in self.runset.conditions(arm) if self.runset.pairs(arm, c, self.engine_pair)
        ]

    def sweep_conditions(self, arm: str, sweep: str) -> list[str]:
        return [c for c in self.runset.conditions(arm) if condition_value(c)[0] == sweep]

    def arm_effect(self, condition: str, metric: str) -> stats.PairedGap:
        """One engine's change matched ÷ defaults at `condition`, paired by repetition (the same
        seeded traces): the test of a one-engine campaign's Table 5."""
        key = ("arm_effect", condition, metric)
        if key not in self._arm_effects:
            pairs = self.runset.arm_pairs(self.engines[0], condition)
            self._arm_effects[key] = stats.paired_gap(
                [run_value(b, metric) for _, b in pairs],
                [run_value(a, metric) for a, _ in pairs],
                [a.rep for a, _ in pairs],
            )
        return self._arm_effects[key]

    # ------------------------------------------------------------------ the family of tests

    def tests(self) -> dict[tuple[str, str, str], stats.PairedGap]:
        """Every paired t-test the analysis runs, keyed (scope, condition, metric): with two
        engines the engine gap of every metric at every seed-paired condition of each arm (scope:
        the arm; numbers.json `gaps`, of which Table 5's p-values are a part), with one engine
        the arm effect of every metric at every condition measured in both arms (scope
        "arm_effect"). This is the family `analysis.multiplicity` adjusts over. Table 4's test of
        the control engine across the arms is a check of the design, not a finding, and stays
        out of it (adjusting it would only make a changed control easier to miss)."""
        if len(self.engines) == 1:
            engine = self.engines[0]
            conditions = [c for c in self.runset.conditions() if self.runset.arm_pairs(engine, c)]
            return {
                ("arm_effect", c, m): self.arm_effect(c, m) for c in conditions for m in METRICS
            }
        return {
            (arm, c, m): self.gap(arm, c, m).gap
            for arm in self.arms()
            for c in self.paired_conditions(arm)
            for m in METRICS
        }

    @cached_property
    def holm_p(self) -> dict[tuple[str, str, str], float]:
        """Holm-adjusted p-values over `tests()` (stats.holm: a test without a p-value is not
        counted and stays NaN)."""
        family = self.tests()
        adjusted = stats.holm([g.p for g in family.values()])
        return dict(zip(family, adjusted, strict=True))

    @property
    def family_size(self) -> int:
        """The number of tests Holm's correction counts: those of `tests()` with a p-value."""
        return sum(1 for p in self.holm_p.values() if math.isfinite(p))

    def star_p(self, scope: str, condition: str, metric: str) -> float:
        """The p-value significance is read from under `analysis.multiplicity`: the test's own
        (none), or its Holm-adjusted value (holm)."""
        if self.multiplicity == "holm":
            return self.holm_p.get((scope, condition, metric), NAN)
        if scope == "arm_effect":
            return self.arm_effect(condition, metric).p
        return self.gap(scope, condition, metric).gap.p

    def significant(self, scope: str, condition: str, metric: str) -> bool:
        """p < 0.05 under the campaign's rule (`star_p`)."""
        p = self.star_p(scope, condition, metric)
        return bool(math.isfinite(p) and p < 0.05)

    # ------------------------------------------------------------------ tables (numeric rows)

    def table3_rows(self) -> list[dict[str, float | str]]:
        """Workload realisation: measured requests per run by sweep, matched arm, total."""
        rows: list[dict[str, float | str]] = []
        for label, arm, sweep in TABLE3_GROUPS:
            runs = [
                r
                for r in self.runset.runs.values()
                if (arm is None or r.arm == arm)
                and (sweep is None or condition_value(r.condition)[0] == sweep)
            ]
            counts = np.array([r.metrics.n_measured for r in runs], dtype=np.float64)
            success = np.array(
                [
                    100.0 * r.metrics.n_measured_success / r.metrics.n_measured
                    for r in runs
                    if r.metrics.n_measured
                ]
            )
            rows.append(
                {
                    "group": label,
                    "runs": float(len(runs)),
                    "requests_mean": float(counts.mean()) if counts.size else NAN,
                    "requests_median": float(np.median(counts)) if counts.size else NAN,
                    "requests_std": float(counts.std(ddof=1)) if counts.size >= 2 else NAN,
                    "requests_min": float(counts.min()) if counts.size else NAN,
                    "requests_max": float(counts.max()) if counts.size else NAN,
                    "requests_total": float(counts.sum()),
                    "lowest_success_pct": float(success.min()) if success.size else NAN,
                }
            )
        return rows

    def table4_rows(
        self, rows: Sequence[tuple[str, str]] | None = None
    ) -> list[dict[str, float | str]]:
        """The control engine (the study's SGLang, whose configuration is the same in both arms)
        in the two deployments: first = defaults arm, second = matched. A one-engine campaign
        changes its only engine's configuration between the arms, so it has no control: empty."""
        if rows is None:
            rows = table4_keys(self.table_conditions)
        out: list[dict[str, float | str]] = []
        if len(self.engines) != 2:
            self._empty_note(
                "table4", "a one-engine campaign has no engine whose configuration both arms share"
            )
            return out
        control = self.engines[1]
        for condition, metric in rows:
            first = {r.rep: r for r in self.runset.group("defaults", control, condition)}
            second = {r.rep: r for r in self.runset.group("matched", control, condition)}
            reps = sorted(set(first) & set(second), key=rep_index)
            if first and second:
                a, b = next(iter(first.values())), next(iter(second.values()))
                if a.config_key != b.config_key and not self.settings.control_differs:
                    raise PoolingError(
                        f"Table 4 compares {engine_spec(control).title} under one configuration, but {a.run_id} resolved "
                        f"{a.config_key} and {b.run_id} resolved {b.config_key}"
                    )
                if a.config_key != b.config_key:
                    self._notes[f"table4 {condition} configurations"] = (
                        f"table4 {condition}: {engine_spec(control).title}'s configuration differs "
                        "between the arms by design (analysis.control_differs): its change is the "
                        f"configuration's and the platform's, {a.run_id} resolved {a.config_key}, "
                        f"{b.run_id} resolved {b.config_key}"
                    )
            for rep in reps:
                a, b = first[rep], second[rep]
                if a.seed != b.seed or a.trace_sha256 != b.trace_sha256:
                    raise PoolingError(
                        f"runs {a.run_id} and {b.run_id} are paired by repetition but received "
                        f"different traces (seed {a.seed} vs {b.seed})"
                    )
            x1 = [run_value(first[r], metric) for r in reps]
            x2 = [run_value(second[r], metric) for r in reps]
            change = stats.paired_gap(x2, x1, reps)
            used = set(change.reps)
            s1 = stats.log_summary([x for x, r in zip(x1, reps, strict=True) if r in used])
            s2 = stats.log_summary([x for x, r in zip(x2, reps, strict=True) if r in used])
            expected = sorted(
                set(self.runset.expected_reps("defaults", condition, (control,)))
                | set(self.runset.expected_reps("matched", condition, (control,))),
                key=rep_index,
            )
            self._missing_note(
                f"table4 {condition}/{metric}",
                change.reps,
                expected,
                "computed",
                [("defaults", (control,), condition), ("matched", (control,), condition)],
            )
            out.append(
                {
                    "condition": condition,
                    "metric": metric,
                    "first": s1.gmean,
                    "second": s2.gmean,
                    "change_pct": (change.gap - 1.0) * 100.0 if change.n else NAN,
                    "p": change.p,
                    "n": float(change.n),
                }
            )
            if change.n == 0:
                self._empty_note(
                    f"table4 {condition}/{metric}", f"no {control} repetition measured in both arms"
                )
        return out

    def table5_rows(
        self, rows: Sequence[tuple[str, str]] | None = None
    ) -> list[dict[str, float | str]]:
        """The decomposition: engine gap under defaults and matched, and the removed fraction φ.
        A one-engine campaign has no engine gap: its Table 5 is the arm effect (`arm_effect_rows`)."""
        if rows is None:
            rows = table5_keys(self.table_conditions)
        if len(self.engines) == 1:
            return self.arm_effect_rows(rows)
        out: list[dict[str, float | str]] = []
        for condition, metric in rows:
            d = self.gap("defaults", condition, metric).gap
            m = self.gap("matched", condition, metric).gap
            for arm, g in (("defaults", d), ("matched", m)):
                if g.n == 0:
                    self._empty_note(
                        f"table5 {condition}/{metric} {arm}", f"no seed-paired {arm} runs"
                    )
            out.append(
                {
                    "condition": condition,
                    "metric": metric,
                    "defaults_gap": d.gap,
                    "defaults_ci_low": d.ci_low,
                    "defaults_ci_high": d.ci_high,
                    "defaults_p": d.p,
                    "matched_gap": m.gap,
                    "matched_ci_low": m.ci_low,
                    "matched_ci_high": m.ci_high,
                    "matched_p": m.p,
                    "removed_fraction": stats.removed_fraction(d.gap, m.gap, self.phi_guard),
                    "defaults_n": float(d.n),
                    "matched_n": float(m.n),
                    **(
                        {
                            "defaults_p_holm": self.star_p("defaults", condition, metric),
                            "matched_p_holm": self.star_p("matched", condition, metric),
                        }
                        if self.multiplicity == "holm"
                        else {}
                    ),
                }
            )
        return out

    def arm_effect_rows(self, rows: Sequence[tuple[str, str]]) -> list[dict[str, float | str]]:
        """One engine under both arms, paired by repetition (the same traces): the change
        matched ÷ defaults of each metric, its interval and p-value (one-engine Table 5)."""
        engine = self.engines[0]
        out: list[dict[str, float | str]] = []
        for condition, metric in rows:
            pairs = self.runset.arm_pairs(engine, condition)
            reps = [a.rep for a, _ in pairs]
            defaults = [run_value(a, metric) for a, _ in pairs]
            matched = [run_value(b, metric) for _, b in pairs]
            change = self.arm_effect(condition, metric)
            used = set(change.reps)
            expected = sorted(
                set(self.runset.expected_reps("defaults", condition, (engine,)))
                | set(self.runset.expected_reps("matched", condition, (engine,))),
                key=rep_index,
            )
            self._missing_note(
                f"table5 {condition}/{metric}",
                change.reps,
                expected,
                "computed",
                [("defaults", (engine,), condition), ("matched", (engine,), condition)],
            )
            if change.n == 0:
                self._empty_note(
                    f"table5 {condition}/{metric}", f"no {engine} repetition measured in both arms"
                )
            out.append(
                {
                    "condition": condition,
                    "metric": metric,
                    "engine": engine,
                    "defaults": stats.log_summary(
                        [x for x, r in zip(defaults, reps, strict=True) if r in used]
                    ).gmean,
                    "matched": stats.log_summary(
                        [x for x, r in zip(matched, reps, strict=True) if r in used]
                    ).gmean,
                    "change": change.gap,
                    "ci_low": change.ci_low,
                    "ci_high": change.ci_high,
                    "p": change.p,
                    "n": float(change.n),
                    **(
                        {"p_holm": self.star_p("arm_effect", condition, metric)}
                        if self.multiplicity == "holm"
                        else {}
                    ),
                }
            )
        return out

    def table6_rows(
        self, rows: Sequence[tuple[str, str]] | None = None
    ) -> list[dict[str, float | str]]:
        """Dispersion of pooled per-request TTFT: tail ratio p95/p50 and g1 of ln TTFT."""
        if rows is None:
            rows = table6_keys(self.table_conditions)
        out: list[dict[str, float | str]] = []
        for condition, arm in rows:
            row: dict[str, float | str] = {"condition": condition, "configuration": arm}
            for engine in self.engines:
                g = self.group(arm, engine, condition)
                if g.n == 0:
                    self._empty_note(f"table6 {condition}/{arm} {engine}", f"no {engine} runs")
                row[f"{engine}_tail_ratio"] = g.pooled["tail_ratio"]
                row[f"{engine}_g1"] = g.pooled["g1"]
                row[f"{engine}_n_reps"] = float(g.n)
                row[f"{engine}_n_requests"] = g.pooled["n"]
            out.append(row)
        return out

    # ------------------------------------------------------------------ fluid queue model

    def _run_length(self, condition: str, rep: str, runs: Sequence[Run]) -> float:
        info = self.manifests.get((condition, rep))
        if info is None:
            return NAN
        for r in runs:
            if r.seed != info.seed:
                raise ArtifactError(
                    f"{info.path}: seed {info.seed} differs from run {r.run_id}'s seed {r.seed}"
                )
        return info.duration_s

    @cached_property
    def fluid_runs(self) -> list[FluidRun]:
        """Every seed-paired repetition with its shortfall δ; predictions for the eligible ones."""
        out: list[FluidRun] = []
        for arm in self.arms():
            for condition in self.paired_conditions(arm):
                for v, s in self.runset.pairs(arm, condition, self.engine_pair):
                    xv, xs = v.metrics.throughput, s.metrics.throughput
                    delta = 1.0 - xv / xs if xs > 0 else NAN
                    pace = stats.keeps_pace(xs, s.offered_load, self.keeps_pace)
                    eligible = bool(np.isfinite(delta) and delta > self.fluid_shortfall and pace)
                    length = self._run_length(condition, v.rep, (v, s))
                    if eligible and not np.isfinite(length):
                        raise ArtifactError(
                            f"no trace manifest for {condition}/{v.rep}: the fluid model needs its "
                            f"duration_s for runs {v.run_id} and {s.run_id}"
                        )
                    w50 = stats.fluid_wait_p50(delta, length) if eligible else NAN
                    out.append(
                        FluidRun(
                            arm=arm,
                            condition=condition,
                            rep=v.rep,
                            offered=s.offered_load,
                            x_vllm=xv,
                            x_sglang=xs,
                            delta=delta,
                            sglang_keeps_pace=pace,
                            eligible=eligible,
                            run_length_s=length,
                            w50_s=w50,
                            sglang_p50=s.metrics.ttft_p50,
                            vllm_p50=v.metrics.ttft_p50,
                            predicted_vllm_p50=s.metrics.ttft_p50 + w50 if eligible else NAN,
                        )
                    )
        return out

    @cached_property
    def fluid_summary(self) -> dict[str, object]:
        """r on the log scale, mean over-prediction, per-condition gaps, and the Fig. 8b reference."""
        elig = [f for f in self.fluid_runs if f.eligible]
        pred = np.array([f.predicted_vllm_p50 for f in elig])
        meas = np.array([f.vllm_p50 for f in elig])
        ok = np.isfinite(pred) & np.isfinite(meas) & (pred > 0) & (meas > 0)
        r_log = NAN
        if ok.sum() >= 3 and np.ptp(np.log(pred[ok])) > 0 and np.ptp(np.log(meas[ok])) > 0:
            r_log = float(np.corrcoef(np.log(pred[ok]), np.log(meas[ok]))[0, 1])
        by_condition: dict[str, dict[str, float]] = {}
        for key in sorted({(f.arm, f.condition) for f in elig}):
            mine = [f for f in elig if (f.arm, f.condition) == key]
            by_condition["/".join(key)] = {
                "n_eligible": float(len(mine)),
                "mean_delta": float(np.mean([f.delta for f in mine])),
                "predicted_gap": stats.geomean([f.predicted_vllm_p50 / f.sglang_p50 for f in mine]),
                "measured_gap": stats.geomean([f.vllm_p50 / f.sglang_p50 for f in mine]),
            }
        return {
            "n_pairs": len(self.fluid_runs),
            "n_eligible": len(elig),
            "r_log": r_log,
            "overprediction": stats.geomean(pred[ok] / meas[ok]) if ok.any() else NAN,
            "by_condition": by_condition,
            "reference": self.fluid_reference_curve(),
        }

    def fluid_reference_curve(self) -> dict[str, object]:
        """Fig. 8b: baseline SGLang p50, run lengths (T/2, T, 2T) and the measured point."""
        arm, condition = self.fluid_reference
        fr = [f for f in self.fluid_runs if (f.arm, f.condition) == (arm, condition)]
        elig = [f for f in fr if f.eligible]
        use = elig or fr
        lengths = [
            self.manifests[(condition, f.rep)].duration_s
            for f in fr
            if (condition, f.rep) in self.manifests
        ]
        base_t = float(np.median(lengths)) if lengths else NAN
        baseline = stats.geomean([f.sglang_p50 for f in use]) if use else NAN
        return {
            "arm": arm,
            "condition": condition,
            "baseline_p50_s": baseline,
            "baseline_from": "eligible" if elig else ("all pairs" if fr else "none"),
            "run_lengths_s": [base_t / 2.0, base_t, 2.0 * base_t] if math.isfinite(base_t) else [],
            "measured_delta": float(np.mean([f.delta for f in elig])) if elig else NAN,
            "measured_gap": stats.geomean([f.vllm_p50 / f.sglang_p50 for f in elig])
            if elig
            else NAN,
            "n_eligible": len(elig),
        }

    # ------------------------------------------------------------------ restarts

    @cached_property
    def restart_summary(self) -> dict[str, dict[str, object]]:
        return summarise_restarts(self.restarts)
