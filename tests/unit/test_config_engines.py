"""Which engines a config may name, and how a --configfile removes the study's: config/llamacpp.yaml
merged over config/config.yaml as Snakemake merges them, and the checks that refuse what no backend
or analysis can run (naming the key)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from snakemake.utils import update_config

from servelab.grid.config import (
    ConfigError,
    analysis_settings,
    deployment_for,
    drop_removed_engines,
    runs,
    validate_config,
)

REPO = Path(__file__).resolve().parents[2]


def _llamacpp_config() -> dict:
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    update_config(config, yaml.safe_load((REPO / "config" / "llamacpp.yaml").read_text()))
    return drop_removed_engines(config)


def test_the_llamacpp_overlay_leaves_one_real_engine_on_the_local_backend() -> None:
    config = _llamacpp_config()
    validate_config(config)
    assert list(config["engines"]) == ["llamacpp"]
    assert all(list(arm["engines"]) == ["llamacpp"] for arm in config["arms"].values())
    assert config["backend"] == "local"
    assert {r.id for r in runs(config)} == {
        f"{arm}/llamacpp/rate-0.50/{rep}"
        for arm in ("defaults", "matched")
        for rep in ("rep1", "rep2")
    }
    matched = deployment_for(config, "matched", "llamacpp", "rate-0.50")
    assert "--batch-size=256" in matched.flags and matched.expect_chunk_size == 256
    settings = analysis_settings(config)
    assert settings["engines"] == ["llamacpp"] and settings["table_conditions"] == ["rate-0.50"]


def test_a_null_engine_is_removed_everywhere() -> None:
    config = {"engines": {"a": None, "b": {}}, "arms": {"x": {"engines": {"a": None, "b": {}}}}}
    assert drop_removed_engines(config) == {
        "engines": {"b": {}},
        "arms": {"x": {"engines": {"b": {}}}},
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda c: c.update(backend="sim"),
            "engines.llamacpp: the sim backend simulates llama.cpp on the CPU platform only",
        ),
        (
            lambda c: c.update(backend="sim", gpu={"name": "CPU", "memory_mib": 24000}),
            r"gpu.step_cost.llamacpp: the simulator's CPU platform needs",
        ),
        (
            lambda c: c.update(backend="kubernetes"),
            "engines.llamacpp.image: the kubernetes backend",
        ),
        (
            lambda c: c["analysis"].update(table_conditions=["rate-9.00"]),
            r"analysis.table_conditions\[0\]: unknown condition 'rate-9.00'",
        ),
    ],
)
def test_what_cannot_run_is_refused_naming_the_key(change, message: str) -> None:
    config = _llamacpp_config()
    change(config)
    with pytest.raises(ConfigError, match=message):
        validate_config(config)


def test_on_kubernetes_llamacpp_must_print_its_batch_size_itself() -> None:
    """Only the local backend confirms llama-server from a start-up probe: on kubernetes each arm
    is refused until its flags set the verbosity that prints n_batch (and accept its cost)."""
    config = _llamacpp_config()
    config.update(backend="kubernetes")
    with pytest.raises(ConfigError) as refused:
        validate_config(config)
    for arm in ("defaults", "matched"):
        assert f"arms.{arm}.engines.llamacpp.flags: on the kubernetes backend" in str(refused.value)
    config["engines"]["llamacpp"]["flags"].append("--log-verbosity=4")
    with pytest.raises(ConfigError) as still:
        validate_config(config)
    assert "on the kubernetes backend the gate" not in str(still.value)
    assert "engines.llamacpp.image" in str(still.value)  # the image is still missing


def test_a_simulated_engine_needs_the_model_preset(study_config: dict) -> None:
    config = copy.deepcopy(study_config)
    del config["model"]["preset"]
    with pytest.raises(ConfigError, match=r"model.preset: required when a simulated engine runs"):
        validate_config(config)
    # llama.cpp alone does not use it
    llama = _llamacpp_config()
    del llama["model"]["preset"]
    validate_config(llama)
