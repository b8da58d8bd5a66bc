"""The ablations of config/ablations/ (docs/ablations.md): loaded, merged and validated as the
workflow does, each expectation tied to the engines' own rules, and the gate refusing what an
ablation does not expect."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from servelab.analysis.ablations import ablation_summary
from servelab.artifacts import TRACE_SCHEMA, read_parquet
from servelab.campaign.ablations import (
    ABLATIONS_DIR,
    Ablation,
    ablation_files,
    derive_memory_fraction,
    load_ablations,
    logged_kv_capacity,
)
from servelab.campaign.deploy import gate
from servelab.engines import ResolvedConfigMismatch, resolve
from servelab.engines.defaults import GpuSpec, defaults_diff
from servelab.grid.config import (
    ConfigError,
    Deployment,
    arm_conditions,
    conditions,
    config_text,
    deployment_for,
    deployment_record,
    drop_removed_engines,
    prepare_config,
    read_config_file,
    runs,
)
from servelab.sim.presets import GPUS, model_preset
from servelab.sim.run import sim_deploy
from servelab.workflow_io import ABLATIONS_ENV, ablations_requested
from servelab.workload import compile_from_config

REPO = Path(__file__).resolve().parents[2]
# The seven ablations of issue 29, each variant its own campaign.
EXPECTED = [
    "gpus/a100-40gb",
    "gpus/a100-80gb",
    "gpus/h100-80gb",
    "matched-memory",
    "matched-sharing",
    "real-trace",
    "run-length/300s",
    "run-length/600s",
    "run-length/1200s",
    "sglang-fcfs",
    "topologies/chain-2",
    "topologies/mix",
]


def deployments(config: dict) -> dict[Deployment, str]:
    """Every deployment of the grid, with the first condition it runs."""
    found: dict[Deployment, str] = {}
    for run in runs(config):
        found.setdefault(deployment_for(config, run.arm, run.engine, run.condition), run.condition)
    return found


@pytest.fixture(scope="module")
def ablations() -> dict[str, Ablation]:
    return {a.id: a for a in load_ablations(REPO)}


def _deploy_log(tmp_path: Path, ablation: Ablation, arm: str, engine: str, condition: str) -> str:
    """The simulated start-up log of one deployment of the ablation (the sim backend's)."""
    config = ablation.config
    deployment = deployment_for(config, arm, engine, condition)
    out = tmp_path / f"{deployment.id}.log"
    sim_deploy(
        engine=engine,
        flags=list(deployment.flags),
        gpu_name=config["gpu"]["name"],
        gpu_memory_mib=int(config["gpu"]["memory_mib"]),
        model_preset=config["model"]["preset"],
        deployment_id=deployment.id,
        startup_log_path=out,
        timestamp=datetime(2026, 1, 1, tzinfo=UTC),
    )
    return out.read_text()


def test_every_ablation_is_found_validated_and_has_its_own_folder(
    ablations: dict[str, Ablation],
) -> None:
    assert sorted(ablations, key=EXPECTED.index) == EXPECTED
    for ablation in ablations.values():
        assert ablation.results_dir == f"results/ablations/{ablation.id}"
        assert ablation.config["backend"] == "sim"
        assert ablation.question.endswith("?")
        assert [s[0] for s in ablation.sources][-1] == ablation.overlay
        assert runs(ablation.config)  # a grid to run
    assert len({a.slug for a in ablations.values()}) == len(ablations)
    # A plain overlay for --configfile (no `ablation:` section) is not an ablation.
    files = [p.name for p in ablation_files(REPO)]
    assert "cpu-sglang-lpm.yaml" not in files
    assert (REPO / ABLATIONS_DIR / "cpu-sglang-lpm.yaml").is_file()


def test_sglang_fcfs_expects_fcfs_in_the_matched_arm_only(
    ablations: dict[str, Ablation], tmp_path: Path
) -> None:
    ablation = ablations["sglang-fcfs"]
    config = ablation.config
    assert config["analysis"]["control_differs"] is True
    for condition in arm_conditions(config, "matched", "sglang"):
        matched = deployment_for(config, "matched", "sglang", condition)
        assert "--schedule-policy=fcfs" in matched.flags
        assert matched.expect_schedule_policy == "fcfs"
    defaults = deployment_for(config, "defaults", "sglang", "rate-0.28")
    assert defaults.expect_schedule_policy == "lpm"
    assert not any(f.startswith("--schedule-policy") for f in defaults.flags)
    # The gate confirms each policy from the simulated start-up log...
    for arm, policy in (("matched", "fcfs"), ("defaults", "lpm")):
        record = deployment_record(config, deployment_for(config, arm, "sglang", "rate-0.28"))
        resolved = gate(record, _deploy_log(tmp_path, ablation, arm, "sglang", "rate-0.28"))
        assert resolved["schedule_policy"] == policy
        assert "schedule_policy='" + policy + "'" in resolved["evidence"]["schedule_policy"]
    # ...and refuses the other: an SGLang that resolved lpm where fcfs is expected.
    record = deployment_record(config, deployment_for(config, "matched", "sglang", "rate-0.28"))
    lpm_log = _deploy_log(tmp_path, ablation, "defaults", "sglang", "rate-0.28")
    with pytest.raises(ResolvedConfigMismatch, match="resolved schedule_policy=lpm, expected fcfs"):
        gate(record, lpm_log)


def test_a_deployment_that_expects_no_policy_has_the_record_it_always_had(
    ablations: dict[str, Ablation],
) -> None:
    """Only an arm that expects a policy or a capacity adds it to the record (and the identity)."""
    study = ablations["sglang-fcfs"].config
    vllm = deployment_record(study, deployment_for(study, "matched", "vllm", "rate-0.28"))
    assert set(vllm) == {
        "deployment_id",
        "arm",
        "engine",
        "flags",
        "image",
        "port",
        "expect_chunked_prefill",
        "expect_chunk_size",
    }


def test_matched_memory_gives_every_deployment_the_same_kv_capacity(
    ablations: dict[str, Ablation], tmp_path: Path
) -> None:
    ablation = ablations["matched-memory"]
    config = ablation.config
    derived = {(d["arm"], d["engine"]): d for d in ablation.derived}
    assert set(derived) == {(a, e) for a in ("defaults", "matched") for e in ("vllm", "sglang")}
    # What each engine's own rule gave before: docs/simulator.md's table.
    assert derived[("defaults", "vllm")]["default_kv_capacity_tokens"] == 19408
    assert derived[("matched", "vllm")]["default_kv_capacity_tokens"] == 31056
    assert derived[("defaults", "sglang")]["default_kv_capacity_tokens"] == 30273
    assert {d["default_value"] for d in ablation.derived} == {"0.88", "0.85"}
    # The study's fractions are gone from the base flags: each arm passes its derived one.
    assert not any("--gpu-memory-utilization" in f for f in config["engines"]["vllm"]["flags"])
    assert not any("--mem-fraction-static" in f for f in config["engines"]["sglang"]["flags"])
    for deployment, condition in deployments(config).items():
        assert deployment.expect_kv_capacity_tokens == 30272
        d = derived[(deployment.arm, deployment.engine)]
        assert deployment.flags.count(f"{d['flag']}={d['value']}") == 1
        assert logged_kv_capacity(config, deployment.engine, deployment.flags) == 30272
        # The gate reads the capacity from the start-up log and shows it in resolved.json.
        text = _deploy_log(tmp_path, ablation, deployment.arm, deployment.engine, condition)
        resolved = gate(deployment_record(config, deployment), text)
        assert resolved["kv_capacity_tokens"] == 30272
    # The study's vLLM under defaults holds 19,408 tokens: refused where 30,272 are expected.
    study_log = _deploy_log(tmp_path, ablations["sglang-fcfs"], "defaults", "vllm", "rate-0.28")
    record = deployment_record(config, deployment_for(config, "defaults", "vllm", "rate-0.28"))
    with pytest.raises(ResolvedConfigMismatch, match="kv_capacity_tokens=19408, expected 30272"):
        gate(record, study_log)


def test_a_capacity_no_fraction_gives_is_refused_naming_the_neighbours(
    ablations: dict[str, Ablation],
) -> None:
    config = ablations["sglang-fcfs"].config
    flags = [f for f in config["engines"]["vllm"]["flags"] if "gpu-memory" not in f]

    def tokens_at(value: str) -> int:
        return logged_kv_capacity(config, "vllm", [*flags, f"--gpu-memory-utilization={value}"])

    # vLLM unchunked (a 16,384-token profiling pass): the defaults arm's derived value
    assert derive_memory_fraction(tokens_at, 30272, what="x") == "0.9389"
    with pytest.raises(ValueError, match="gives 30272 and then 30288"):
        derive_memory_fraction(tokens_at, 30273, what="x")  # vLLM allocates 16-token blocks


def test_the_gpus_expectations_are_the_engines_own_rules(ablations: dict[str, Ablation]) -> None:
    """Each GPU's defaults as the engines resolve them (results/defaults_diff.csv's rule), and the
    study's matching: vLLM takes the chunk SGLang resolves by default."""
    for variant, name in (
        ("a100-40gb", "A100-40GB"),
        ("a100-80gb", "A100-80GB"),
        ("h100-80gb", "H100-80GB"),
    ):
        config = ablations[f"gpus/{variant}"].config
        assert config["gpu"] == {"name": name, "memory_mib": GPUS[name].memory_mib}
        max_pos = model_preset(config["model"]["preset"]).max_position_embeddings
        sglang_default = None
        for deployment in deployments(config):
            resolved = resolve(
                deployment.engine,
                list(deployment.flags),
                gpu_memory_mib=config["gpu"]["memory_mib"],
                model_max_position_embeddings=max_pos,
                gpu_name=name,
            )
            assert resolved.chunked_prefill == deployment.expect_chunked_prefill, deployment
            if deployment.expect_chunked_prefill:
                assert resolved.chunk_size == deployment.expect_chunk_size, deployment
            if (deployment.arm, deployment.engine) == ("defaults", "sglang"):
                sglang_default = resolved.chunk_size
        matched = {d.engine: d.expect_chunk_size for d in deployments(config) if d.arm == "matched"}
        assert matched == {"vllm": sglang_default, "sglang": sglang_default}
        rows = defaults_diff(
            {
                e: [
                    *config["engines"][e]["flags"],
                    *config["arms"]["defaults"]["engines"][e]["flags"],
                ]
                for e in ("vllm", "sglang")
            },
            [GpuSpec(name, config["gpu"]["memory_mib"])],
            versions={e: config["engines"][e]["version"] for e in ("vllm", "sglang")},
            model_max_position_embeddings=max_pos,
        )
        chunk = {r["setting"]: r for r in rows}["chunk_size"]
        assert chunk["sglang"] == str(sglang_default)


def test_run_length_and_matched_sharing_grids(ablations: dict[str, Ablation]) -> None:
    for length in (300, 600, 1200):
        config = ablations[f"run-length/{length}s"].config
        grid = conditions(config)
        assert sorted(grid) == ["rate-0.28", "rate-0.40"]
        assert {c.duration_s for c in grid.values()} == {float(length)}
        for arm in ("defaults", "matched"):
            for engine in ("vllm", "sglang"):
                assert arm_conditions(config, arm, engine) == ["rate-0.28", "rate-0.40"]
    config = ablations["matched-sharing"].config
    sharing = [c for c, cond in conditions(config).items() if cond.sweep == "sharing"]
    assert len(sharing) == 5 and sorted(conditions(config)) == sorted(sharing)
    for engine in ("vllm", "sglang"):
        assert arm_conditions(config, "matched", engine) == sharing
    assert config["analysis"]["table_conditions"] == sharing


def test_null_removes_an_arm_engines_condition_keys() -> None:
    config = {
        "engines": {"vllm": {}},
        "arms": {"matched": {"engines": {"vllm": {"flags_by_condition": None, "flags": []}}}},
    }
    assert drop_removed_engines(config)["arms"]["matched"]["engines"]["vllm"] == {"flags": []}


def _write(root: Path, name: str, text: str) -> None:
    (root / ABLATIONS_DIR).mkdir(parents=True, exist_ok=True)
    (root / ABLATIONS_DIR / name).write_text(text)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("Bad_Name.yaml", "ablation: {question: q}\n", "file name must match"),
        ("x.yaml", "ablation: {}\n", "'question' is a required property"),
        ("x.yaml", "ablation: {question: q, colour: red}\n", "Additional properties"),
        ("x.yaml", "ablation: {question: q, variants: {Big: {}}}\n", "does not match"),
        ("x.yaml", "ablation: {question: q}\nrepetitions: 0\n", "x.yaml: invalid configuration"),
        (
            "x.yaml",
            "ablation: {question: q, variants: {a: {repetitions: 0}}}\n",
            "x.yaml, variant a: invalid configuration",
        ),
    ],
)
def test_a_bad_ablation_is_refused_naming_its_file(
    tmp_path: Path, name: str, text: str, message: str
) -> None:
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text((REPO / "config" / "config.yaml").read_text())
    _write(tmp_path, name, text)
    with pytest.raises(ConfigError, match=message) as info:
        load_ablations(tmp_path)
    assert name in str(info.value)


