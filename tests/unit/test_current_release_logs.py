"""The current release families (vLLM V1, SGLang 0.5) on real logs and /metrics texts.

The texts are in tests/data/engine-logs (vllm-v1-*.log, sglang-0.5*.log, sglang-unversioned-*.log and
three metrics texts), each with its provenance on its first `# source:` line; the values read by hand
from each log (no parser involved) are in expected/<log name>.json. Where the parser deliberately
gives another value than the hand reading, the JSON says so in "parser_differs" ({field: {"parser":
value, "reason": ...}}) and the parser must give exactly that value; where it cites another line that
shows the same value, the JSON says so in "parser_evidence" ({field: {"contains": ..., "reason":
...}}).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from servelab.engines import (
    UnknownEngineLog,
    canonical_values,
    detect_engine,
    parse_metrics_text,
    parse_startup_log,
)
from servelab.engines.registry import product_of, release_family

DATA = Path(__file__).resolve().parents[1] / "data" / "engine-logs"
EXPECTED = DATA / "expected"

# The JSON's "family" -> the registered engine (release family) name.
FAMILY_ENGINE = {"vllm-v1": "vllm_v1", "sglang-0.5": "sglang_v05"}
# Each product's families' --engine choices (the old study family and the current one).
ENGINE_CHOICES = {"vllm": ("vllm", "vllm_v1"), "sglang": ("sglang", "sglang_v05")}

LOGS = sorted(
    p.name
    for pattern in ("vllm-v1-*.log", "sglang-0.5*.log", "sglang-unversioned-*.log")
    for p in DATA.glob(pattern)
)

# The fields compared with the hand reading (JSON name -> ParsedLog attribute).
FIELDS = {
    "version_printed": "version",
    "chunked_prefill": "chunked_prefill",
    "chunk_size": "chunk_size",
    "prefix_caching": "prefix_caching",
    "context_len": "context_len",
    "schedule_policy": "schedule_policy",
}

# Truncated excerpts, named here so that a changed file is caught: each one's source line flags it
# "TRUNCATED" or "EXCERPT" (upper case, as the README's list does), and no other log's does.
TRUNCATED = {
    "vllm-v1-0.10.2.dev378-01.log",  # ends inside the engine line at "quantization="
    "vllm-v1-0.8.1-01.log",  # ends inside the engine line (observability_config=...)
    "vllm-v1-0.8.3.dev244-01.log",  # ends inside compilation_config
    "vllm-v1-0.8.3-01.log",  # ends at "(EngineCore_7 pid=2095681) I"
    "sglang-0.5.10-01.log",  # EXCERPT of a runtime crash
    "sglang-0.5.11.dev20260512-01.log",  # EXCERPT: the log's tail only
    "sglang-unversioned-20251130-01.log",  # ends mid-line "[2025-11-30 1"
    "sglang-unversioned-20251204-01.log",
    "sglang-unversioned-20260114-01.log",  # ends inside server_args
    "sglang-unversioned-20260303-01.log",  # ends mid-path in the traceback
    "sglang-unversioned-20260508-h200-01.log",  # the last six start-up lines only
    "sglang-unversioned-20260628-01.log",  # one scheduler line
}

# Logs whose every engine line carries a prefix before the logger record.
COMPOSE_PREFIX = re.compile(r"^[\w.-]+\s+\| ")  # docker compose: "vllm-ovis  | "
PROCESS_PREFIX = re.compile(r"^\((?:APIServer|EngineCore\w*) pid=\d+\) ")  # vLLM's own
K8S_PREFIX = re.compile(r"^\d{13}\t\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z\t")  # log collector
PREFIXED = {
    "vllm-v1-0.11.2.dev69-01.log": COMPOSE_PREFIX,
    "vllm-v1-0.11.2.dev69-02.log": COMPOSE_PREFIX,
    "vllm-v1-0.10.2-01.log": PROCESS_PREFIX,
    "vllm-v1-0.10.2-02.log": PROCESS_PREFIX,
    "vllm-v1-0.8.3-01.log": PROCESS_PREFIX,  # data-parallel "(EngineCore_1 pid=...)"
    # SGLang: no compose- or kubectl-prefixed START-UP log of 0.5 was found (README "Gaps"); the one
    # prefixed SGLang file is this k8s/LWS log-collector excerpt of a runtime crash (no config
    # lines, no start-up).
    "sglang-0.5.10-01.log": K8S_PREFIX,
}

# Logs whose release family detect_engine cannot tell (it raises UnknownEngineLog asking for
# --engine). All are SGLang: SGLang prints no version, and these texts show none of the lines that
# tell 0.5 from 0.4 (the resolved-dict server_args, a ServerArgs(...) with fields new in 0.5, or
# "Prefill batch, #new-seq"): scheduler-summary-only excerpts (20251130, 20251204, 20260508-h200,
# 20260628), failed start-ups showing only a traceback (0.5.11.dev20260512, 20260303), and a
# server_args line wrapped before its 0.5-only fields (20260114). Every vLLM V1 log prints its
# version, which names its family.
UNDETECTABLE = {
    "sglang-0.5.11.dev20260512-01.log",
    "sglang-unversioned-20251130-01.log",
    "sglang-unversioned-20251204-01.log",
    "sglang-unversioned-20260114-01.log",
    "sglang-unversioned-20260303-01.log",
    "sglang-unversioned-20260508-h200-01.log",
    "sglang-unversioned-20260628-01.log",
}


def _source_line(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8").split("\n", 1)[0]


def _body(name: str) -> str:
    """The text after the `# source:` line (the parser would otherwise read text in it)."""
    text = (DATA / name).read_text(encoding="utf-8")
    first, _, rest = text.partition("\n")
    assert first.startswith("# source: ")
    return rest


def _expected(name: str) -> dict:
    return json.loads((EXPECTED / f"{name}.json").read_text(encoding="utf-8"))


def _engine(name: str) -> str:
    return FAMILY_ENGINE[_expected(name)["family"]]


def _product(name: str) -> str:
    return product_of(_engine(name))


def _parsed(name: str):
    return parse_startup_log(_body(name), engine=_engine(name))


def _norm_version(v: str | None) -> str | None:
    return None if v is None else str(v).removeprefix("v")


# ----------------------------------------------------------------------------- the fixture set


def test_every_log_has_expectations_and_a_source_line():
    assert LOGS
    for name in LOGS:
        assert (EXPECTED / f"{name}.json").is_file(), name
        first = _source_line(name)
        assert first.startswith("# source: https://"), name
    # every expectations file belongs to a log
    assert sorted(p.name.removesuffix(".json") for p in EXPECTED.glob("*.json")) == LOGS


def test_every_source_line_says_version_as_printed():
    # Each source line states the version as printed: vLLM's as "version as printed: X"; SGLang
    # prints no version, so its lines say "version not printed" / "version NOT printed" instead
    # (and where the version came from, e.g. the sglang.check_env output).
    for name in LOGS:
        first = _source_line(name)
        if _product(name) == "vllm":
            assert "version as printed:" in first, name
        else:
            assert re.search(r"version (?:NOT|not) printed", first), name


def test_at_least_six_logs_per_product_with_failures_excerpts_and_prefixes():
    by_product: dict[str, list[str]] = {"vllm": [], "sglang": []}
    for name in LOGS:
        exp = _expected(name)
        assert exp["family"] in FAMILY_ENGINE, name
        assert exp["engine"] == _product(name), name
        by_product[_product(name)].append(name)
    for product, names in by_product.items():
        assert len(names) >= 6, product
        assert any(_expected(n)["failed"] for n in names), product
        assert any(n in TRUNCATED for n in names), product
        assert any(n in PREFIXED for n in names), product
    assert any(PREFIXED.get(n) is COMPOSE_PREFIX for n in by_product["vllm"])
    assert [n for n in by_product["sglang"] if n in PREFIXED] == ["sglang-0.5.10-01.log"]


def test_the_truncated_list_matches_the_source_lines():
    for name in LOGS:
        flagged = bool(re.search(r"\b(?:TRUNCATED|EXCERPT)\b", _source_line(name)))
        assert flagged == (name in TRUNCATED), name


def test_the_failed_flag_matches_the_source_lines():
    for name in LOGS:
        assert _expected(name)["failed"] == ("FAILED" in _source_line(name)), name


@pytest.mark.parametrize("name", sorted(PREFIXED))
def test_prefixed_logs_carry_their_prefix(name):
    lines = [ln for ln in _body(name).splitlines() if ln.strip()]
    prefix = PREFIXED[name]
    assert any(prefix.match(ln) for ln in lines)
    if prefix is not PROCESS_PREFIX:  # vLLM's process prefix is absent on some early lines
        engine_lines = [ln for ln in lines if not ln.startswith(("Parse safetensors", "Loading"))]
        assert sum(bool(prefix.match(ln)) for ln in engine_lines) >= 0.9 * len(engine_lines)


# ------------------------------------------------------------------------ parse vs hand reading


def _compared(parsed) -> dict:
    out = {json_name: getattr(parsed, attr) for json_name, attr in FIELDS.items()}
    out["version_printed"] = _norm_version(out["version_printed"])
    out["ready"] = parsed.ready
    out["failed"] = parsed.failure is not None
    return out


@pytest.mark.parametrize("name", LOGS)
def test_parse_matches_the_hand_reading(name):
    exp = _expected(name)
    differs = exp.get("parser_differs", {})
    got = _compared(_parsed(name))
    for field in (*FIELDS, "ready", "failed"):
        want = exp[field]
        if field == "version_printed":
            want = _norm_version(want)
        if field in differs:
            assert differs[field]["reason"], (name, field)
            assert got[field] == differs[field]["parser"], (name, field)
            assert got[field] != want, (name, field, "parser_differs but the values agree")
        else:
            assert got[field] == want, (name, field)


def test_the_parser_differences_are_the_known_ones():
    # Each is explained in the JSON's "parser_differs" (split lines; a runtime excerpt read as a
    # failed start-up); a new difference must be investigated, not added here silently.
    assert {
        name: sorted(_expected(name).get("parser_differs", {}))
        for name in LOGS
        if _expected(name).get("parser_differs")
    } == {
        "vllm-v1-0.8.3-01.log": ["chunked_prefill", "prefix_caching"],
        "vllm-v1-0.8.3.dev244-01.log": ["chunked_prefill"],
        "sglang-unversioned-20260114-01.log": ["schedule_policy"],
        "sglang-0.5.10-01.log": ["failed"],
    }


def test_the_early_default_chunk_line_is_not_the_engines():
    # vllm-v1-0.11.2.dev69-02.log: the only "Chunked prefill is enabled ... 2048." line comes before
    # "non-default args:" (which ask for 8192): a default SchedulerConfig's, not this engine's.
    name = "vllm-v1-0.11.2.dev69-02.log"
    body = _body(name)
    chunk = body.index("Chunked prefill is enabled with max_num_batched_tokens=2048.")
    args = body.index("non-default args:")
    assert chunk < args and "'max_num_batched_tokens': 8192" in body[args:]
    assert body.count("Chunked prefill is enabled") == 1
    parsed = _parsed(name)
    assert (parsed.chunked_prefill, parsed.chunk_size) == (None, None)
    assert (_expected(name)["chunked_prefill"], _expected(name)["chunk_size"]) == (None, None)


@pytest.mark.parametrize("name", LOGS)
def test_evidence_lines(name):
    exp = _expected(name)
    body = _body(name)
    parsed = _parsed(name)
    differs = exp.get("parser_differs", {})
    other_line = exp.get("parser_evidence", {})
    for field, evidence in exp.get("evidence", {}).items():
        assert evidence in body, (name, field)  # the hand reading's evidence is real text
        if field not in FIELDS or exp[field] is None or field in differs:
            continue
        line = parsed.evidence[FIELDS[field]]
        assert line in body.splitlines(), (name, field)
        if field in other_line:
            # the parser cites another line showing the same value (the JSON says why)
            assert other_line[field]["reason"], (name, field)
            assert other_line[field]["contains"] in line, (name, field)
            assert evidence not in line, (name, field, "parser_evidence but the lines agree")
        else:
            assert evidence in line, (name, field)
    assert set(other_line) <= set(FIELDS), name


# --------------------------------------------------------------------------------- detection


@pytest.mark.parametrize("name", LOGS)
def test_detection(name):
    engine = _engine(name)
    if name not in UNDETECTABLE:
        assert detect_engine(_body(name)) == engine
        return
    with pytest.raises(UnknownEngineLog) as info:
        detect_engine(_body(name))
    msg = str(info.value)
    assert "release family" in msg
    for choice in ENGINE_CHOICES[product_of(engine)]:
        assert re.search(rf"--engine {choice}(?!\w)", msg), choice


def test_a_printed_version_names_the_family():
    # Every vLLM V1 log prints its version; the registry's range maps it to vllm_v1.
    for name in LOGS:
        if _product(name) == "vllm":
            version = _expected(name)["version_printed"]
            assert release_family("vllm", version).name == "vllm_v1", name


# ---------------------------------------------------------------------------------------- CLI


def _cli(argv: list[str]) -> int:
    from servelab.cli import main

    return main(argv)


def _stripped_copy(name: str, tmp_path: Path) -> str:
    path = tmp_path / name
    path.write_text(_body(name), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(
    ("name", "engine", "product", "family"),
    [
        ("vllm-v1-0.10.2-01.log", "vllm_v1", "vllm", "V1"),
        ("sglang-0.5.10.post1-01.log", "sglang_v05", "sglang", "0.5"),
    ],
)
def test_resolve_config_prints_product_and_family(capsys, tmp_path, name, engine, product, family):
    assert _cli(["resolve-config", _stripped_copy(name, tmp_path)]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert (obj["engine"], obj["product"], obj["family"]) == (engine, product, family)
    assert obj["chunk_size"] == _expected(name)["chunk_size"]


def test_resolve_config_on_an_sglang_log_of_no_known_family(capsys, tmp_path):
    """Both SGLang families read this excerpt the same way: read with the family left open
    (tests/unit/test_log_excerpts.py has every kind); named, the family reads it as its own."""
    path = _stripped_copy("sglang-unversioned-20260508-h200-01.log", tmp_path)
    assert _cli(["resolve-config", path]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert (obj["engine"], obj["product"], obj["family"]) == (None, "sglang", None)
    assert obj["open_families"] == ["sglang", "sglang_v05"]
    assert (obj["chunk_size"], obj["context_len"], obj["ready"]) == (8192, 1048576, True)
    assert _cli(["resolve-config", "--engine", "sglang_v05", path]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert (obj["engine"], obj["product"], obj["family"]) == ("sglang_v05", "sglang", "0.5")
    assert "open_families" not in obj
    assert (obj["chunk_size"], obj["context_len"], obj["ready"]) == (8192, 1048576, True)


# ------------------------------------------------------------------------------------ metrics


def _metrics(name: str):
    return parse_metrics_text(_body(name))


def test_vllm_v1_metrics_01():
    # vLLM 0.10.0 (issue title): V1 names with engine="0". The excerpt shows one mapped name.
    samples = _metrics("vllm-v1-metrics-01.txt")
    assert canonical_values("vllm_v1", samples) == {"kv_cache_usage": 9.75010481363281e-06}
    by_name = {s.name: s for s in samples}
    assert by_name["vllm:prefix_cache_queries_total"].value == 32.0
    assert by_name["vllm:kv_cache_usage_perc"].labels["engine"] == "0"
    # the deprecated V0-style counter is in the text but not in the V1 map
    assert by_name["vllm:gpu_prefix_cache_hits_total"].value == 0.0


def test_vllm_v1_metrics_02_early_v1_names():
    body = _body("vllm-v1-metrics-02.txt")
    # The excerpt ends mid-sample ("vllm:gpu_prefix", no value): a malformed exposition.
    assert body.rstrip("\n").endswith("vllm:gpu_prefix")
    with pytest.raises(ValueError, match="malformed Prometheus text exposition"):
        parse_metrics_text(body)
    samples = parse_metrics_text(body.rstrip("\n").rsplit("\n", 1)[0] + "\n")
    values = canonical_values("vllm_v1", samples)
    assert values == {"requests_running": 0.0, "requests_waiting": 0.0}
    # Early V1 (2025-03) still named the KV gauge vllm:gpu_cache_usage_perc (the rename to
    # vllm:kv_cache_usage_perc, which the V1 family's METRIC_MAP uses, came later; the release of
    # the rename is n/v here), so the canonical kv_cache_usage is absent, not read from it.
    assert "kv_cache_usage" not in values
    assert {s.name: s.value for s in samples}["vllm:gpu_cache_usage_perc"] == 0.0


def test_sglang_05_metrics_01():
    # SGLang 0.5.1 (issue title), labels engine_type/model_name/pp_rank/tp_rank.
    samples = _metrics("sglang-0.5-metrics-01.txt")
    assert canonical_values("sglang_v05", samples) == {
        "kv_cache_usage": 0.0,
        "requests_running": 1.0,
    }
    by_name = {s.name: s for s in samples}
    assert by_name["sglang:num_used_tokens"].value == 1.0
    assert by_name["sglang:gen_throughput"].value == 0.8371284457403783
    assert by_name["sglang:num_running_reqs"].labels["model_name"] == "Qwen-32B"
