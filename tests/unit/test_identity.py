"""servelab.grid.identity: every settings key classified once; identity alone keys a measurement."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from servelab.grid import identity
from servelab.grid.config import _schema_file
from servelab.grid.settings import SECTIONS


def test_every_settings_key_is_classified_exactly_once() -> None:
    schema = _schema_file()["properties"]
    for section, classes in identity.CLASSIFICATION.items():
        assert set(classes) == set(schema[section]["properties"]), section
        assert set(classes) == set(SECTIONS[section].__dataclass_fields__) - {"config_key"}, section
        assert set(classes.values()) <= {identity.IDENTITY, identity.OPERATIONAL}


def test_every_key_that_defines_a_trace_is_classified_as_identity() -> None:
    """`workload`, a condition and its imported `trace`: every key of the schema, once."""
    schema = _schema_file()["properties"]
    item = schema["conditions"]["items"]
    sections = {
        "workload": schema["workload"]["properties"],
        "conditions": item["properties"],
        "conditions.trace": item["properties"]["trace"]["properties"],
    }
    assert set(identity.TRACE_CLASSIFICATION) == set(sections)
    for section, keys in sections.items():
        assert set(identity.TRACE_CLASSIFICATION[section]) == set(keys), section
        assert set(identity.TRACE_CLASSIFICATION[section].values()) == {identity.IDENTITY}


def test_topologies_change_the_offered_load_a_run_is_keyed_by(study_config: dict[str, Any]) -> None:
    from servelab.grid.config import conditions, offered_load

    cond = conditions(study_config)["rate-0.28"]
    base = offered_load(cond, study_config["workload"])
    assert base == 0.28 * 6  # the study's Λ, bit for bit
    mixed = copy.deepcopy(study_config["workload"])
    mixed["topologies"] = [{"shape": "fanout"}, {"shape": "chain", "depth": 2}]
    run = {**RUN, "offered_load_rps": offered_load(cond, mixed)}
    assert run["offered_load_rps"] == 0.28 * 5
    assert identity.run_identity(study_config, run) != identity.run_identity(
        study_config, {**RUN, "offered_load_rps": base}
    )


def test_manifest_keys_are_kubernetes_keys() -> None:
    assert set(identity.MANIFEST_KEYS) <= set(identity.CLASSIFICATION["kubernetes"])


RUN = {"arm": "defaults", "engine": "vllm", "condition": "rate-0.28", "offered_load_rps": 1.4}


def _key(config: dict[str, Any], resolved: dict[str, Any] | None = None) -> str:
    deployment = {"deployment_id": "d", "engine": "vllm", "flags": ["--x"], "image": "i@sha256:0"}
    return identity.measurement_key(
        trace_sha256="0" * 64,
        deployment=identity.deployment_identity(config, deployment),
        run={**identity.run_identity(config, RUN), "rep": "rep1"},
        resolved=resolved or {"chunked_prefill": False, "chunk_size": None, "evidence": {}},
    )


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("dispatch", "health_timeout_s", 5.0),
        ("campaign", "retries", 9),
        ("campaign", "pause_between_runs_s", 600),
        ("telemetry", "prometheus_url", "http://127.0.0.1:1"),
    ],
)
def test_an_operational_key_leaves_the_measurement_key(
    study_config: dict[str, Any], section: str, key: str, value: Any
) -> None:
    changed = copy.deepcopy(study_config)
    changed[section][key] = value
    assert _key(changed) == _key(study_config)


@pytest.mark.parametrize(
    ("key", "value"),
    [("multiplicity", "holm"), ("phi_guard", 1.5), ("table_conditions", ["rate-0.28"])],
)
def test_an_analysis_key_is_no_part_of_a_measurement(
    study_config: dict[str, Any], key: str, value: Any
) -> None:
    """`analysis:` settings are inputs of the analysis rules only (their params): changing one
    re-runs the analysis, never a measurement, so none is classified here."""
    changed = copy.deepcopy(study_config)
    changed["analysis"][key] = value
    assert _key(changed) == _key(study_config)
    assert "analysis" not in identity.CLASSIFICATION


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("dispatch", "request_timeout_s", 1.0),
        ("dispatch", "client", "httpx"),
        ("campaign", "success_threshold", 0.5),
        ("telemetry", "step_s", 9.0),
    ],
)
def test_an_identity_key_changes_the_measurement_key(
    study_config: dict[str, Any], section: str, key: str, value: Any
) -> None:
    changed = copy.deepcopy(study_config)
    changed[section][key] = value
    assert _key(changed) != _key(study_config)


def test_kubernetes_settings_never_key_a_measurement(study_config: dict[str, Any]) -> None:
    changed = copy.deepcopy(study_config)
    changed["kubernetes"] = {"kubeconfig": "/k", "timeouts": {"poll_s": 1}, "namespace": "n"}
    assert _key(changed) == _key(study_config)


def test_a_default_spelled_out_changes_nothing(study_config: dict[str, Any]) -> None:
    without = copy.deepcopy(study_config)
    without["dispatch"].pop("client", None)
    with_default = copy.deepcopy(without)
    with_default["dispatch"]["client"] = "paced"
    assert _key(without) == _key(with_default)


def test_the_resolved_values_key_the_measurement_not_their_log_lines(
    study_config: dict[str, Any],
) -> None:
    a = {"chunked_prefill": True, "chunk_size": 2048, "evidence": {"chunk_size": "line at 10:00"}}
    b = {**a, "evidence": {"chunk_size": "line at 11:00"}}
    assert _key(study_config, a) == _key(study_config, b)
    assert _key(study_config, a) != _key(study_config, {**a, "chunk_size": 512})


def test_operational_settings_fill_defaults(study_config: dict[str, Any]) -> None:
    ops = identity.operational_settings(study_config)
    assert ops["kubernetes"]["timeouts"]["poll_s"] == 5.0
    assert "request_timeout_s" not in ops["dispatch"]
    assert set(ops["campaign"]) == {"pause_between_runs_s", "retries", "gpu_nodes", "faults"}
    assert ops["campaign"]["gpu_nodes"] == 1