def test_a_variant_is_laid_over_the_overlay_over_its_base(tmp_path: Path) -> None:
    for name in ("config.yaml", "test.yaml"):
        (tmp_path / "config").mkdir(exist_ok=True)
        (tmp_path / "config" / name).write_text((REPO / "config" / name).read_text())
    _write(
        tmp_path,
        "tiny.yaml",
        "ablation:\n  question: q?\n  base: [config/config.yaml, config/test.yaml]\n"
        "  variants: {one: {repetitions: 1}}\nrepetitions: 3\n",
    )
    (ablation,) = load_ablations(tmp_path)
    assert (ablation.id, ablation.slug) == ("tiny/one", "tiny_one")
    assert ablation.config["repetitions"] == 1  # the variant over the overlay
    assert len(ablation.config["conditions"]) == 3  # config/test.yaml over config/config.yaml
    record = ablation.record()
    assert [s["file"] for s in record["sources"]] == [
        "config/config.yaml",
        "config/test.yaml",
        "config/ablations/tiny.yaml",
    ]
    assert json.loads(json.dumps(record)) == record


def test_ablations_are_loaded_only_when_the_command_names_one() -> None:
    assert ablations_requested(["--cores", "1", "ablations"], {})
    assert ablations_requested(["-n", "results/ablations/gpus/h100-80gb/ablation.json"], {})
    assert ablations_requested(["ablation_sglang_fcfs"], {})
    assert not ablations_requested(["--cores", "1", "results/table5.csv"], {})
    assert not ablations_requested([], {})
    assert ablations_requested(["--lint"], {ABLATIONS_ENV: "1"})
    assert not ablations_requested(["ablations"], {ABLATIONS_ENV: "0"})


