"""Typed settings (servelab.grid.settings): the schema and the dataclasses name the same keys, every
default lives in the dataclasses, and sections merge as documented."""

from __future__ import annotations

import copy
import dataclasses
import typing
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml

from servelab.deploy.manifests import DEFAULTS, resolve_settings
from servelab.grid.config import validate_config
from servelab.grid.settings import (
    SECTIONS,
    DispatchSettings,
    KubernetesSettings,
    KubernetesTimeouts,
    Settings,
    SettingsError,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    text = (
        resources.files("servelab.grid").joinpath("config.schema.yaml").read_text(encoding="utf-8")
    )
    return yaml.safe_load(text)


@pytest.fixture(scope="module")
def study() -> dict[str, Any]:
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _compare(cls: type[Any], section: dict[str, Any], where: str, problems: list[str]) -> None:
    """Collect every disagreement between a dataclass and its schema object."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    properties = section.get("properties", {})
    if set(properties) != set(fields):
        problems.append(
            f"{where}: schema keys {sorted(properties)} but dataclass fields {sorted(fields)}"
        )
    required = set(section.get("required", []))
    for name in sorted(set(fields) - required):
        if _default(fields[name]) is dataclasses.MISSING:
            problems.append(f"{where}.{name}: the config may leave it out, but it has no default")
    hints = typing.get_type_hints(cls)
    for name, f in fields.items():
        sub = properties.get(name, {})
        if "default" in sub and sub["default"] != _default(f):
            problems.append(f"{where}.{name}: schema default {sub['default']!r} != {_default(f)!r}")
        if dataclasses.is_dataclass(hints[name]):
            _compare(hints[name], sub, f"{where}.{name}", problems)


def test_schema_and_dataclasses_name_the_same_keys(schema: dict[str, Any]) -> None:
    problems: list[str] = []
    for key, cls in SECTIONS.items():
        _compare(cls, schema["properties"][key], key, problems)
    assert problems == []


def test_the_comparison_sees_a_disagreement(schema: dict[str, Any]) -> None:
    """The check above can fail: a renamed key, a dropped default, a schema default that differs."""
    bad = copy.deepcopy(schema["properties"]["kubernetes"])
    bad["properties"]["timeouts"]["properties"]["poll_interval_s"] = bad["properties"]["timeouts"][
        "properties"
    ].pop("poll_s")
    bad["properties"]["namespace"]["default"] = "elsewhere"
    problems: list[str] = []
    _compare(KubernetesSettings, bad, "kubernetes", problems)
    assert len(problems) == 2
    assert problems[0] == "kubernetes.namespace: schema default 'elsewhere' != 'servelab'"
    assert problems[1].startswith("kubernetes.timeouts: schema keys")
    dispatch = copy.deepcopy(schema["properties"]["dispatch"])
    dispatch["required"].remove("warmup_requests")
    problems = []
    _compare(DispatchSettings, dispatch, "dispatch", problems)
    assert problems == [
        "dispatch.warmup_requests: the config may leave it out, but it has no default"
    ]


def test_the_study_config_reads_back_key_for_key(study: dict[str, Any]) -> None:
    settings = Settings.from_config(study)
    for key in ("dispatch", "campaign", "telemetry"):
        typed = getattr(settings, key)
        for name, value in study[key].items():
            got = getattr(typed, name)
            assert (list(got) if isinstance(got, tuple) else got) == value, f"{key}.{name}"
    assert settings.kubernetes.as_dict() == study["kubernetes"]


def test_a_key_the_config_leaves_out_takes_the_dataclass_default(study: dict[str, Any]) -> None:
    config = copy.deepcopy(study)
    config["dispatch"].pop("client", None)
    config["dispatch"].pop("workers", None)
    validate_config(config)
    default = DispatchSettings(warmup_requests=1, request_timeout_s=1.0)
    assert Settings.from_config(config).dispatch.client == default.client
    assert Settings.from_config(config).dispatch.workers == default.workers
    config["dispatch"]["client"] = "httpx"
    config["dispatch"]["health_timeout_s"] = 12
    typed = Settings.from_config(config).dispatch
    assert (typed.client, typed.health_timeout_s) == ("httpx", 12.0)
    assert isinstance(typed.health_timeout_s, float)


def test_kubernetes_sections_merge_key_by_key_and_mappings_replace() -> None:
    merged = KubernetesSettings.from_section(
        {
            "timeouts": {"poll_s": 7},
            "node_selector": {"pool": "gpu"},
            "pod_monitor": {"interval": "1m"},
        }
    )
    assert merged.timeouts == dataclasses.replace(KubernetesTimeouts(), poll_s=7.0)
    assert merged.node_selector == {"pool": "gpu"}  # the accelerator label is gone
    assert merged.pod_monitor.labels == KubernetesSettings().pod_monitor.labels
    assert merged.pod_monitor.interval_s == 60
    # the manifests read the same merge
    assert resolve_settings({"timeouts": {"poll_s": 7}})["timeouts"]["poll_s"] == 7
    assert KubernetesSettings().as_dict() == DEFAULTS


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"namepsace": "x"}, r"config key kubernetes: unknown key\(s\) 'namepsace'"),
        ({"timeouts": {"poll": 1}}, r"config key kubernetes\.timeouts: unknown key\(s\) 'poll'"),
        ({"timeouts": 5}, r"config key kubernetes\.timeouts: expected a mapping"),
    ],
)
def test_a_bad_kubernetes_section_names_the_key(section: dict[str, Any], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        KubernetesSettings.from_section(section)


def test_a_section_missing_a_required_key_names_it() -> None:
    with pytest.raises(SettingsError, match=r"config key telemetry: .*prometheus_url"):
        Settings.from_config(
            {
                "dispatch": {"warmup_requests": 1, "request_timeout_s": 1},
                "campaign": {"pause_between_runs_s": 0, "success_threshold": 1, "retries": 0},
                "telemetry": {"step_s": 5},
            }
        )


def test_typed_settings_are_frozen() -> None:
    settings = DispatchSettings(warmup_requests=1, request_timeout_s=1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.client = "httpx"  # type: ignore[misc]
