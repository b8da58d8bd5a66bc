"""The resolved-configuration gate: a run is measured only if the engine's start-up log CONFIRMS the
chunked-prefill setting its arm expects (docs/architecture.md; study §3.1 Req. 2), and, when the
arm expects them, the schedule policy the engine resolved and the KV capacity it allocated (the
ablations of docs/ablations.md: `expect: {schedule_policy: fcfs}`, `expect: {kv_capacity_tokens:
N}`).

A value the log does not show is not confirmed: the gate refuses it just as it refuses a mismatch.
Every refusal quotes the start-up log line that shows the actual value.
"""

from __future__ import annotations

from servelab.engines.base import ParsedLog

__all__ = ["KV_CAPACITY_FACTS", "ResolvedConfigMismatch", "check_resolved", "kv_capacity_tokens"]


class ResolvedConfigMismatch(ValueError):
    """The engine resolved (or its log does not confirm) a configuration other than expected."""


def _quote(parsed: ParsedLog, name: str) -> str:
    line = parsed.evidence.get(name)
    if line is None:
        return "the start-up log shows no line with this value"
    where = parsed.evidence_lines.get(name)
    note = parsed.notes.get(name)
    quoted = f"start-up log line {where}: {line.strip()!r}"
    return f"{quoted} ({note})" if note else quoted


# How each engine's start-up log states the KV capacity it allocated, in tokens, as the facts its
# log reader records (each engine module's LogFormat.facts): SGLang's pool
# (`max_total_num_tokens=N`, 0.4 and 0.5), vLLM V1's "GPU KV cache size: N tokens", vLLM V0's
# "# GPU blocks: N" times the args line's block_size. The first that a log shows is read.
KV_CAPACITY_FACTS: tuple[tuple[str, ...], ...] = (
    ("max_total_num_tokens",),
    ("kv_cache_tokens",),
    ("num_gpu_blocks", "block_size"),
)


def kv_capacity_tokens(parsed: ParsedLog) -> tuple[int, tuple[str, ...]] | None:
    """The KV capacity in tokens the start-up log shows, and the facts it was read from (their
    product); None when the log shows none of KV_CAPACITY_FACTS."""
    for names in KV_CAPACITY_FACTS:
        if all(name in parsed.facts for name in names):
            tokens = 1
            for name in names:
                tokens *= int(parsed.facts[name])
            return tokens, names
    return None


def check_resolved(
    parsed: ParsedLog,
    *,
    expect_chunked_prefill: bool,
    expect_chunk_size: int | None,
    expect_schedule_policy: str | None = None,
    expect_kv_capacity_tokens: int | None = None,
    kv_capacity_tolerance: float = 0.0,
) -> None:
    """Raise ResolvedConfigMismatch unless `parsed` confirms the expected chunked-prefill setting,
    and the schedule policy and KV capacity when they are expected (None: not checked).

    `expect_chunk_size` is checked only when chunked prefill is expected on (None: any size). The
    KV capacity passes within `kv_capacity_tolerance` × the expected tokens (0: exactly). The
    message names the engine, the expected and the actual value, and quotes the evidence line.
    """
    if expect_chunk_size is not None and not expect_chunked_prefill:
        raise ValueError(
            f"expect_chunk_size={expect_chunk_size} with expect_chunked_prefill=False: "
            "a chunk size is only meaningful when chunked prefill is expected on"
        )
    engine = parsed.engine
    actual = parsed.chunked_prefill
    if actual is None:
        raise ResolvedConfigMismatch(
            f"{engine}: chunked prefill not confirmed: expected chunked_prefill="
            f"{expect_chunked_prefill}, but the start-up log does not show whether chunked prefill "
            "is on (not shown = not confirmed; the run must not be measured)"
        )
    if actual != expect_chunked_prefill:
        raise ResolvedConfigMismatch(
            f"{engine}: resolved chunked_prefill={actual}, expected {expect_chunked_prefill}; "
            f"{_quote(parsed, 'chunked_prefill')}"
        )
    if expect_chunked_prefill and expect_chunk_size is not None:
        size = parsed.chunk_size
        if size is None:
            raise ResolvedConfigMismatch(
                f"{engine}: chunk size not confirmed: expected chunk_size={expect_chunk_size}, "
                "but the start-up log does not show the chunk size (chunked prefill is on: "
                f"{_quote(parsed, 'chunked_prefill')})"
            )
        if size != expect_chunk_size:
            raise ResolvedConfigMismatch(
                f"{engine}: resolved chunk_size={size}, expected {expect_chunk_size}; "
                f"{_quote(parsed, 'chunk_size')}"
            )
    if expect_schedule_policy is not None:
        _check_schedule_policy(parsed, expect_schedule_policy)
    if expect_kv_capacity_tokens is not None:
        _check_kv_capacity(parsed, expect_kv_capacity_tokens, kv_capacity_tolerance)


def _check_schedule_policy(parsed: ParsedLog, expected: str) -> None:
    engine = parsed.engine
    policy = parsed.schedule_policy
    if policy is None:
        raise ResolvedConfigMismatch(
            f"{engine}: schedule policy not confirmed: expected schedule_policy={expected}, but "
            "the start-up log does not show the policy the engine resolved (not shown = not "
            "confirmed; the run must not be measured)"
        )
    if policy != expected:
        raise ResolvedConfigMismatch(
            f"{engine}: resolved schedule_policy={policy}, expected {expected}; "
            f"{_quote(parsed, 'schedule_policy')}"
        )


def _check_kv_capacity(parsed: ParsedLog, expected: int, tolerance: float) -> None:
    engine = parsed.engine
    if not 0.0 <= tolerance < 1.0:
        raise ValueError(f"kv_capacity_tolerance={tolerance}: must be in [0, 1)")
    found = kv_capacity_tokens(parsed)
    if found is None:
        raise ResolvedConfigMismatch(
            f"{engine}: KV capacity not confirmed: expected kv_capacity_tokens={expected}, but the "
            "start-up log shows none of "
            + ", ".join(" x ".join(names) for names in KV_CAPACITY_FACTS)
        )
    tokens, names = found
    if abs(tokens - expected) > tolerance * expected:
        within = f" (within {tolerance:.1%})" if tolerance else ""
        quoted = "; ".join(f"{name}: {_quote(parsed, name)}" for name in names)
        raise ResolvedConfigMismatch(
            f"{engine}: allocated kv_capacity_tokens={tokens}, expected {expected}{within}; "
            f"{quoted}"
        )
