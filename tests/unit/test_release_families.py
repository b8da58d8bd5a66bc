"""Release families: a product (toy) with two families registered in this test. A version maps to
the family whose rules it follows or is refused naming the nearest implemented releases; a log is
read as the family whose own lines it shows; the config refuses a release its engine does not
implement, naming the key."""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from servelab.engines import EngineSpec, LogFormat, UnknownEngineLog, detect_engine, registered
from servelab.engines.base import EngineFlags, ResolutionError, ResolvedConfig, RuntimeLimits
from servelab.engines.logtext import LogLine, Reader
from servelab.engines.registry import (
    UnsupportedRelease,
    check_release,
    family_for,
    product_of,
    products,
)
from servelab.engines.resolve import resolve
from servelab.grid.config import ConfigError, validate_config

REPO = Path(__file__).resolve().parents[2]
RECORD = re.compile(r"^toy\[(?P<level>INFO|ERROR)\] (?P<msg>.*)$")


def _resolve(
    f: EngineFlags, *, gpu_memory_mib: int, max_pos: int, version: str, gpu_name: str = ""
) -> ResolvedConfig:
    return ResolvedConfig(
        engine="toy",
        version=version,
        printed_version=version,
        model="m",
        served_model_name="m",
        dtype="float32",
        tensor_parallel_size=1,
        gpu_memory_mib=gpu_memory_mib,
        chunked_prefill=True,
        chunked_prefill_rule="toy-default",
        chunk_size=512,
        token_budget=512,
        prefix_caching=True,
        context_len=max_pos,
        schedule_policy="fcfs",
        max_num_seqs=None,
        max_running_requests=4,
        max_total_tokens=None,
        block_size=None,
        memory_fraction=0.5,
        cuda_graph_max_bs=None,
        overlap_schedule=None,
        flags=f.flags,
    )


def _read(lines: list[LogLine]) -> Reader:
    r = Reader()
    for line in lines:
        if line.msg and (m := re.match(r"toyserve (\S+) starting", line.msg)):
            r.put("version", m.group(1), line)
    return r


def _spec(
    name: str, family: str, releases: tuple[str, ...], versions: str, mark: str
) -> EngineSpec:
    return EngineSpec(
        name=name,
        title=f"Toy {family}",
        version=releases[-1],
        printed_version=releases[-1],
        flag_table=((("--model",), "model", "store", "str", "m", None, None, None),),
        resolve=_resolve,
        runtime_limits=lambda r, kv: RuntimeLimits(kv, None, 4, r.context_len, None),
        log=LogFormat(
            record=RECORD,
            markers=(re.compile(r"toyserve \S+ starting"), re.compile(r"engine: ")),
            marker_words=re.compile(r"toyserve|engine: "),
            marker_hint="'toyserve X starting'",
            ready=re.compile(r"listening"),
            read=_read,
            family_marks=(re.compile(mark),),
        ),
        metric_map={},
        metric_series={},
        entrypoint=("toyserve",),
        product="toy",
        family=family,
        releases=releases,
        family_versions=versions,
    )


OLD = _spec("toy", "1", ("1.2",), "<2", r"engine: classic")
NEW = _spec("toy_v2", "2", ("2.3", "2.5"), ">=2", r"engine: v2 ")


@pytest.fixture()
def families() -> Iterator[None]:
    with registered(OLD), registered(NEW):
        yield


def test_a_release_maps_to_the_family_that_implements_it(families: None) -> None:
    assert family_for("toy", "1.2").name == "toy"
    assert family_for("toy", "2.5").name == "toy_v2"
    assert family_for("toy", "v2.3").name == "toy_v2"  # an image tag's leading v
    assert product_of("toy_v2") == "toy"
    assert products()[-1] == "toy"


def test_another_release_is_refused_naming_its_family_and_the_nearest(families: None) -> None:
    with pytest.raises(UnsupportedRelease) as caught:
        family_for("toy", "2.4")
    text = str(caught.value)
    assert "Toy 2 family (>=2; engine toy_v2)" in text
    assert "implements at 2.3, 2.5 only" in text
    assert text.endswith("nearest supported releases: 2.3 (engine toy_v2), 2.5 (engine toy_v2)")
    with pytest.raises(
        UnsupportedRelease,
        match=r"Toy 1 family .*nearest supported releases: "
        r"1\.2 \(engine toy\)$",
    ):
        family_for("toy", "0.9")
    with pytest.raises(UnsupportedRelease, match="not a release number"):
        family_for("toy", "latest")


def test_check_release_points_to_the_engine_whose_rules_a_release_follows(families: None) -> None:
    assert check_release("toy_v2", "2.3") is NEW
    with pytest.raises(UnsupportedRelease, match=r"configure it as engines\.toy_v2"):
        check_release("toy", "2.5")
    with pytest.raises(ResolutionError, match=r"configure it as engines\.toy_v2"):
        resolve("toy", [], gpu_memory_mib=1000, version="2.5")
    assert resolve("toy_v2", [], gpu_memory_mib=1000, version="2.3").version == "2.3"


def test_a_log_is_read_as_the_family_whose_own_lines_it_shows(families: None) -> None:
    common = "toy[INFO] toyserve 2.3 starting\n"
    assert detect_engine(common + "toy[INFO] engine: v2 (budget=512)\n") == "toy_v2"
    assert detect_engine(common + "toy[INFO] engine: classic\n") == "toy"
    # no family's own line: the printed version names the family
    assert detect_engine(common + "toy[INFO] engine: v3 (budget=512)\n") == "toy_v2"
    # neither a family's line nor a version: refused, naming what tells them apart
    with pytest.raises(UnknownEngineLog, match="of no release family servelab can tell") as caught:
        detect_engine("toy[INFO] engine: v3 (budget=512)\n")
    # the message names what tells the families apart, and the --engine choices
    assert "'engine: v2 '" in str(caught.value) and "'engine: classic'" in str(caught.value)
    assert "--engine toy or --engine toy_v2" in str(caught.value)
    with pytest.raises(UnknownEngineLog, match="several Toy 1 release families"):
        detect_engine(common + "toy[INFO] engine: classic\ntoy[INFO] engine: v2 x\n")


def test_the_built_in_families_tell_vllm_releases_apart() -> None:
    assert family_for("vllm", "0.6.3").name == "vllm"
    with pytest.raises(UnsupportedRelease, match=r"vLLM family \(<0\.8; engine vllm\)"):
        family_for("vllm", "0.7.3")


def _config(engine: str, version: str) -> dict[str, Any]:
    study = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config = copy.deepcopy(study)
    config["engines"] = {engine: {"version": version, "port": 9000, "flags": []}}
    for arm in config["arms"].values():
        arm["engines"] = {engine: {"flags": [], "expect": {"chunked_prefill": True}}}
    config["backend"] = "local"
    return config


def test_the_config_refuses_a_release_its_engine_does_not_implement(families: None) -> None:
    validate_config(_config("toy_v2", "2.5"))
    with pytest.raises(ConfigError, match=r"config key engines\.toy\.version: .*engines\.toy_v2"):
        validate_config(_config("toy", "2.3"))
    with pytest.raises(ConfigError, match=r"engines\.toy_v2\.version: .*2\.3 \(engine toy_v2\)"):
        validate_config(_config("toy_v2", "2.4"))


def test_a_spec_must_list_its_own_version_among_its_releases() -> None:
    with pytest.raises(ValueError, match="not one of its releases"):
        dataclasses.replace(NEW, version="9.9")
    with pytest.raises(ValueError):
        dataclasses.replace(NEW, family_versions="not a range")
