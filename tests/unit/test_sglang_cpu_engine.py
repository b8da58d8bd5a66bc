"""SGLang 0.5.23 on the CPU platform: its CPU rules against what the real server printed, its real
start-up logs (captured by tools/capture_sglang_cpu_logs.py) against their goldens and against what
a reader sees in them, its /metrics text, and the command and environment the local backend starts
it with."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from servelab.deploy import sglang_cpu
from servelab.deploy.local import CPU_ENGINES, _serves_real
from servelab.engines import ResolvedConfigMismatch, check_resolved
from servelab.engines.logparse import parse_startup_log
from servelab.engines.metrics import canonical_values, parse_metrics_text
from servelab.engines.resolve import ResolutionError, resolve

REPO = Path(__file__).resolve().parents[2]
LOGS = REPO / "tests" / "data" / "engine-logs"
GOLDEN = REPO / "tests" / "golden" / "sglang_cpu"
# The machine the logs were captured on: 24,105 MiB of RAM, one NUMA node (what SGLang's
# get_cpu_memory_capacity reads; config gpu.memory_mib).
CPU = {"gpu_memory_mib": 24105, "gpu_name": "CPU", "version": "0.5.23"}
BASE = ["--model-path=/m", "--context-length=8192", "--dtype=float32", "--max-total-tokens=65536"]
CAPTURED = sorted(p.stem.removeprefix("sglang-cpu-") for p in LOGS.glob("sglang-cpu-0.5.23-*.log"))


def _log(name: str) -> str:
    return (LOGS / f"sglang-cpu-{name}.log").read_text()


def _server_args(name: str) -> dict[str, str]:
    """A few values of the `server_args={...}` line, read with a regex (not the parser)."""
    line = next(line for line in _log(name).splitlines() if "server_args={" in line)
    keys = (
        "chunked_prefill_size",
        "mem_fraction_static",
        "schedule_policy",
        "torch_compile_max_bs",
    )
    return {k: re.search(rf"'{k}': '?([\w.\-]+)'?", line).group(1) for k in keys}


# ----------------------------------------------------------------------------- rules


def test_the_cpu_rules_predict_what_the_real_server_resolved() -> None:
    """The chunk size, the memory fraction and the policy, from SGLang's rules with the machine's
    RAM, against each captured server's own `server_args=` line."""
    for name, flags in (
        ("0.5.23-defaults", []),
        ("0.5.23-chunk256", ["--chunked-prefill-size=256"]),
        ("0.5.23-lpm", ["--schedule-policy=lpm"]),
    ):
        r = resolve("sglang_v05", [*BASE, *flags], **CPU)
        shown = _server_args(name)
        assert str(r.chunk_size) == shown["chunked_prefill_size"], name
        assert f"{r.memory_fraction:.3f}" == shown["mem_fraction_static"], name
        assert r.schedule_policy == shown["schedule_policy"], name
        assert shown["torch_compile_max_bs"] == "32"
    assert resolve("sglang_v05", BASE, **CPU).cuda_graph_max_bs is None  # no CUDA graphs


def test_the_cpu_chunk_size_follows_the_machines_memory() -> None:
    assert resolve("sglang_v05", BASE, **{**CPU, "gpu_memory_mib": 16000}).chunk_size == 2048
    assert resolve("sglang_v05", BASE, **{**CPU, "gpu_memory_mib": 64000}).chunk_size == 8192
    assert resolve("sglang_v05", BASE, **CPU).rules["chunk_size"] == "cpu-memory-rule"


def test_without_chunking_the_default_fraction_is_negative_and_refused_as_sglang_refuses() -> None:
    """SGLang then reserves for a 16,384-token prefill, 25,280 MiB of 24,105: the real server
    crashed with `--mem-fraction-static=-0.049` (the capture gives a fraction for this reason)."""
    with pytest.raises(ResolutionError, match=r"reserves 25280 MiB .* \(fraction -0\.049\)"):
        resolve("sglang_v05", [*BASE, "--chunked-prefill-size=-1"], **CPU)
    r = resolve(
        "sglang_v05", [*BASE, "--chunked-prefill-size=-1", "--mem-fraction-static=0.5"], **CPU
    )
    assert (r.chunked_prefill, r.chunk_size, r.memory_fraction) == (False, None, 0.5)


# ----------------------------------------------------------------------------- real logs


def test_the_captured_logs_are_all_there() -> None:
    assert CAPTURED == [
        "0.5.23-chunk256",
        "0.5.23-defaults",
        "0.5.23-lpm",
        "0.5.23-no-chunked-prefill",
    ]
    assert (LOGS / "sglang-cpu-0.5.23-metrics-01.txt").is_file()


@pytest.mark.parametrize("name", CAPTURED)
def test_a_captured_log_parses_to_its_golden(name: str) -> None:
    golden = json.loads((GOLDEN / f"{name}.json").read_text())
    assert parse_startup_log(_log(name)).to_dict() == golden


# What a reader sees in each log (read by hand): the setting, and the words of the line showing it.
HAND_READ = {
    "0.5.23-defaults": (True, 4096, "fcfs", "'chunked_prefill_size': 4096"),
    "0.5.23-chunk256": (True, 256, "fcfs", "'chunked_prefill_size': 256"),
    "0.5.23-no-chunked-prefill": (False, None, "fcfs", "'chunked_prefill_size': -1"),
    "0.5.23-lpm": (True, 4096, "lpm", "'chunked_prefill_size': 4096"),
}


