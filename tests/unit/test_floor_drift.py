"""servelab.sim.cpu_fit.floor_drift: two makings of the same floors, set side by side to see
whether the machine's speed moved between them (docs/simulator.md, "A sixteenth measurement")."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from servelab.sim.cpu_fit import (
    FloorRun,
    floor_drift,
    floor_medians,
    floor_noise,
    pooled_spread,
    write_floor_drift,
)


def floor_run(
    root: Path, arm: str, shape: str, rep: str, ttft: float, gap: float, engine: str = "llamacpp"
) -> FloorRun:
    """A floor run of three measured requests and a warm-up, each streaming four tokens one
    `gap` apart after a first token `ttft` after its send."""
    run_dir = root / engine / arm / shape / rep
    run_dir.mkdir(parents=True)
    rows = []
    for k, warmup in enumerate([True, False, False, False]):
        sent = 10.0 * k
        scale = 5.0 if warmup else 1.0  # a warm-up's times must not count
        first = sent + ttft * scale
        rows.append(
            {
                "warmup": warmup,
                "status": "ok",
                "sent_s": sent,
                "chunk_times_s": [first + i * gap * scale for i in range(4)],
                "chunk_tokens": [1, 1, 1, 1],
            }
        )
    pq.write_table(pa.Table.from_pylist(rows), run_dir / "requests.parquet")
    return FloorRun(
        run_dir=run_dir,
        trace_dir=root / "traces" / shape / rep,
        engine=engine,
        arm=arm,
        flags=(),
    )


def test_a_floor_runs_medians_leave_the_warmups_out(tmp_path: Path) -> None:
    run = floor_run(tmp_path, "defaults", "floor-s0.00-L128", "rep1", 0.020, 0.002)
    ttft, gap = floor_medians(run)  # type: ignore[misc]
    assert ttft == pytest.approx(0.020) and gap == pytest.approx(0.002)


def test_drift_is_the_median_ratio_per_deployment_and_agrees_only_within_the_band(
    tmp_path: Path,
) -> None:
    shapes = ["floor-s0.00-L128", "floor-s0.00-L512", "floor-s0.00-L1536"]
    before = [
        floor_run(tmp_path / "before", arm, shape, "rep1", 0.020, 0.002)
        for arm in ("defaults", "matched")
        for shape in shapes
    ]
    # after: defaults 24% slower on every shape; matched 3% slower, but one shape 50%
    after = [
        floor_run(tmp_path / "after", "defaults", shape, "rep1", 0.020 * 1.24, 0.002 * 1.24)
        for shape in shapes
    ] + [
        floor_run(tmp_path / "after", "matched", shape, "rep1", 0.020 * f, 0.002 * f)
        for shape, f in zip(shapes, [1.03, 1.03, 1.5], strict=True)
    ]
    # vLLM: its first token 24% slower, its tokens unchanged; one of the two out is enough
    before += [
        floor_run(tmp_path / "before", "defaults", s, "rep1", 0.02, 0.002, "vllm_v1")
        for s in shapes
    ]
    after += [
        floor_run(tmp_path / "after", "defaults", s, "rep1", 0.02 * 1.24, 0.002, "vllm_v1")
        for s in shapes
    ]
    # a run with no partner before is left out
    after.append(floor_run(tmp_path / "after", "matched", "floor-s0.00-L128", "rep2", 1.0, 1.0))
    drift = floor_drift(before, after, band=math.log(1.05))
    assert drift["llamacpp/defaults"]["pairs"] == 3
    assert drift["llamacpp/defaults"]["ttft_ratio"] == pytest.approx(1.24, abs=1e-3)
    assert drift["llamacpp/defaults"]["agrees"] is False
    assert drift["llamacpp/matched"]["pairs"] == 3
    assert drift["llamacpp/matched"]["itl_ratio"] == pytest.approx(1.03, abs=1e-3)
    assert drift["llamacpp/matched"]["agrees"] is True
    assert drift["vllm_v1/defaults"]["itl_ratio"] == pytest.approx(1.0)
    assert drift["vllm_v1/defaults"]["agrees"] is False
    # the same floors twice agree with themselves at any band
    same = floor_drift(before, before, band=0.0)
    assert all(d["agrees"] and d["ttft_ratio"] == 1.0 for d in same.values())


def as_config(run: FloorRun) -> dict[str, object]:
    """A floor run as the workflow's params give it, its run.json written with `status`."""
    return {
        "run_dir": str(run.run_dir),
        "trace_dir": str(run.trace_dir),
        "engine": run.engine,
        "arm": run.arm,
        "flags": list(run.flags),
    }


