"""servelab's stand-in `sgl_kernel` for SGLang 0.5.23's CPU engine (not SGLang's code).

SGLang 0.5.23 imports eight CPU-only names from `sgl_kernel` at module level when its CPU engine is
on (`SGLANG_USE_CPU_ENGINE=1`), and PyPI has no CPU build of sgl-kernel: `sglang-kernel` 0.4.10,
the release 0.5.23 pins, is a CUDA-only wheel whose loader raises ImportError without a GPU
(`sgl_kernel/load_utils.py` L67-68, L192) and has no sdist. The imports (paths in the sglang
0.5.23 wheel):
- `srt/mem_cache/allocation.py` L45-46: `assign_req_to_token_pool_cpu`;
- `kernels/ops/kvcache/cache_move.py` L9-10: `copy_all_layer_kv_cache_cpu`;
- `kernels/ops/speculative/cache_locs.py` L27-31: `assign_draft_cache_locs_contiguous_cpu`,
  `assign_extend_cache_locs_cpu`;
- `kernels/ops/speculative/eagle.py` L9-10: `fill_accept_out_cache_loc_cpu`, `fill_bonus_tokens_cpu`;
- `kernels/ops/speculative/spec_tree.py` L39-43: `build_tree_kernel_efficient_cpu`,
  `verify_tree_greedy_cpu`.

Plain serving (no speculative decoding, no LoRA, no multimodal, no AMX backend) calls none of them:
`assign_req_to_token_pool_func` (allocation.py L737-763) is reached only from speculative decoding
(`alloc_for_spec_decode`, L780-844), prefill writes the request-to-token rows in Python
(`write_cache_indices`, L56-105, when the attention backend has no Triton), decode through
`req_to_token_pool.write`, and `copy_all_layer_kv_cache_func` only when `enable_kv_cache_copy`
(set by a speculative algorithm). Every native op the CPU path would call otherwise
(`torch.ops.sgl_kernel.*`: rmsnorm, rotary, weight_packed_linear, ...) is behind SGLang's AMX check,
`hasattr(torch.ops.sgl_kernel, "convert_weight_packed")` (`srt/utils/common.py` L354-372), which
this module never registers: SGLang falls back to its torch_native attention and forward_native
layers.

So this module provides:
- `assign_req_to_token_pool_cpu`, implemented: the semantics of the kernel it replaces (the Triton
  reference `assign_req_to_token_pool`, allocation.py L691-723, and the CPU kernel
  `assign_req_to_token_pool_cpu` in sgl-kernel's `csrc/cpu/speculative_decoding.cpp`);
- the seven others, each raising NotImplementedError naming itself when called.

Every call is recorded (its name, one line) in the file `SERVELAB_SGL_KERNEL_CALLS` names, if set:
a campaign's test reads it to show that plain serving called none. The module imports nothing
outside the standard library, so its logic runs on any array with NumPy-style indexing (torch
tensors in SGLang, NumPy arrays in servelab's unit tests).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__version__ = "0.0.0+servelab.standin"
STANDIN = (
    "servelab's stand-in sgl_kernel (SGLang 0.5.23 CPU engine; no CPU build of sgl-kernel on PyPI)"
)
CALLS_ENV = "SERVELAB_SGL_KERNEL_CALLS"

IMPLEMENTED = ("assign_req_to_token_pool_cpu",)
UNAVAILABLE = (
    "copy_all_layer_kv_cache_cpu",
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "build_tree_kernel_efficient_cpu",
    "verify_tree_greedy_cpu",
)

__all__ = ["STANDIN", *IMPLEMENTED, *UNAVAILABLE]


def _record(name: str) -> None:
    path = os.environ.get(CALLS_ENV)
    if path:
        with Path(path).open("a", encoding="utf-8") as handle:
            handle.write(name + "\n")


def assign_req_to_token_pool_cpu(
    req_pool_indices: Any,
    req_to_token: Any,
    start_offset: Any,
    end_offset: Any,
    out_cache_loc: Any,
    pool_len: int,
) -> None:
    """Write each request's new KV slot indices into its row of the request-to-token table.

    For request i of the batch (in order), with n_i = end_offset[i] - start_offset[i] and o_i the
    sum of n_j over the requests before it:
        req_to_token[req_pool_indices[i], start_offset[i]:end_offset[i]]
            = out_cache_loc[o_i : o_i + n_i]
    (int64 slot indices narrowed to the table's int32). Nothing else is written; it returns
    nothing. Checked as the CPU kernel checks: the table is 2-D with rows of `pool_len`, the
    offsets have one entry per request, and `out_cache_loc` holds every segment.
    """
    _record("assign_req_to_token_pool_cpu")
    batch = len(req_pool_indices)
    if len(req_to_token.shape) != 2 or int(req_to_token.shape[1]) != int(pool_len):
        raise ValueError(
            f"assign_req_to_token_pool_cpu: req_to_token must be 2-D with rows of pool_len "
            f"{pool_len}, not of shape {tuple(req_to_token.shape)}"
        )
    if len(start_offset) != batch or len(end_offset) != batch:
        raise ValueError(
            f"assign_req_to_token_pool_cpu: {batch} requests, but {len(start_offset)} start and "
            f"{len(end_offset)} end offsets"
        )
    lengths = [int(end_offset[i]) - int(start_offset[i]) for i in range(batch)]
    if sum(lengths) > len(out_cache_loc):
        raise ValueError(
            f"assign_req_to_token_pool_cpu: the segments need {sum(lengths)} slot indices, "
            f"out_cache_loc holds {len(out_cache_loc)}"
        )
    offset = 0
    for i, length in enumerate(lengths):
        start = int(start_offset[i])
        row = int(req_pool_indices[i])
        req_to_token[row, start : start + length] = out_cache_loc[offset : offset + length]
        offset += length


def _unavailable(name: str) -> Any:
    def unavailable(*args: Any, **kwargs: Any) -> None:
        del args, kwargs
        _record(name)
        raise NotImplementedError(
            f"sgl_kernel.{name}: not available in {STANDIN}; SGLang calls it only for speculative "
            "decoding or KV-cache copies, which a servelab deployment does not enable"
        )

    unavailable.__name__ = unavailable.__qualname__ = name
    return unavailable


for _name in UNAVAILABLE:
    globals()[_name] = _unavailable(_name)
del _name
