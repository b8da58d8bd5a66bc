"""Iteration time from a roofline of the model on the GPU, plus per-engine overheads.

One forward pass of a batch costs

    t = max(F_lin / (P·e_gemm), B_w / (BW·e_bw))          linear layers: compute- or weight-bound
      + F_attn_prefill / (P·e_attn)                        prefill attention (compute-bound)
      + B_kv / (BW·e_bw)                                   KV cache reads and writes
      + overhead(engine, batch, CUDA graphs or not)

with P the GPU's dense BF16 peak, BW its DRAM bandwidth, F_lin = 2·(layer params)·(tokens computed) +
2·(LM head params)·(sequences sampled), F_attn = 4·layers·heads·head_dim·Σ(query × context pairs),
B_w the weight bytes and B_kv the KV bytes read (every context token of every sequence) and written.
The named constants of `Calibration` are the only tuned numbers; docs/simulator.md gives their values,
how they were calibrated (defaults-arm rate sweep only) and what the model leaves out.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Protocol

from servelab.engines.registry import engine_names, product_of
from servelab.sim.presets import GpuPreset, ModelPreset

__all__ = ["DEFAULT_CALIBRATION", "Calibration", "CostModel", "OnePassTimes"]


@dataclass(frozen=True)
class Calibration:
    """Named calibration constants of the cost model (see docs/simulator.md for the values' provenance)."""

    # Fraction of peak dense BF16 throughput reached by the linear layers' GEMMs at large token counts.
    gemm_efficiency: float = 0.386
    # Fraction of peak reached by prefill attention kernels (FlashAttention / FlashInfer).
    attn_efficiency: float = 0.30
    # Fraction of peak DRAM bandwidth reached when streaming weights and KV cache.
    bandwidth_efficiency: float = 0.895
    # Fraction of the repeated reads of KV shared by several sequences of a decode batch (a common
    # prefix stored once) that miss the L2 cache and go to DRAM; 1 = every sequence streams its own copy.
    shared_kv_dram_fraction: float = 0.434
    # vLLM V0: CPU time per iteration not hidden behind the GPU (scheduling, input preparation,
    # sampling, output processing; async output processing hides part of it).
    vllm_iteration_overhead_s: float = 0.00881
    vllm_per_seq_overhead_s: float = 0.000207
    # SGLang 0.4.1 with the overlap scheduler: CPU work of batch N+1 overlaps the GPU work of batch N.
    sglang_iteration_overhead_s: float = 0.0015
    sglang_per_seq_overhead_s: float = 0.00002
    # Extra time of an iteration that runs without CUDA graphs (eager kernel launches), on top of the
    # roofline: decode batches above SGLang's cuda_graph_max_bs, vLLM decode with a context above
    # max_seq_len_to_capture, and every prefill or mixed iteration.
    eager_penalty_s: float = 0.006
    eager_penalty_per_seq_s: float = 0.0000584

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


DEFAULT_CALIBRATION = Calibration()


class _TimesIterations(Protocol):
    def iteration_time(
        self,
        *,
        tokens: int,
        seqs: int,
        sampled: int,
        attn_pairs: float,
        kv_tokens: float,
        cuda_graph: bool,
        kv_repeat: float = 0.0,
        admitted: int = 0,
        mask_cells: float = 0.0,
        mask_checks: float = 0.0,
        wakeups: float = 0.0,
        start_s: float | None = None,
    ) -> float: ...


class OnePassTimes:
    """The time of one typical pass from a cost model's `iteration_time`: a mixin of the L4's
    `CostModel` and the CPU platform's `StepCost`."""

    __slots__ = ()

    def prefill_time(
        self: _TimesIterations, new_tokens: int, cached_tokens: int = 0, admitted: int = 0
    ) -> float:
        """One sequence prefilled alone (a convenience for docs, tests and benchmarks);
        `admitted` 1 charges the pass with the request's admission too."""
        pairs = new_tokens * cached_tokens + new_tokens * (new_tokens + 1) / 2
        return self.iteration_time(
            tokens=new_tokens,
            seqs=1,
            sampled=1,
            attn_pairs=pairs,
            kv_tokens=cached_tokens + new_tokens,
            cuda_graph=False,
            admitted=admitted,
        )

    def decode_time(
        self: _TimesIterations,
        batch: int,
        context: int,
        cuda_graph: bool = True,
        shared: int = 0,
    ) -> float:
        """One decode step of `batch` sequences that each attend over `context` tokens, the first
        `shared` of which are the same KV entries for every sequence."""
        return self.iteration_time(
            tokens=batch,
            seqs=batch,
            sampled=batch,
            attn_pairs=0.0,
            kv_tokens=float(batch * context),
            cuda_graph=cuda_graph,
            kv_repeat=float(max(batch - 1, 0) * shared),
        )


class CostModel(OnePassTimes):
    """Roofline iteration time for one (model, GPU, engine)."""

    __slots__ = (
        "_attn_flops",
        "_attn_rate",
        "_bw",
        "_c",
        "_gemm_rate",
        "_head_flops_seq",
        "_kv_bytes",
        "_kv_hit",
        "_lin_flops_tok",
        "_overhead",
        "_overhead_seq",
        "_slowdown",
        "_t_weights",
        "calibration",
        "engine",
        "gpu",
        "model",
    )

    def __init__(
        self,
        model: ModelPreset,
        gpu: GpuPreset,
        engine: str,
        calibration: Calibration = DEFAULT_CALIBRATION,
        slowdown: float = 1.0,
    ) -> None:
        """`slowdown` multiplies every iteration's duration: the simulated platform's drift and
        noise (servelab.sim.platform), 1 for the model itself."""
        if not slowdown > 0:
            raise ValueError(f"slowdown: must be positive, got {slowdown}")
        product = product_of(engine) if engine in engine_names() else engine
        if product not in ("vllm", "sglang"):
            raise ValueError(f"engine: unknown engine {engine!r}")
        self.model, self.gpu, self.engine, self.calibration = model, gpu, engine, calibration
        c = calibration
        self._c = c
        self._slowdown = float(slowdown)
        self._gemm_rate = gpu.peak_bf16_flops * c.gemm_efficiency
        self._attn_rate = gpu.peak_bf16_flops * c.attn_efficiency
        self._bw = gpu.mem_bandwidth * c.bandwidth_efficiency
        self._kv_bytes = float(model.kv_bytes_per_token)
        self._kv_hit = 1.0 - c.shared_kv_dram_fraction
        self._lin_flops_tok = 2.0 * model.layer_params
        self._head_flops_seq = 2.0 * model.embedding_params
        self._attn_flops = float(model.attn_flops_per_token_ctx)
        self._t_weights = (
            (model.layer_params + model.embedding_params) * model.dtype_bytes / self._bw
        )
        # A release family runs on its product's calibrated overheads (docs/simulator.md).
        if product == "vllm":
            self._overhead, self._overhead_seq = (
                c.vllm_iteration_overhead_s,
                c.vllm_per_seq_overhead_s,
            )
        else:
            self._overhead, self._overhead_seq = (
                c.sglang_iteration_overhead_s,
                c.sglang_per_seq_overhead_s,
            )

    def iteration_time(
        self,
        *,
        tokens: int,
        seqs: int,
        sampled: int,
        attn_pairs: float,
        kv_tokens: float,
        cuda_graph: bool,
        kv_repeat: float = 0.0,
        admitted: int = 0,
        mask_cells: float = 0.0,
        mask_checks: float = 0.0,
        wakeups: float = 0.0,
        start_s: float | None = None,
    ) -> float:
        """Seconds for one forward pass plus the engine's per-iteration overhead.

        tokens: tokens computed (prefill tokens not served from cache + one per decoding sequence);
        seqs: sequences in the batch; sampled: sequences whose logits are computed (LM head);
        attn_pairs: Σ over prefill query tokens of the context each attends to (causal);
        kv_tokens: KV entries read or written (decode contexts, prefill cached context and new tokens);
        cuda_graph: the iteration replays a captured CUDA graph;
        kv_repeat: how many of the kv_tokens are repeated reads of entries another sequence of the
        batch also reads (shared prefix): only `shared_kv_dram_fraction` of those reach DRAM;
        admitted: requests whose prefill starts in this pass. Its front-end work runs on the host
        beside the GPU, so the roofline does not charge it (the CPU platform does:
        servelab.sim.cpu_platform).
        mask_cells, mask_checks: the host work of a pass's attention mask (servelab.sim.llamacpp,
        `mask_work`); wakeups: HTTP threads woken for another request's result since the last
        pass (servelab.sim.llamacpp, `_send`). The roofline charges none of them (the CPU
        platform does).
        start_s: when the pass starts, for a platform whose pass costs more after an idle (the
        CPU platform's after-idle term: servelab.sim.cpu_platform, `AfterIdleClock`); the
        roofline has no such term.
        """
        del admitted, mask_cells, mask_checks, wakeups, start_s
        t_compute = (
            tokens * self._lin_flops_tok + sampled * self._head_flops_seq
        ) / self._gemm_rate
        t = t_compute if t_compute > self._t_weights else self._t_weights
        kv = kv_tokens - self._kv_hit * kv_repeat
        t += attn_pairs * self._attn_flops / self._attn_rate + kv * self._kv_bytes / self._bw
        t += self._overhead + seqs * self._overhead_seq
        if not cuda_graph:
            t += self._c.eager_penalty_s + seqs * self._c.eager_penalty_per_seq_s
        return t * self._slowdown