def test_the_summary_labels_every_table5_row_with_its_ablation(tmp_path: Path) -> None:
    header = "condition,metric,defaults_gap,matched_gap\n"
    (tmp_path / "study.csv").write_text(header + "rate-0.28,ttft_p50,43.8,2.06\n")
    (tmp_path / "fcfs.csv").write_text(header + "rate-0.28,ttft_p50,43.8,1.5\nrate-0.12,x,1,1\n")
    (tmp_path / "h100.csv").write_text(header + "rate-0.28,ttft_p50,1.1,1.0\n")
    text = ablation_summary(
        [
            {"ablation": "study", "variant": None},
            {"ablation": "sglang-fcfs", "variant": None},
            {"ablation": "gpus", "variant": "h100-80gb"},
        ],
        [tmp_path / "study.csv", tmp_path / "fcfs.csv", tmp_path / "h100.csv"],
    )
    assert text == (
        "ablation,variant,condition,metric,defaults_gap,matched_gap\n"
        "study,,rate-0.28,ttft_p50,43.8,2.06\n"
        "sglang-fcfs,,rate-0.28,ttft_p50,43.8,1.5\n"
        "sglang-fcfs,,rate-0.12,x,1,1\n"
        "gpus,h100-80gb,rate-0.28,ttft_p50,1.1,1.0\n"
    )
    (tmp_path / "odd.csv").write_text("condition,metric\n")
    with pytest.raises(ValueError, match="differ from the first table's"):
        ablation_summary(
            [{"ablation": "study"}, {"ablation": "odd"}],
            [tmp_path / "study.csv", tmp_path / "odd.csv"],
        )


