"""Whole-analysis outputs: byte-identical reruns, checksums and verify, the CLI, the fluid model,
Figure 14 from restart records (or its placeholder), figure metadata and report captions."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jinja2
import matplotlib.pyplot as plt
import pytest
from docutils.core import publish_doctree

from servelab.analysis import (
    VerificationError,
    analysis_outputs,
    analyze,
    build_analysis,
    pipeline,
    record_checksums,
    verify_against_checksums,
)
from servelab.analysis.figures import draw_figure14
from servelab.analysis.synthetic import (
    RunSpec,
    write_manifest,
    write_simple_run,
    write_synthetic_grid,
)
from servelab.analysis.verify import verify
from servelab.artifacts import ArtifactError
from servelab.cli import main as servelab_main
from servelab.grid.config import Condition, load_config

REPO = Path(__file__).resolve().parents[2]
# The condition of the fluid-model manifests below (the study's rate-0.28).
RATE_028 = Condition("rate-0.28", "rate", 0.28, 0.9, 4096, 600.0)


def _restart(path: Path, engine: str, rep: str, terminate: float, ready: float) -> Path:
    events = {
        "deleted": 1000.0,
        "terminated": 1000.0 + terminate,
        "scheduled": 1000.0 + terminate,
        "pull_started": 1001.0 + terminate,
        "pulled": 1004.0 + terminate,
        "container_started": 1005.0 + terminate,
        "ready": 1000.0 + ready,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"engine": engine, "rep": rep, "events": events}))
    return path


@pytest.fixture(scope="module")
def grid(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("grid")
    cfg = load_config(REPO / "config" / "config.yaml")
    statuses = {"defaults/vllm/rate-0.20/rep2": "failed"}
    runs, manifests = write_synthetic_grid(root, cfg, duration_scale=0.05, statuses=statuses)
    restarts = [
        _restart(root / "restarts" / e / r / "restart.json", e, r, t, total)
        for e, t, totals in (("vllm", 5.0, (132, 134, 142)), ("sglang", 32.0, (154, 155, 162)))
        for r, total in zip(("rep1", "rep2", "rep3"), totals, strict=True)
    ]
    return {"root": root, "runs": runs, "manifests": manifests, "restarts": restarts}


@pytest.fixture(scope="module")
def analysed(grid: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("results")
    analyze(grid["runs"], out, manifests=grid["manifests"], restart_records=grid["restarts"])
    return out


def test_outputs_are_the_documented_set(analysed: Path) -> None:
    written = sorted(p.relative_to(analysed).as_posix() for p in analysed.rglob("*") if p.is_file())
    assert written == sorted(analysis_outputs())
    numbers = json.loads((analysed / "numbers.json").read_text())
    assert numbers["runs"]["found"] == 99
    assert numbers["runs"]["skipped_runs"][0]["run_id"] == "defaults/vllm/rate-0.20/rep2"
    assert list(numbers) == sorted(numbers)  # sorted keys
    notes = (analysed / "analysis_notes.txt").read_text()
    assert "run logs: 99 found, 98 parsed, 1 skipped" in notes


def test_two_analyses_are_byte_identical_and_verify(
    grid: dict, analysed: Path, tmp_path: Path
) -> None:
    record_checksums(analysed, tmp_path / "checksums.json")
    again = tmp_path / "again"
    report = tmp_path / "verify.txt"
    # The verify target: a second, independent analysis compared with the recorded checksums.
    assert (
        verify_against_checksums(
            grid["runs"],
            tmp_path / "checksums.json",
            report,
            manifests=grid["manifests"],
            restart_records=grid["restarts"],
            scratch_dir=again,
        )
        == []
    )
    for name in analysis_outputs():
        assert (again / name).read_bytes() == (analysed / name).read_bytes(), name
    assert "all byte-identical" in report.read_text()


def test_verify_target_fails_naming_the_files(analysed: Path, tmp_path: Path, monkeypatch) -> None:
    checks = tmp_path / "checksums.json"
    record_checksums(analysed, checks)
    recorded = json.loads(checks.read_text())
    recorded["files"]["table4.csv"] = "0" * 64
    checks.write_text(json.dumps(recorded))

    def fake_analyze(run_dirs, out_dir, **kw):  # the recomputation itself is tested above
        shutil.copytree(analysed, out_dir, dirs_exist_ok=True)

    monkeypatch.setattr(pipeline, "analyze", fake_analyze)
    report = tmp_path / "verify.txt"
    with pytest.raises(VerificationError, match=r"1 output\(s\) differ.*table4\.csv: sha256"):
        verify_against_checksums([], checks, report)
    assert not report.exists()


def test_verify_reports_changed_missing_and_unrecorded_files(
    analysed: Path, tmp_path: Path
) -> None:
    checks = tmp_path / "checksums.json"
    recorded = record_checksums(
        analysed, checks, [n for n in analysis_outputs() if "figure9" not in n]
    )
    copy = tmp_path / "copy"
    shutil.copytree(analysed, copy)
    with (copy / "table5.csv").open("a") as fh:
        fh.write("x")
    (copy / "figures" / "figure6.pdf").unlink()
    mismatches = {m.path: m for m in verify(copy, checks)}
    assert set(mismatches) == {
        "table5.csv",
        "figures/figure6.pdf",
        "figures/figure9.png",
        "figures/figure9.pdf",
    }
    assert mismatches["figures/figure6.pdf"].actual is None
    assert mismatches["figures/figure9.png"].expected is None
    assert mismatches["table5.csv"].expected == recorded["table5.csv"]
    assert "differs from recorded" in str(mismatches["table5.csv"])


def test_figure_metadata_has_no_timestamps(analysed: Path) -> None:
    pdf = (analysed / "figures" / "figure1.pdf").read_bytes()
    png = (analysed / "figures" / "figure1.png").read_bytes()
    assert b"/CreationDate" not in pdf and b"/ModDate" not in pdf
    assert b"Software" not in png and b"tIME" not in png


def test_figure14_from_restart_records_and_placeholder(analysed: Path) -> None:
    numbers = json.loads((analysed / "numbers.json").read_text())
    vllm = numbers["restarts"]["vllm"]
    assert vllm["n"] == 3
    assert vllm["total_mean_s"] == pytest.approx((132 + 134 + 142) / 3)
    assert (vllm["total_min_s"], vllm["total_max_s"]) == (132, 142)
    assert numbers["restarts"]["sglang"]["phase_mean_s"]["terminate"] == pytest.approx(32.0)
    assert numbers["figures"]["figure14"]["engines"] == numbers["restarts"]

    fig = plt.figure()
    draw_figure14(fig, {"phases": [], "engines": {}})
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    plt.close(fig)
    assert any("no restart records" in t for t in texts)


def _pair(root: Path, rep: str, x_vllm: float, x_sglang: float, offered: float, seed: int):
    """A seed-paired (vLLM, SGLang) repetition with achieved throughputs set through W."""
    out = []
    for engine, x, p50 in (("vllm", x_vllm, 20.0), ("sglang", x_sglang, 0.5)):
        spec = RunSpec("matched", engine, "rate-0.28", rep, seed=seed, offered_load_rps=offered)
        run_dir = root / "runs" / "matched" / engine / "rate-0.28" / rep
        out.append(write_simple_run(run_dir, spec, [p50] * 9, end_s=10 / x))
    return out


def test_fluid_model_eligibility_and_prediction(tmp_path: Path) -> None:
    offered = 0.05  # 10 requests (9 + graph 0) over W = 10 / X
    dirs = [
        *_pair(tmp_path, "rep1", 0.9 * 0.049, 0.049, offered, 1),  # δ 10%, SGLang keeps pace
        *_pair(tmp_path, "rep2", 0.9 * 0.0484, 0.0484, offered, 2),  # SGLang below 0.97 Λ
        *_pair(tmp_path, "rep3", 0.995 * 0.05, 0.05, offered, 3),  # δ 0.5%: not behind
    ]
    manifests = [
        write_manifest(tmp_path / f"m{k}.json", condition=RATE_028, rep=f"rep{k}", seed=k)
        for k in (1, 2, 3)
    ]  # fmt: skip
    an = build_analysis(dirs, manifests=manifests)
    by_rep = {f.rep: f for f in an.fluid_runs}
    assert [by_rep[r].eligible for r in ("rep1", "rep2", "rep3")] == [True, False, False]
    f = by_rep["rep1"]
    assert f.delta == pytest.approx(0.1)
    assert f.w50_s == pytest.approx(300.0 * 0.1 / 0.9)
    assert f.predicted_vllm_p50 == pytest.approx(0.5 + 300.0 * 0.1 / 0.9)
    ref = an.fluid_summary["reference"]
    assert ref["baseline_from"] == "eligible" and ref["run_lengths_s"] == [300.0, 600.0, 1200.0]
    assert ref["measured_gap"] == pytest.approx(40.0)

    with pytest.raises(ArtifactError, match=r"no trace manifest for rate-0.28/rep1.*matched/vllm"):
        _ = build_analysis(dirs, manifests=manifests[1:]).fluid_runs
    bad = write_manifest(tmp_path / "bad.json", condition=RATE_028, rep="rep1", seed=77)
    with pytest.raises(ArtifactError, match=r"bad\.json: seed 77 differs"):
        _ = build_analysis(dirs, manifests=[bad, *manifests[1:]]).fluid_runs


def test_cli_analyze_records_and_verifies(grid: dict, tmp_path: Path, capsys) -> None:
    runs_root = str(grid["root"] / "runs")
    out = tmp_path / "out"
    checks = tmp_path / "checksums.json"
    argv = ["analyze", runs_root, "--out", str(out), "--formats", ""]  # no figures: quick
    assert servelab_main([*argv, "--record-checksums", str(checks)]) == 0
    printed = capsys.readouterr().out
    assert "run logs: 99 found, 98 parsed, 1 skipped" in printed
    recorded = json.loads(checks.read_text())["files"]
    assert "table5.csv" in recorded and not any(k.startswith("figures/") for k in recorded)
    scratch = tmp_path / "scratch"
    argv = ["analyze", runs_root, "--out", str(scratch), "--formats", ""]
    assert servelab_main([*argv, "--verify", str(checks)]) == 0
    # A different φ guard changes the outputs: verify must fail and say which file.
    assert servelab_main([*argv, "--phi-guard", "100", "--verify", str(checks)]) == 1
    assert "MISMATCH table5.csv" in capsys.readouterr().err


def test_report_captions_render(tmp_path: Path) -> None:
    report = REPO / "workflow" / "report"
    names = {p.stem for p in report.glob("*.rst")}
    expected = {Path(n).stem for n in analysis_outputs() if not n.endswith(".pdf")}
    expected = {n for n in expected if n != "analysis_notes"} | {"workflow"}
    assert expected <= names
    config = load_config(REPO / "config" / "config.yaml")
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    for path in sorted(report.glob("*.rst")):
        text = env.from_string(path.read_text()).render(snakemake={"config": config})
        publish_doctree(text, settings_overrides={"halt_level": 2, "report_level": 2})
