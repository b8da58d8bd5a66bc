"""The resolved-configuration gate on start-up logs in the engines' real formats, for both engines
in both arms: the study's own configurations (tests/fakekube/logs, constructed from the real
format strings and labelled so) and the real logs the engines helper keeps in
tests/data/engine-logs (copied from public sources), including vLLM's `dev` version quirk.
Each log also goes through the pod-log API of the fake cluster once."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from fakekube import FakeCluster, PodScript, backend_for, engine_log, running

from servelab.campaign.deploy import confirm
from servelab.deploy.manifests import render_for, write_rendered
from servelab.engines import ResolvedConfigMismatch, check_resolved, parse_startup_log
from servelab.grid.config import deployment_for

REPO = Path(__file__).resolve().parents[2]
REAL = REPO / "tests" / "data" / "engine-logs"

# Which scenario log each study deployment resolves to (arm, engine, a condition of the arm).
STUDY_LOGS = {
    ("defaults", "vllm", "rate-0.12"): "vllm-0.6.3-defaults",
    ("defaults", "sglang", "rate-0.12"): "sglang-0.4.1-l4",
    ("matched", "vllm", "rate-0.28"): "vllm-0.6.3-matched",
    ("matched", "sglang", "rate-0.28"): "sglang-0.4.1-l4",
    ("matched", "sglang", "length-8192"): "sglang-0.4.1-l4",
}


@pytest.fixture(scope="module")
def study() -> dict:
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def _expect(study: dict, arm: str, engine: str, condition: str) -> dict:
    d = deployment_for(study, arm, engine, condition)
    return {
        "expect_chunked_prefill": d.expect_chunked_prefill,
        "expect_chunk_size": d.expect_chunk_size,
    }


@pytest.mark.parametrize(("key", "log"), sorted(STUDY_LOGS.items()))
def test_each_study_deployment_passes_the_gate_with_its_own_log(
    study: dict, key: tuple, log: str
) -> None:
    arm, engine, condition = key
    text = engine_log(log)
    parsed = parse_startup_log(text)  # engine detected from the text
    assert parsed.engine == engine
    assert parse_startup_log(text, engine=engine).to_dict() == parsed.to_dict()
    assert parsed.context_len == 16384 and parsed.prefix_caching is True
    if engine == "vllm":
        assert parsed.version == "dev"  # the 0.6.3 wheel prints no real version
    check_resolved(parsed, **_expect(study, arm, engine, condition))


@pytest.mark.parametrize(
    ("log", "arm", "engine", "condition", "quoted"),
    [
        (
            "vllm-0.6.3-defaults",
            "matched",
            "vllm",
            "rate-0.28",
            "chunked_prefill_enabled=False multi_step_stream_outputs",
        ),
        (
            "vllm-0.6.3-matched",
            "defaults",
            "vllm",
            "rate-0.12",
            "chunked_prefill_enabled=True multi_step_stream_outputs",
        ),
        ("sglang-0.4.1-chunk8192", "defaults", "sglang", "rate-0.12", "chunked_prefill_size=8192"),
        ("sglang-0.4.1-chunk8192", "matched", "sglang", "length-8192", "chunked_prefill_size=8192"),
    ],
)
def test_gate_refuses_the_other_configuration(
    study: dict, log: str, arm: str, engine: str, condition: str, quoted: str
) -> None:
    parsed = parse_startup_log(engine_log(log), engine=engine)
    with pytest.raises(ResolvedConfigMismatch) as info:
        check_resolved(parsed, **_expect(study, arm, engine, condition))
    assert quoted in str(info.value)


def _real(name: str) -> str:
    path = REAL / name
    if not path.is_file():
        pytest.skip(f"{path} not present (the engines helper's real fixtures)")
    return path.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("name", "arm", "engine", "condition", "accepted", "quoted"),
    [
        # vLLM with chunked prefill off: what the defaults arm expects; not the matched arm.
        ("vllm-0.6.4dev-chunked-off-01.log", "defaults", "vllm", "rate-0.12", True, None),
        (
            "vllm-0.6.4dev-chunked-off-01.log",
            "matched",
            "vllm",
            "rate-0.28",
            False,
            "chunked_prefill_enabled=False",
        ),
        # vLLM with chunked prefill on at 512 tokens: neither arm (matched wants 2048).
        (
            "vllm-0.6.4dev-chunked-on-01.log",
            "matched",
            "vllm",
            "rate-0.28",
            False,
            "max_num_batched_tokens=512",
        ),
        (
            "vllm-0.6.4dev-chunked-on-01.log",
            "defaults",
            "vllm",
            "rate-0.12",
            False,
            "chunked_prefill_enabled=True",
        ),
        # SGLang resolving 2048 (a GPU under 25 GB): what both arms expect.
        ("sglang-0.4.2-chunk2048-01.log", "defaults", "sglang", "rate-0.12", True, None),
        ("sglang-0.4.2-chunk2048-01.log", "matched", "sglang", "length-8192", True, None),
        # SGLang resolving 8192 (an 80 GB GPU): refused in both arms.
        (
            "sglang-0.4.1-01.log",
            "defaults",
            "sglang",
            "rate-0.12",
            False,
            "chunked_prefill_size=8192",
        ),
        # vLLM printing its version as `dev`, engine line cut before the chunked-prefill field:
        # not shown = not confirmed.
        ("vllm-vdev-01.log", "defaults", "vllm", "rate-0.12", False, "not confirmed"),
    ],
)
def test_gate_on_real_logs(
    study: dict,
    name: str,
    arm: str,
    engine: str,
    condition: str,
    accepted: bool,
    quoted: str | None,
) -> None:
    parsed = parse_startup_log(_real(name))
    assert parsed.engine == engine
    if name == "vllm-vdev-01.log":
        assert parsed.version == "dev" and parsed.chunked_prefill is None
    if accepted:
        check_resolved(parsed, **_expect(study, arm, engine, condition))
    else:
        with pytest.raises(ResolvedConfigMismatch) as info:
            check_resolved(parsed, **_expect(study, arm, engine, condition))
        assert quoted in str(info.value)


@pytest.mark.parametrize(
    ("name", "arm", "engine", "condition", "accepted"),
    [
        ("sglang-0.4.2-chunk2048-01.log", "matched", "sglang", "rate-0.12", True),
        ("vllm-0.6.4dev-chunked-on-01.log", "matched", "vllm", "rate-0.28", False),
    ],
)
def test_real_logs_through_the_pod_log_api(
    study: dict, tmp_path: Path, name: str, arm: str, engine: str, condition: str, accepted: bool
) -> None:
    text = _real(name)
    d = deployment_for(study, arm, engine, condition)
    rendered = tmp_path / d.id
    write_rendered(render_for(study, d), rendered)
    spec = {"deployment_id": d.id, "engine": engine, **_expect(study, arm, engine, condition)}
    cluster = FakeCluster(
        {engine: PodScript(text)},
        secrets={("servelab", "hf-token"): {"token": "t" * 10}},
        tick_s=10.0,
    )
    with running(cluster) as kube:
        backend = backend_for(kube)
        deployed = backend.deploy(
            spec, manifest_path=rendered, startup_log_path=tmp_path / "startup.log"
        )
        if accepted:
            record = confirm(spec, deployed)
            assert (record["chunked_prefill"], record["chunk_size"]) == (True, 2048)
        else:
            with pytest.raises(ResolvedConfigMismatch):
                confirm(spec, deployed)
    body = "".join(line for line in text.splitlines(True) if not line.startswith("# source:"))
    assert (tmp_path / "startup.log").read_text() == body