def test_the_configuration_an_ablation_ran_is_written_back_as_it_is_read(
    ablations: dict[str, Ablation], tmp_path: Path
) -> None:
    """results/ablations/ID/config.yaml: the merged, derived configuration, which the campaign
    commands read with --config."""
    for ablation in ablations.values():
        path = tmp_path / f"{ablation.slug}.yaml"
        path.write_text(config_text(ablation.config))
        again = read_config_file(path)
        assert again == ablation.config
        assert prepare_config(again) == ablation.config


def test_every_gpu_preset_is_cited_with_its_numbers() -> None:
    """Each GPU of the cost model states its data-sheet FLOPs and bandwidth and its nvidia-smi
    memory in docs/simulator.md (and presets.py cites the sheet beside each constant)."""
    doc = " ".join((REPO / "docs" / "simulator.md").read_text().split())
    source = (REPO / "src" / "servelab" / "sim" / "presets.py").read_text()
    for name, gpu in GPUS.items():
        if name == "CPU":
            continue
        assert f"{gpu.peak_bf16_flops / 1e12:.0f} TFLOPS" in doc, name
        assert f"{gpu.mem_bandwidth / 1e9:,.0f} GB/s" in doc, name
        assert f"{gpu.memory_mib:,}" in doc, name
        assert f'"{name}": GpuPreset(' in source
    assert "data sheet" in source and "modal-labs/modal-client pull request #2797" in source


