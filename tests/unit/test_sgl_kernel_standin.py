"""servelab's stand-in `sgl_kernel` (servelab.deploy.standins.sgl_kernel) against the semantics of
the kernel it replaces: SGLang's Triton reference `assign_req_to_token_pool` (sglang 0.5.23,
`srt/mem_cache/allocation.py` L691-723), transcribed below as the oracle, one program per request.
NumPy arrays stand in for torch tensors (the stand-in uses only indexing both share); the engines
tier runs it on torch tensors inside SGLang's own environment."""

from __future__ import annotations

import numpy as np
import pytest

from servelab.deploy.standins import sgl_kernel


def triton_reference(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc):
    """assign_req_to_token_pool: program `pid` sums the lengths of the requests before it, then
    copies its segment of out_cache_loc into its row from start to end."""
    for pid in range(len(req_pool_indices)):
        out_offset = sum(int(end_offset[j]) - int(start_offset[j]) for j in range(pid))
        row = req_to_token[int(req_pool_indices[pid])]
        length = int(end_offset[pid]) - int(start_offset[pid])
        row[int(start_offset[pid]) : int(end_offset[pid])] = out_cache_loc[
            out_offset : out_offset + length
        ]


@pytest.mark.parametrize("seed", range(20))
def test_assign_req_to_token_pool_cpu_writes_what_the_reference_writes(seed: int) -> None:
    rng = np.random.default_rng(seed)
    max_reqs, pool_len = 8, 32
    batch = int(rng.integers(1, max_reqs + 1))
    rows = rng.permutation(max_reqs)[:batch].astype(np.int64)
    start = rng.integers(0, pool_len // 2, size=batch).astype(np.int64)
    end = start + rng.integers(0, pool_len // 2, size=batch)
    total = int((end - start).sum())
    slots = rng.integers(0, 2**31 - 1, size=total + int(rng.integers(0, 4))).astype(np.int64)
    table = rng.integers(-5, 5, size=(max_reqs, pool_len)).astype(np.int32)
    expected = table.copy()
    triton_reference(rows, expected, start, end, slots)

    sgl_kernel.assign_req_to_token_pool_cpu(rows, table, start, end, slots, pool_len)
    assert table.dtype == np.int32
    np.testing.assert_array_equal(table, expected)


def test_an_empty_segment_writes_nothing_and_shifts_nothing() -> None:
    table = np.zeros((3, 8), dtype=np.int32)
    sgl_kernel.assign_req_to_token_pool_cpu(
        np.array([0, 1, 2]), table, np.array([2, 5, 0]), np.array([4, 5, 3]),
        np.array([10, 11, 20, 21, 22], dtype=np.int64), 8,
    )  # fmt: skip
    assert table[0].tolist() == [0, 0, 10, 11, 0, 0, 0, 0]
    assert table[1].tolist() == [0] * 8  # n = 0
    assert table[2].tolist() == [20, 21, 22, 0, 0, 0, 0, 0]  # after request 0's two slots


@pytest.mark.parametrize(
    ("table_shape", "pool_len", "starts", "slots", "words"),
    [
        ((2, 8), 16, [0, 0], 4, "rows of pool_len 16"),
        ((2, 8), 8, [0], 4, "2 requests, but 1 start"),
        ((2, 8), 8, [0, 0], 3, "need 4 slot indices, out_cache_loc holds 3"),
    ],
)
def test_bad_arguments_are_refused_as_the_cpu_kernel_checks_them(
    table_shape, pool_len, starts, slots, words
) -> None:
    with pytest.raises(ValueError, match=words):
        sgl_kernel.assign_req_to_token_pool_cpu(
            np.array([0, 1]), np.zeros(table_shape, dtype=np.int32), np.array(starts),
            np.array([2, 2]), np.arange(slots, dtype=np.int64), pool_len,
        )  # fmt: skip


@pytest.mark.parametrize("name", sgl_kernel.UNAVAILABLE)
def test_every_other_name_raises_naming_itself_and_is_recorded(name, tmp_path, monkeypatch) -> None:
    calls = tmp_path / "calls.txt"
    monkeypatch.setenv(sgl_kernel.CALLS_ENV, str(calls))
    with pytest.raises(NotImplementedError, match=rf"sgl_kernel\.{name}: not available"):
        getattr(sgl_kernel, name)(1, 2)
    assert calls.read_text() == f"{name}\n"


def test_the_module_exports_exactly_the_names_sglang_imports_on_the_cpu() -> None:
    """The eight names sglang 0.5.23 imports under `if _is_cpu:` (the module docstring cites each
    import); the implemented one is recorded too."""
    assert set(sgl_kernel.__all__) - {"STANDIN"} == {
        "assign_req_to_token_pool_cpu",
        "copy_all_layer_kv_cache_cpu",
        "assign_draft_cache_locs_contiguous_cpu",
        "assign_extend_cache_locs_cpu",
        "fill_accept_out_cache_loc_cpu",
        "fill_bonus_tokens_cpu",
        "build_tree_kernel_efficient_cpu",
        "verify_tree_greedy_cpu",
    }
    assert all(callable(getattr(sgl_kernel, n)) for n in sgl_kernel.__all__ if n != "STANDIN")
