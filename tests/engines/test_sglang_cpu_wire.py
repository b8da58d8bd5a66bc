"""SGLang 0.5.23's CPU engine (with servelab's stand-in sgl_kernel) answering servelab on 127.0.0.1,
beside llama.cpp's llama-server on the same tiny model in its other format.

One SGLang server for the module, with config/cpu-study.yaml's flags, and one llama-server.
Checked:
- servelab's dispatcher: a compiled prompt of L tokens is counted L + 1 (the BOS) in every
  streamed answer's usage, with exactly max_tokens output tokens over its chunks (SGLang may send
  several tokens in one chunk);
- the two formats hold one function: SGLang and llama.cpp give the same greedy text;
- /metrics has the series the telemetry reads (`sglang:*`, mapped to the canonical names);
- a request that runs past the dispatcher's timeout is recorded as `timeout`, the rest served;
- plain serving called none of the stand-in's names, and the stand-in's one implemented kernel
  writes what the kernel it replaces writes, on torch tensors in SGLang's own environment.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
import time
from collections.abc import Iterator

import httpx
import pytest
from servers import MODEL, check_timeout_recorded, engine_server, prompt_of, replay_same_prompt

from servelab.deploy import sglang_cpu
from servelab.engines.metrics import canonical_values, parse_metrics_text

# config/cpu-study.yaml's flags, with a shorter context
FLAGS = [
    f"--served-model-name={MODEL}",
    "--context-length=4096",
    "--dtype=float32",
    "--max-total-tokens=65536",
]
pytestmark = pytest.mark.xdist_group("sglang-wire")


@pytest.fixture(scope="module")
def sglang(sglang_cpu_program: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    folder = tmp_path_factory.mktemp("sglang-wire")
    calls = folder / sglang_cpu.CALLS_FILE
    env = sglang_cpu.server_env(calls)
    server = sglang_cpu.server_command
    with engine_server(server, sglang_cpu_program, FLAGS, folder / "server.log", env) as url:
        yield url, calls


def test_every_request_is_counted_l_plus_one_with_exact_outputs(sglang) -> None:
    url, _ = sglang
    text, length = prompt_of(300)
    result = replay_same_prompt(url, "count", 8, text)
    assert [r.status for r in result.records] == ["ok"] * 8
    for rec in result.records:
        assert (rec.prompt_tokens, rec.output_tokens) == (length + 1, 8), rec.request_id
        # SGLang may put several tokens in one chunk (its tokenizer manager sends what has
        # accumulated): the chunks' token counts add up to the output
        assert sum(rec.chunk_tokens) == 8 and 1 <= len(rec.chunk_times_s) <= 8


def test_sglang_and_llama_cpp_give_the_same_greedy_text(sglang, llama) -> None:
    url, _ = sglang
    for prompt in ("Hello world, this is a test.", "The quick brown fox jumps over the lazy dog"):
        s = httpx.post(
            f"{url}/v1/completions",
            json={"model": MODEL, "prompt": prompt, "max_tokens": 12, "temperature": 0},
            timeout=60,
        ).json()
        native = httpx.post(
            f"{llama}/completion",
            json={"prompt": prompt, "n_predict": 12, "temperature": 0, "cache_prompt": False},
            timeout=60,
        ).json()
        assert s["choices"][0]["text"] == native["content"], prompt


def test_metrics_hold_the_series_the_telemetry_reads(sglang) -> None:
    url, _ = sglang
    text, _ = prompt_of(200)
    for _ in range(2):  # the second is served from the radix cache
        served = httpx.post(
            f"{url}/v1/completions",
            json={"model": MODEL, "prompt": text, "max_tokens": 2},
            timeout=60,
        )
        assert served.status_code == 200
    time.sleep(1.5)  # the scheduler's gauges are refreshed on its log interval
    values = canonical_values("sglang_v05", parse_metrics_text(httpx.get(f"{url}/metrics").text))
    assert {
        "requests_running",
        "requests_waiting",
        "kv_cache_usage",
        "prefix_cache_hit_rate",
        "prompt_tokens_total",
    } <= set(values)
    assert values["prompt_tokens_total"] >= 2 * 201


def test_a_request_past_the_timeout_is_recorded_as_a_timeout(sglang) -> None:
    url, _ = sglang
    # Margins both ways, for a loaded CI machine: here "short" took 0.09 s beside "long" and 3000
    # decode steps took 12.1 s (4000: about 16 s), so a 5 s timeout splits them on a machine 50
    # times slower for the one and 3 times faster for the other
    check_timeout_recorded(url)


def test_plain_serving_called_none_of_the_standins_names(sglang) -> None:
    """After every test above has been served (this runs last in the module)."""
    _, calls = sglang
    assert not calls.exists() or calls.read_text() == ""


def test_the_standin_kernel_on_torch_tensors_in_sglangs_environment(sglang_cpu_program) -> None:
    """The stand-in as SGLang imports it, against the Triton reference's loop, on int32/int64
    torch tensors (the dtypes SGLang passes)."""
    script = textwrap.dedent(
        """
        import torch, sgl_kernel
        assert sgl_kernel.STANDIN.startswith("servelab's stand-in")
        g = torch.Generator().manual_seed(7)
        for _ in range(20):
            bs = int(torch.randint(1, 6, (1,), generator=g))
            rows = torch.randperm(8, generator=g)[:bs].to(torch.int64)
            start = torch.randint(0, 8, (bs,), generator=g).to(torch.int32)
            end = start + torch.randint(0, 8, (bs,), generator=g).to(torch.int32)
            slots = torch.randint(0, 2**31 - 1, (int((end - start).sum()),), generator=g)
            table = torch.zeros((8, 32), dtype=torch.int32)
            want = table.clone()
            off = 0
            for i in range(bs):
                n = int(end[i] - start[i])
                want[int(rows[i]), int(start[i]):int(end[i])] = slots[off:off + n].to(torch.int32)
                off += n
            sgl_kernel.assign_req_to_token_pool_cpu(rows, table, start, end, slots, 32)
            assert torch.equal(table, want) and table.dtype == torch.int32
        print("ok")
        """
    )
    done = subprocess.run(
        [sglang_cpu_program, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SGLANG_USE_CPU_ENGINE": "1"},
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
