"""servelab.campaign_status: the plan's arithmetic, each run state read from artifacts, and redo.

The artifacts here are written by hand (a run.json with the required fields, discard generations
with their reason.json), so each state and each field is checked against a file the test chose.
tests/workflow/test_campaign_status.py checks the same against a real sim campaign.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from campaigns import tiny_config
from snakemake.utils import update_config

from servelab.artifacts import RUN_JSON_REQUIRED
from servelab.campaign.plan import format_plan, paired_conditions, plan_campaign, target_runs
from servelab.campaign.redo import RedoError, redo_engine, redo_runs
from servelab.campaign.status import STATUS_COLUMNS, campaign_status, run_status, status_csv
from servelab.cli import main
from servelab.grid.config import Run, floor_blocks, load_config, validate_config

REPO = Path(__file__).resolve().parents[2]
STUDY = REPO / "config" / "config.yaml"
KUBE_EXAMPLE = REPO / "config" / "kubernetes.example.yaml"
TEST_GRID = REPO / "config" / "test.yaml"


@pytest.fixture(scope="module")
def study() -> dict[str, Any]:
    return yaml.safe_load(STUDY.read_text())


@pytest.fixture
def small(study: dict[str, Any]) -> dict[str, Any]:
    """One condition, two repetitions, both engines, the defaults arm: four runs."""
    cfg = tiny_config(study)
    validate_config(cfg)
    return cfg


def write_record(results: Path, run_id: str, **fields: Any) -> Path:
    """A run.json with every required field; `fields` override them."""
    arm, engine, condition, rep = run_id.split("/")
    record: dict[str, Any] = dict.fromkeys(RUN_JSON_REQUIRED, 0)
    record.update(
        run_id=run_id,
        arm=arm,
        engine=engine,
        condition=condition,
        rep=rep,
        backend="sim",
        deployment_id="d",
        resolved_config={"chunked_prefill": True, "chunk_size": 2048},
        start_unix_s=1000.0,
        end_unix_s=1100.5,
        status="ok",
        attempt=1,
        node={"start": {"name": "node-a"}, "end": {"name": "node-a"}},
        n_sent=10,
        n_ok=10,
    )
    record.update(fields)
    path = results / "runs" / run_id / "run.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    return path


def write_discard(results: Path, block: str, generation: int, reps: list[str], reason: str) -> None:
    folder = results / "discarded" / block / f"{generation:03d}"
    folder.mkdir(parents=True)
    for rep in reps:
        (folder / rep).mkdir()
    (folder / "reason.json").write_text(json.dumps({"reason": reason, "discarded_reps": reps}))


# ----------------------------------------------------------------------------- configuration


def test_configfiles_merge_as_snakemake_merges_them(study: dict[str, Any]) -> None:
    expected = copy.deepcopy(study)
    update_config(expected, yaml.safe_load(TEST_GRID.read_text()))
    update_config(expected, yaml.safe_load(KUBE_EXAMPLE.read_text()))
    assert load_config(STUDY, [TEST_GRID, KUBE_EXAMPLE]) == expected
    assert load_config(STUDY) == study


@pytest.mark.parametrize(
    ("overlays", "engines"),
    [
        (["llamacpp.yaml"], {"llamacpp"}),
        (["current.yaml"], {"vllm_v1", "sglang_v05"}),
        (["current.yaml", "current-h100.yaml"], {"vllm_v1", "sglang_v05"}),
    ],
)
def test_an_engine_an_overlay_sets_to_null_is_removed_as_the_snakefile_removes_it(
    overlays: list[str], engines: set[str]
) -> None:
    """The CLI's merge is the workflow's: `vllm: null` removes the study's engine everywhere (it
    stopped every `servelab campaign` command on these configs: 'None is not of type object')."""
    config = load_config(STUDY, [REPO / "config" / name for name in overlays])
    assert set(config["engines"]) == engines
    for arm in config["arms"].values():
        assert set(arm["engines"]) <= engines
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "servelab.cli",
            "campaign",
            "plan",
            "--results",
            "no-results",
            "--configfile",
            *[str(REPO / "config" / name) for name in overlays],
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert all(engine in out.stdout for engine in {e.replace("_", "-") for e in engines})


# ----------------------------------------------------------------------------- targets


def condition_ids(config: dict[str, Any]) -> list[str]:
    """Condition ids as docs/architecture.md spells them, from the YAML alone."""
    spelled = {
        "rate": lambda c: f"rate-{c['rate']:.2f}",
        "sharing": lambda c: f"sharing-{c['sharing']:.2f}",
        "length": lambda c: f"length-{c['prompt_tokens']}",
    }
    return [spelled[c["sweep"]](c) for c in config["conditions"]]


def test_table5_is_every_run_of_the_conditions_both_engines_run_in_both_arms(study) -> None:
    def arm_conditions(arm: str, engine: str) -> set[str]:
        spec = study["arms"][arm]
        listed = set(condition_ids(study) if spec["conditions"] == "all" else spec["conditions"])
        return listed - set(spec["engines"][engine].get("skip_conditions", []))

    paired = set.intersection(
        *(arm_conditions(arm, engine) for arm in study["arms"] for engine in study["engines"])
    )
    assert set(paired_conditions(study)) == paired
    table5 = target_runs(study, "table5")
    assert {r.condition for r in table5} == set(paired_conditions(study))
    assert len(table5) == len(paired_conditions(study)) * 4 * study["repetitions"]
    assert {r.id for r in target_runs(study, "table4")} == {
        r.id for r in table5 if r.engine == "sglang"
    }
    assert len(target_runs(study, "all")) == 99
    with pytest.raises(ValueError, match="unknown target 'table9'"):
        target_runs(study, "table9")


# ----------------------------------------------------------------------------- plan


def independent_load_s(config: dict[str, Any]) -> float:
    """The grid's load from the YAML alone: each arm's conditions (less skipped ones), each
    engine, each repetition, their duration_s."""
    ids = condition_ids(config)
    durations = {cid: c["duration_s"] for cid, c in zip(ids, config["conditions"], strict=True)}
    total = 0.0
    for spec in config["arms"].values():
        listed = set(durations if spec["conditions"] == "all" else spec["conditions"])
        for engine_spec in spec["engines"].values():
            chosen = listed - set(engine_spec.get("skip_conditions", []))
            total += sum(durations[c] for c in chosen) * config["repetitions"]
    return total


def test_plan_of_the_full_grid_on_kubernetes_gives_its_gpu_hours(tmp_path: Path) -> None:
    config = load_config(STUDY, [KUBE_EXAMPLE])
    assert config["backend"] == "kubernetes"
    plan = plan_campaign(config, "all", tmp_path / "results")
    assert plan.runs_to_measure == 99
    assert len(plan.deployments) == 5
    load_s = plan.total("load_s")
    assert load_s == independent_load_s(config)
    assert abs(load_s / 3600 - 33) < 0.5  # the study's "about 33 hours of load" (Appendix A.2)
    pause = config["campaign"]["pause_between_runs_s"]
    assert pause > 0
    assert plan.total("pauses_s") == 99 * pause
    assert all(d.startup_s > 0 for d in plan.deployments)
    parts = sum(plan.total(p) for p in ("load_s", "warmup_s", "pauses_s", "startup_s"))
    assert plan.gpu_hours == pytest.approx(parts / 3600)
    assert plan.gpu_hours > (load_s + 99 * pause) / 3600
    ready_s = config["kubernetes"]["timeouts"]["ready_s"]
    assert plan.worst_case_gpu_hours == pytest.approx(
        (parts + 5 * (ready_s - plan.startup_each_s)) / 3600
    )
    text = format_plan(plan)
    assert f"GPU-hours: {plan.gpu_hours:.2f}" in text
    assert f"{plan.worst_case_gpu_hours:.2f} GPU-hours" in text
    # the floors (five deployments, 20 (deployment, shape) pairs) are named, not hidden in the hours
    assert plan.floor_runs == 20
    assert "not in these hours: 20 unloaded-floor run(s)" in text
    assert plan_campaign(config, "table5", tmp_path / "results").floor_runs == 0


def test_plan_leaves_out_final_runs_and_deployments_with_nothing_to_do(
    small: dict[str, Any], tmp_path: Path
) -> None:
    results = tmp_path / "results"
    write_record(results, "defaults/vllm/rate-0.28/rep1", status="ok")
    write_record(results, "defaults/vllm/rate-0.28/rep2", status="failed", n_ok=0)
    write_record(results, "defaults/sglang/rate-0.28/rep1", status="interrupted")
    plan = plan_campaign(small, "all", results)
    # vllm's two runs are final; sglang rep1 is not final, rep2 has no run.json
    assert [d.runs for d in plan.deployments] == [
        ("defaults/sglang/rate-0.28/rep1", "defaults/sglang/rate-0.28/rep2")
    ]
    assert plan.runs_in_target == 4
    assert plan.total("load_s") == 2 * 40
    assert plan.total("startup_s") == 0  # the sim backend starts nothing
    assert "2 of its 4 runs to measure" in format_plan(plan)


def test_plan_cli_prints_the_table_and_the_total(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "campaign",
            "plan",
            "--config",
            str(STUDY),
            "--configfile",
            str(KUBE_EXAMPLE),
            "--target",
            "all",
            "--results",
            "/nonexistent/results",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "backend kubernetes: 99 of its 99 runs to measure, 5 deployment(s)" in out
    total = next(line for line in out.splitlines() if line.startswith("total"))
    assert total.split()[1:3] == ["99", f"{independent_load_s(load_config(STUDY)) / 3600:.2f}"]


# ----------------------------------------------------------------------------- status


def test_each_state_is_read_from_the_artifacts(small: dict[str, Any], tmp_path: Path) -> None:
    results = tmp_path / "results"
    write_record(results, "defaults/vllm/rate-0.28/rep1", attempt=2)
    failed = write_record(
        results,
        "defaults/vllm/rate-0.28/rep2",
        status="failed",
        attempt=3,
        error="RuntimeError: engine died",
        node={"start": {"name": "node-a"}, "end": {"name": "node-b"}},
    )
    (failed.parent / "attempts" / "attempt-1").mkdir(parents=True)
    write_discard(results, "defaults/sglang/rate-0.28", 1, ["rep1", "rep2"], "first reclamation")
    write_discard(results, "defaults/sglang/rate-0.28", 2, ["rep1"], "second reclamation")
    # sglang rep2 was discarded once and measured again; rep1 has no run.json since
    write_record(results, "defaults/sglang/rate-0.28/rep2", start_unix_s=5.0, end_unix_s=7.25)
    (results / "runs" / "defaults/sglang/rate-0.28/rep1" / "attempts" / "attempt-1").mkdir(
        parents=True
    )
    rows = {row.run_id: row for row in campaign_status(small, results)}
    assert list(rows) == [r.id for r in target_runs(small, "all")]
    done = rows["defaults/vllm/rate-0.28/rep1"]
    assert (done.state, done.attempts, done.node, done.wall_s, done.reason, done.discards) == (
        "done",
        2,
        "node-a",
        100.5,
        "",
        0,
    )
    bad = rows["defaults/vllm/rate-0.28/rep2"]
    assert (bad.state, bad.attempts, bad.node, bad.reason) == (
        "failed",
        3,
        "node-b",
        "RuntimeError: engine died",
    )
    discarded = rows["defaults/sglang/rate-0.28/rep1"]
    assert (discarded.state, discarded.reason, discarded.discards, discarded.attempts) == (
        "discarded",
        "second reclamation",
        2,
        1,
    )
    again = rows["defaults/sglang/rate-0.28/rep2"]
    assert (again.state, again.discards, again.wall_s) == ("done", 1, 2.25)
    # without its discards, the same folder state is "missing"
    other = run_status(results, Run("defaults", "vllm", "rate-0.28", "rep3"))
    assert (other.state, other.attempts, other.reason) == ("missing", 0, "")


def test_a_failure_without_an_error_names_its_status_and_counts(
    small: dict[str, Any], tmp_path: Path
) -> None:
    results = tmp_path / "results"
    write_record(results, "defaults/vllm/rate-0.28/rep1", status="failed", n_ok=3, n_sent=10)
    row = run_status(results, Run("defaults", "vllm", "rate-0.28", "rep1"))
    assert row.reason == "status failed: 3/10 requests ok"


def test_status_csv_has_one_row_per_run_and_the_documented_columns(
    small: dict[str, Any], tmp_path: Path
) -> None:
    results = tmp_path / "results"
    write_record(results, "defaults/vllm/rate-0.28/rep1")
    lines = status_csv(campaign_status(small, results)).splitlines()
    assert tuple(lines[0].split(",")) == STATUS_COLUMNS
    assert STATUS_COLUMNS == (
        "run_id",
        "arm",
        "engine",
        "condition",
        "rep",
        "state",
        "attempts",
        "node",
        "wall_s",
        "reason",
        "discards",
    )
    assert len(lines) == 1 + 4
    assert (
        lines[1]
        == "defaults/vllm/rate-0.28/rep1,defaults,vllm,rate-0.28,rep1,done,1,node-a,100.5,,0"
    )
    assert lines[2].endswith(",missing,0,,,,0")


# ----------------------------------------------------------------------------- redo


def measured_run(results: Path, run_id: str, key: str = "k1") -> dict[str, bytes]:
    """A sealed, published run with a failed attempt and telemetry; returns every file's bytes by
    its path relative to the run directory."""
    run_json = write_record(results, run_id)
    run_dir = run_json.parent
    for folder in ("measured", "attempts/attempt-1"):
        (run_dir / folder).mkdir(parents=True)
        for name in ("requests.parquet", "scrape.parquet"):
            (run_dir / folder / name).write_bytes(f"{folder}/{name}".encode())
        (run_dir / folder / "run.json").write_bytes(run_json.read_bytes())
    (run_dir / "measured" / "measurement.key").write_text(key + "\n")
    for name in ("requests.parquet", "scrape.parquet", "telemetry.parquet"):
        (run_dir / name).write_bytes(name.encode())
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}


def test_redo_moves_the_measurement_aside_with_its_reason_and_deletes_nothing(
    small: dict[str, Any], tmp_path: Path
) -> None:
    results = tmp_path / "results"
    run_id = "defaults/vllm/rate-0.28/rep1"
    before = measured_run(results, run_id)
    sibling = write_record(results, "defaults/vllm/rate-0.28/rep2").read_bytes()
    (redone,) = redo_runs(small, results, [run_id], "the node ran hot")
    folder = results / "redone" / run_id / "001"
    assert redone.folder == folder
    assert redone.target == results / "runs" / run_id / "run.json"  # the run's own, now missing
    assert not redone.target.exists()
    after = {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    reason = json.loads(after.pop("reason.json"))
    assert after == before  # every byte kept, under the same names
    assert reason["run_id"] == run_id
    assert reason["why"] == "the node ran hot"
    assert reason["measurement_key"] == "k1"
    assert sorted(reason["moved"]) == sorted(
        [
            "measured",
            "attempts",
            "requests.parquet",
            "scrape.parquet",
            "run.json",
            "telemetry.parquet",
        ]
    )
    assert isinstance(reason["redone_at_unix_s"], float)
    assert list((results / "runs" / run_id).iterdir()) == []
    assert run_status(results, Run(*run_id.split("/"))).state == "missing"
    assert (results / "runs" / "defaults/vllm/rate-0.28/rep2" / "run.json").read_bytes() == sibling

    # measured again, then redone again: the next free generation
    measured_run(results, run_id, key="k2")
    (second,) = redo_runs(small, results, [run_id], "again")
    assert second.folder == results / "redone" / run_id / "002"
    assert json.loads((second.folder / "reason.json").read_text())["measurement_key"] == "k2"
    assert (folder / "reason.json").is_file()


def test_redo_of_a_run_without_a_seal_records_a_null_key(
    small: dict[str, Any], tmp_path: Path
) -> None:
    results = tmp_path / "results"
    write_record(results, "defaults/sglang/rate-0.28/rep2")
    (redone,) = redo_runs(small, results, ["defaults/sglang/rate-0.28/rep2"], "why not")
    reason = json.loads((redone.folder / "reason.json").read_text())
    assert reason["measurement_key"] is None
    assert reason["moved"] == ["run.json"]


def test_redo_refuses_an_unknown_run_and_moves_nothing(
    small: dict[str, Any], tmp_path: Path
) -> None:
    results = tmp_path / "results"
    good = "defaults/vllm/rate-0.28/rep1"
    measured_run(results, good)
    with pytest.raises(RedoError, match=r"RUN_ID 'defaults/vllm/rate-0.28/rep7' is not a run"):
        redo_runs(small, results, [good, "defaults/vllm/rate-0.28/rep7"], "typo")
    with pytest.raises(RedoError, match=r"RUN_ID defaults/sglang/rate-0.28/rep1: nothing measured"):
        redo_runs(small, results, [good, "defaults/sglang/rate-0.28/rep1"], "not run yet")
    assert (results / "runs" / good / "run.json").is_file()
    assert not (results / "redone").exists()


@pytest.fixture
def two_arms(study: dict[str, Any], small: dict[str, Any]) -> dict[str, Any]:
    """`small` with the matched arm too: eight runs, four deployments."""
    cfg = copy.deepcopy(small)
    cfg["arms"]["matched"] = {**copy.deepcopy(study["arms"]["matched"]), "conditions": "all"}
    for key in ("skip_conditions", "flags_by_condition"):
        cfg["arms"]["matched"]["engines"]["sglang"].pop(key)
    validate_config(cfg)
    return cfg


def measured_floors(results: Path, config: dict[str, Any]) -> dict[str, bytes]:
    """Every deployment's floor made before and after its loaded runs, as the workflow lays
    them out (workflow/rules/common.smk, FLOOR_DIR and FLOOR_AFTER_DIR); every file's bytes by
    its path relative to results."""
    for block in floor_blocks(config):
        d = block.deployment
        for kind in ("floor", "floor-after"):
            folder = results / kind / d.id / "runs" / d.arm / d.engine / block.shape.id
            (folder / "rep1" / "measured").mkdir(parents=True)
            (folder / "rep1" / "run.json").write_text(f"{kind} {block.id}")
            (folder / "rep1" / "measured" / "measurement.key").write_text(f"{kind} key")
            (folder / "block.json").write_text("{}")
    return {
        str(p.relative_to(results)): p.read_bytes()
        for kind in ("floor", "floor-after")
        for p in (results / kind).rglob("*")
        if p.is_file()
    }


def floor_deployments(config: dict[str, Any], engine: str) -> set[str]:
    return {b.deployment.id for b in floor_blocks(config) if b.deployment.engine == engine}


def test_redo_engine_moves_both_arms_runs_and_floors_of_that_engine_only(
    two_arms: dict[str, Any], tmp_path: Path
) -> None:
    results = tmp_path / "results"
    # rep3 beyond the configuration's two: made with `snakemake --config repetitions=3`
    run_ids = [
        f"{arm}/{engine}/rate-0.28/rep{k}"
        for arm in ("defaults", "matched")
        for engine in ("vllm", "sglang")
        for k in (1, 2, 3)
    ]
    for run_id in run_ids:
        measured_run(results, run_id)
    floors = measured_floors(results, two_arms)
    sglang_floors = floor_deployments(two_arms, "sglang")
    assert len(sglang_floors) == 2  # one deployment per arm

    redone = redo_engine(two_arms, results, "sglang", "the engine's floors drifted")

    assert sorted(run.run_id for run in redone.runs) == sorted(
        r for r in run_ids if "/sglang/" in r
    )
    assert set(redone.targets) == {run.target for run in redone.runs}
    assert not any(target.exists() for target in redone.targets)
    assert {(f.kind, f.deployment) for f in redone.floors} == {
        (kind, d) for kind in ("floor", "floor-after") for d in sglang_floors
    }
    # the floors after move first: a kill between the moves never leaves a bracket half-judged
    assert [f.kind for f in redone.floors[:2]] == ["floor-after", "floor-after"]
    # vLLM's runs and floors untouched; sglang's moved, every byte kept under the same names
    for run_id in run_ids:
        assert (results / "runs" / run_id / "run.json").exists() == ("/vllm/" in run_id)
    kept = {
        str(p.relative_to(results)): p.read_bytes()
        for kind in ("floor", "floor-after")
        for p in (results / kind).rglob("*")
        if p.is_file()
    }
    assert kept == {k: v for k, v in floors.items() if k.split("/")[1] not in sglang_floors}
    for floor in redone.floors:
        assert floor.folder == results / "redone" / floor.kind / floor.deployment / "001"
        moved = {
            f"{floor.kind}/{floor.deployment}/{p.relative_to(floor.folder)}": p.read_bytes()
            for p in floor.folder.rglob("*")
            if p.is_file() and p.name != "reason.json"
        }
        assert moved == {
            k: v for k, v in floors.items() if k.startswith(f"{floor.kind}/{floor.deployment}/")
        }
        reason = json.loads((floor.folder / "reason.json").read_text())
        assert (reason["engine"], reason["kind"], reason["why"], reason["moved"]) == (
            "sglang",
            floor.kind,
            "the engine's floors drifted",
            ["runs"],
        )
        assert not (results / floor.kind / floor.deployment).exists()


def test_redo_engine_refuses_an_unknown_engine_or_nothing_measured_and_moves_nothing(
    two_arms: dict[str, Any], tmp_path: Path
) -> None:
    results = tmp_path / "results"
    measured_run(results, "defaults/vllm/rate-0.28/rep1")
    with pytest.raises(RedoError, match=r"--engine 'llamacpp' is not an engine.*sglang, vllm"):
        redo_engine(two_arms, results, "llamacpp", "typo")
    with pytest.raises(RedoError, match=r"--engine sglang: nothing measured"):
        redo_engine(two_arms, results, "sglang", "not run yet")
    with pytest.raises(RedoError, match=r"--why must say why"):
        redo_engine(two_arms, results, "vllm", " ")
    assert (results / "runs" / "defaults/vllm/rate-0.28/rep1" / "run.json").is_file()
    assert not (results / "redone").exists()


def test_redo_engine_with_only_floors_names_the_engines_first_run(
    two_arms: dict[str, Any], tmp_path: Path
) -> None:
    # killed after its floor, before any loaded run: the floor moves, and a run is still named
    results = tmp_path / "results"
    measured_floors(results, two_arms)
    redone = redo_engine(two_arms, results, "vllm", "a floor made on a busy machine")
    assert redone.runs == ()
    assert len(redone.floors) == 4
    assert redone.targets == (results / "runs" / "defaults/vllm/rate-0.28/rep1" / "run.json",)


def test_redo_cli_engine_prints_the_moves_and_the_targets(
    two_arms: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(two_arms))
    results = tmp_path / "results"
    for run_id in ("defaults/vllm/rate-0.28/rep1", "matched/vllm/rate-0.28/rep2"):
        measured_run(results, run_id)
    measured_floors(results, two_arms)
    argv = ["campaign", "redo", "--engine", "vllm", "--why", "drift", "--config", str(config)]
    assert main([*argv, "--results", str(results)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("floor-after of ") for line in out) == 2
    assert sum(line.startswith("floor of ") for line in out) == 2
    assert out[-1] == "targets: " + " ".join(
        str(results / "runs" / r / "run.json")
        for r in ("defaults/vllm/rate-0.28/rep1", "matched/vllm/rate-0.28/rep2")
    )
    # a run id and --engine together, or neither: refused, nothing moved
    for extra in (["defaults/sglang/rate-0.28/rep1", "--engine", "sglang"], []):
        argv = ["campaign", "redo", *extra, "--why", "x", "--config", str(config)]
        assert main([*argv, "--results", str(results)]) == 2
        assert "or --engine ENGINE: one of the two" in capsys.readouterr().err
    assert (results / "floor" / next(iter(floor_deployments(two_arms, "sglang")))).is_dir()


@pytest.mark.parametrize("why", ["", "   "])
def test_redo_cli_refuses_an_empty_why_naming_the_option(
    small: dict[str, Any], tmp_path: Path, why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(small))
    results = tmp_path / "results"
    run_id = "defaults/vllm/rate-0.28/rep1"
    measured_run(results, run_id)
    argv = ["campaign", "redo", run_id, "--why", why, "--config", str(config)]
    assert main([*argv, "--results", str(results)]) == 2
    assert "--why must say why" in capsys.readouterr().err
    assert (results / "runs" / run_id / "run.json").is_file()


def test_redo_cli_requires_why(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["campaign", "redo", "defaults/vllm/rate-0.28/rep1"])
    assert exit_info.value.code == 2
    assert "--why" in capsys.readouterr().err


def test_a_redone_run_is_missing_with_the_why_unless_discarded_since(
    small: dict[str, Any], tmp_path: Path
) -> None:
    results = tmp_path / "results"
    run_id = "defaults/vllm/rate-0.28/rep1"
    run = Run(*run_id.split("/"))
    measured_run(results, run_id)
    redo_runs(small, results, [run_id], "new driver")
    assert (run_status(results, run).state, run_status(results, run).reason) == (
        "missing",
        "redone: new driver",
    )
    # a reclamation after the redo discards the rep again: the discard is the latest news
    write_discard(results, "defaults/vllm/rate-0.28", 1, ["rep1"], "reclaimed")
    reason_file = results / "discarded" / "defaults/vllm/rate-0.28" / "001" / "reason.json"
    reason = json.loads(reason_file.read_text())
    reason["discarded_at_unix_s"] = 4e9  # later than the redo
    reason_file.write_text(json.dumps(reason))
    row = run_status(results, run)
    assert (row.state, row.reason, row.discards) == ("discarded", "reclaimed", 1)