@pytest.mark.parametrize("name", sorted(HAND_READ))
def test_a_captured_log_shows_what_a_reader_sees(name: str) -> None:
    chunked, size, policy, words = HAND_READ[name]
    parsed = parse_startup_log(_log(name))
    assert (parsed.engine, parsed.ready) == ("sglang_v05", True)
    assert (parsed.chunked_prefill, parsed.chunk_size, parsed.schedule_policy) == (
        chunked,
        size,
        policy,
    )
    assert words in parsed.evidence["chunked_prefill"]
    assert parsed.facts["kv_cache_tokens"] == 65536  # --max-total-tokens
    assert "The current platform does not support Intel AMX" in _log(name)


def test_the_gate_refuses_a_mismatched_arm_quoting_sglangs_line() -> None:
    shown = parse_startup_log(_log("0.5.23-defaults"))
    check_resolved(shown, expect_chunked_prefill=True, expect_chunk_size=4096)
    with pytest.raises(ResolvedConfigMismatch, match="'chunked_prefill_size': 4096"):
        check_resolved(shown, expect_chunked_prefill=True, expect_chunk_size=2048)


def test_metrics_map_to_the_canonical_series() -> None:
    text = (LOGS / "sglang-cpu-0.5.23-metrics-01.txt").read_text().split("\n", 1)[1]
    values = canonical_values("sglang_v05", parse_metrics_text(text))
    assert {
        "requests_running",
        "requests_waiting",
        "kv_cache_usage",
        "prefix_cache_hit_rate",
    } <= set(values)
    # two identical 402-token prompts: the second is served from the radix cache
    assert values["prefix_cache_hit_rate"] > 0.9
    assert values["prompt_tokens_total"] >= 2 * 402


# ----------------------------------------------------------------------------- the local backend


def test_the_local_backend_runs_real_sglang_on_the_cpu_platform_only() -> None:
    assert _serves_real("sglang_v05", "CPU") and not _serves_real("sglang_v05", "L4")
    assert CPU_ENGINES["sglang_v05"] is sglang_cpu


def test_the_server_command_and_environment() -> None:
    command = sglang_cpu.server_command(
        "/venv/bin/python", model_dir="/m", flags=["--dtype=float32"], host="127.0.0.1", port=30000
    )
    assert command == [
        "/venv/bin/python", "-m", "sglang.launch_server", "--model-path", "/m",
        "--dtype=float32", "--device", "cpu", "--enable-metrics", "--log-level", "info",
        "--host", "127.0.0.1", "--port", "30000",
    ]  # fmt: skip
    # a --model-path among the flags names the model; the local folder replaces it
    for named in (["--model-path=org/m"], ["--model-path", "org/m"]):
        assert sglang_cpu.server_command(
            "/py", model_dir="/m", flags=[*named, "--dtype=float32"], host="h", port=1
        )[3:6] == ["--model-path", "/m", "--dtype=float32"]
    env = sglang_cpu.server_env("/d/sgl-kernel-calls.txt")
    assert env["SGLANG_USE_CPU_ENGINE"] == "1" and env["HF_HUB_OFFLINE"] == "1"
    assert env["SERVELAB_SGL_KERNEL_CALLS"] == "/d/sgl-kernel-calls.txt"
    # the stand-in is named wherever the command is recorded (run.json's server_command)
    assert "SERVELAB_SGL_KERNEL=servelab-standin" in sglang_cpu.describe(["/py"], env)


def test_token_counters_split_by_is_streaming_are_summed() -> None:
    """SGLang 0.5 counts streamed and unstreamed requests' tokens in two series of one counter:
    one scrape reads their sum (Prometheus sums them too: tests/golden/promql/sglang_v05.txt)."""
    text = (
        "# TYPE sglang:prompt_tokens counter\n"
        'sglang:prompt_tokens_total{is_streaming="false",model_name="m"} 7.0\n'
        'sglang:prompt_tokens_total{is_streaming="true",model_name="m"} 400.0\n'
    )
    assert canonical_values("sglang_v05", parse_metrics_text(text))["prompt_tokens_total"] == 407
    # a split by any other label stays refused: which one would be meant is unknown
    other = text.replace('is_streaming="false"', 'tp_rank="1",is_streaming="true"')
    with pytest.raises(ValueError, match="2 series in one scrape"):
        canonical_values("sglang_v05", parse_metrics_text(other))


def test_a_series_sglang_creates_at_its_first_event_may_be_absent_from_a_run() -> None:
    """sglang:num_retracted_requests_total exists only after a retraction: a run without one
    has no such series, and its telemetry then lacks it; any other series missing stays an error."""
    import pyarrow as pa

    from servelab.artifacts import SCRAPE_SCHEMA
    from servelab.engines.metrics import METRIC_MAP
    from servelab.telemetry.canonical import TelemetryWindowError, canonicalize

    def scrape(sources: list[str]) -> pa.Table:
        rows = [(s, float(t)) for s in sources for t in range(0, 11)]
        return pa.table(
            {
                "run_id": ["r"] * len(rows),
                "t_s": [t for _, t in rows],
                "source_metric": [s for s, _ in rows],
                "value": [1.0] * len(rows),
            },
            schema=SCRAPE_SCHEMA,
        )

    every = sorted({s for s in METRIC_MAP["sglang_v05"].values() if s})
    lazy = "sglang:num_retracted_requests_total"
    assert lazy in every
    args = {"engine": "sglang_v05", "run_id": "r", "duration_s": 10.0, "step_s": 1.0, "what": "w"}
    table = canonicalize(scrape([s for s in every if s != lazy]), **args)
    assert lazy not in set(table.column("source_metric").to_pylist())
    with pytest.raises(TelemetryWindowError, match="no samples of sglang:token_usage"):
        canonicalize(scrape([s for s in every if s != "sglang:token_usage"]), **args)