TOPOLOGIES = """
ablation:
  question: Do the gaps hold for deeper chains and a mix of graph shapes?
  variants:
    chain-4: {workload: {topologies: [{shape: chain, depth: 4}]}}
    mix: {workload: {topologies: [{shape: fanout, weight: 2}, {shape: chain, depth: 2}]}}
"""


def test_a_topologies_ablation_is_one_file(tmp_path: Path) -> None:
    """docs/ablations.md's example: the workload's topologies (issue 29's workload part) reach each
    variant's campaign, the rest of the study's configuration unchanged."""
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text((REPO / "config" / "config.yaml").read_text())
    _write(tmp_path, "topologies.yaml", TOPOLOGIES)
    found = {a.id: a for a in load_ablations(tmp_path)}
    assert sorted(found) == ["topologies/chain-4", "topologies/mix"]
    chain = found["topologies/chain-4"].config["workload"]
    assert chain["topologies"] == [{"shape": "chain", "depth": 4}]
    assert chain["workers_per_graph"] == 4  # the study's, merged key by key
    assert len(found["topologies/mix"].config["workload"]["topologies"]) == 2
    assert found["topologies/mix"].results_dir == "results/ablations/topologies/mix"


def _graphs(trace: Path) -> list[list[tuple[str, list[str]]]]:
    """Each graph of a compiled trace as its rows' (role, predecessors' roles), in row order."""
    rows = read_parquet(trace, TRACE_SCHEMA).to_pylist()
    role = {r["request_id"]: r["role"] for r in rows}
    graphs: dict[int, list[tuple[str, list[str]]]] = {}
    for r in rows:
        graphs.setdefault(r["graph_id"], []).append((r["role"], [role[d] for d in r["depends_on"]]))
    return list(graphs.values())


def test_the_topologies_ablation_compiles_a_chain_and_a_mix(
    ablations: dict[str, Ablation], tmp_path: Path
) -> None:
    """config/ablations/topologies.yaml: `chain-2` is planner -> worker -> worker -> aggregator in
    every graph; `mix` draws all three shapes. Compiled at λ 0.28 for 200 s (the shipped grid's
    rate, a shorter run), as the compile rule does."""
    shapes = {}
    for variant in ("chain-2", "mix"):
        config = copy.deepcopy(ablations[f"topologies/{variant}"].config)
        (rate,) = [c for c in config["conditions"] if c["rate"] == 0.28]
        config["conditions"] = [{**rate, "duration_s": 200}]
        out = tmp_path / variant
        manifest = compile_from_config(
            config,
            "rate-0.28",
            "rep1",
            trace_path=out / "trace.parquet",
            manifest_path=out / "manifest.json",
        )
        graphs = _graphs(out / "trace.parquet")
        assert len(graphs) == manifest["n_graphs"] > 20
        shapes[variant] = {tuple((role, tuple(before)) for role, before in g) for g in graphs}
        assert manifest["requests_per_graph"] == {"chain-2": 4, "mix": 5.5}[variant]
    p, w = ("planner", ()), ("worker", ("planner",))
    fanout = (p, w, w, w, w, ("aggregator", ("worker",) * 4))
    # chain-2: two sequential worker stages, the second waiting for the first
    chain = (p, w, ("worker", ("worker",)), ("aggregator", ("worker",)))
    second = ("worker", ("worker", "worker"))
    layers = (p, w, w, second, second, ("aggregator", ("worker", "worker")))
    assert shapes == {"chain-2": {chain}, "mix": {fanout, chain, layers}}
    drawn = {
        t["name"]: t["graphs"]
        for t in json.loads((tmp_path / "mix" / "manifest.json").read_text())["topologies"]
    }
    assert set(drawn) == {"fanout-4", "chain-2", "layers-2x2"} and min(drawn.values()) > 0