def test_the_bracket_record_leaves_out_runs_not_ok_and_refuses_a_deployment_without_pairs(
    tmp_path: Path,
) -> None:
    shape = "floor-s0.00-L128"
    before = [
        floor_run(tmp_path / "before", arm, shape, rep, 0.020, 0.002)
        for arm in ("defaults", "matched")
        for rep in ("rep1", "rep2")
    ]
    after = [
        floor_run(tmp_path / "after", "defaults", shape, "rep1", 0.0208, 0.002),
        # 50% slower, but refused for its machine load: no measurement, so no drift either
        floor_run(tmp_path / "after", "defaults", shape, "rep2", 0.030, 0.003),
        # matched's floor after was refused: nothing shows its machine held still
        floor_run(tmp_path / "after", "matched", shape, "rep1", 0.020, 0.002),
    ]
    refused = {after[1].run_dir, after[2].run_dir}
    for run in (*before, *after):
        status = "refused" if run.run_dir in refused else "ok"
        (run.run_dir / "run.json").write_text(json.dumps({"status": status}))
    out = tmp_path / "floor_drift.json"
    record = write_floor_drift(
        [as_config(r) for r in before], [as_config(r) for r in after], band=0.05, out_path=out
    )
    assert json.loads(out.read_text()) == record
    assert record["band"] == 0.05
    assert record["skipped_runs"] == sorted(str(p) for p in refused)
    defaults = record["deployments"]["llamacpp/defaults"]
    assert defaults["pairs"] == 1 and defaults["ttft_ratio"] == pytest.approx(1.04, abs=1e-3)
    assert defaults["agrees"] is True  # 4% is within ±5%
    assert defaults["quiet"] is None and defaults["judged"] is True  # no bar: the drift decides
    assert record["deployments"]["llamacpp/matched"] == {
        "pairs": 0,
        "ttft_ratio": None,
        "itl_ratio": None,
        "agrees": False,
        "quiet": None,
        "judged": False,
    }
    with pytest.raises(ValueError, match=r"floor\.bracket\.band"):
        write_floor_drift([], [], band=5.0, out_path=out)


def test_with_the_quiet_floor_bar_an_engine_whose_floor_spreads_is_not_judged(
    tmp_path: Path,
) -> None:
    shape = "floor-s0.00-L512"
    before, after = [], []
    for engine, spread in (("llamacpp", 1.02), ("vllm_v1", 1.2)):
        for arm in ("defaults", "matched"):
            for rep, f in (("rep1", 1.0), ("rep2", spread)):
                # one arm's repetitions spread, the other's do not: the fit pools both
                f = f if arm == "matched" else 1.0
                before.append(floor_run(tmp_path / "b", arm, shape, rep, 0.02 * f, 0.002, engine))
                after.append(floor_run(tmp_path / "a", arm, shape, rep, 0.02 * f, 0.002, engine))
    for run in (*before, *after):
        (run.run_dir / "run.json").write_text(json.dumps({"status": "ok"}))
    record = write_floor_drift(
        [as_config(r) for r in before],
        [as_config(r) for r in after],
        band=0.05,
        max_noise=0.045,
        out_path=tmp_path / "floor_drift.json",
    )
    assert record["max_noise"] == 0.045
    verdicts = record["deployments"]
    assert all(v["agrees"] for v in verdicts.values())  # the same floors, made twice
    # llama.cpp matched's repetitions 2% apart: sd of ln over its two groups, pooled, 0.010
    assert verdicts["llamacpp/defaults"]["noise"]["ttft_ln_sd"] == pytest.approx(0.010, abs=1e-3)
    assert verdicts["llamacpp/defaults"]["quiet"] and verdicts["llamacpp/defaults"]["judged"]
    # vLLM matched's 20% apart, pooled with its defaults' 0: 0.091, over the bar for both arms
    for arm in ("defaults", "matched"):
        entry = verdicts[f"vllm_v1/{arm}"]
        assert entry["noise"]["ttft_ln_sd"] == pytest.approx(0.091, abs=1e-3)
        assert entry["quiet"] is False and entry["judged"] is False


def test_an_arms_noise_is_its_own_groups_pooled_by_the_engines_rule(tmp_path: Path) -> None:
    """benchmarks/floor_noise_by_day.py reads each arm's noise from a platform file's
    `per_group` with `pooled_spread`: the root mean square over that arm's groups, the rule by
    which `floor_noise` pools an engine's."""
    runs = []
    for arm, spread in (("defaults", 1.0), ("matched", 1.2)):
        for shape in ("floor-s0.00-L128", "floor-s0.00-L512"):
            for rep, f in (("rep1", 1.0), ("rep2", spread)):
                runs.append(floor_run(tmp_path, arm, shape, rep, 0.02 * f, 0.002 * f, "vllm_v1"))
    noise = floor_noise(runs)
    by_arm = {
        arm: pooled_spread(v for k, v in noise["per_group"].items() if k.startswith(arm + "/"))
        for arm in ("defaults", "matched")
    }
    # two repetitions 20% apart: sd of ln, ln(1.2) / sqrt(2), in each of matched's groups
    assert by_arm["matched"] == pytest.approx((math.log(1.2) / math.sqrt(2),) * 2, abs=1e-4)
    assert by_arm["defaults"] == pytest.approx((0.0, 0.0), abs=1e-9)
    # the engine's: matched's pooled with defaults' zeros, over four groups
    assert noise["ttft_ln_sd"] == pytest.approx(math.log(1.2) / 2, abs=1e-4)
