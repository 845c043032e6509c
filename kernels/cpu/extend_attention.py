"""Prefill ("extend") attention over the KV pool on CPU.

``ExtendAttention`` wraps the C++ kernel in ``extend_attention_cpu.cpp`` (built
by ``radixlm.kernels.cpu.native``); ``extend_attention_reference`` is the same
computation in plain torch, which the tests hold the kernel to.

What one call computes, for each request b of the pass::

    n, e = prefix_lens[b], extend_lens[b]
    slots = req_to_token[rows[b], : n + e]         # K/V of all n + e tokens are in the pool
    for t in 0 .. e - 1:                            # new token t, at position n + t
        i = starts[b] + t                           # its row of q and out
        keys, values = k_cache[slots[: n + t + 1]], v_cache[slots[: n + t + 1]]
        out[i, h] = softmax(scale * keys[:, h // G] @ q[i, h]) @ values[:, h // G]

with G = H / Hkv query heads per KV head: causal attention of each new token
to its request's cached prefix and to the new tokens up to itself. Two options
shape the scores, as ``radixlm.kernels.paged_attention`` says (0: off): a
sliding ``window`` W (token t attends positions n + t - W + 1 .. n + t only) and
a ``softcap`` c (scores c tanh(s / c)). A quantized pool (int8 or fp8 codes as
``k_cache``/``v_cache``, their (slots, Hkv) bfloat16 scales as ``k_scale``/``v_scale``)
is dequantized as its keys are packed, once per key and KV head, so the rest of
the kernel runs as over a float pool. Bfloat16 queries over a bfloat16 pool take
AVX512-BF16 dot products where the build has them (``bf16_dot_products``): the
softmax weights are rounded to bfloat16 before they multiply V, as torch's bfloat16
attention rounds them. The caller
writes the new tokens' K/V into the pool first. Rows of ``out`` that no request
covers are left as they were, so one output can take a pass's decode rows from
the decode kernel and its prefills from this one.

Measured on the 2-core dev VM against torch's flash attention for CPU
(``benchmarks/bench_extend_attention.py``; figures in ``benchmarks/README.md``).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from radixlm.kernels.cpu.decode_attention import (
    KernelShapeError,
    bind_functions,
    cache_problems,
    code_symbols,
    gather_float,
    raise_for_status,
    rows_contiguous,
    shape_supported,
)
from radixlm.kernels.cpu.native import NATIVE, KernelTarget, load_library
from radixlm.kernels.paged_attention import allowed_keys, cap_scores

__all__ = ["ExtendAttention", "extend_attention_reference", "load_extend_attention"]

SOURCE = Path(__file__).with_name("extend_attention_cpu.cpp")
_SYMBOLS = {
    torch.float32: "radixlm_extend_attention_f32",
    torch.bfloat16: "radixlm_extend_attention_bf16",
}
MAX_GROUP = 12  # query heads per KV head (kMaxTileRows in the kernel)


class ExtendAttention:
    """The built kernel; call it like ``extend_attention_reference``."""

    def __init__(self, library: ctypes.CDLL) -> None:
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        # q, q_stride, k, v, table, table_stride, rows, prefix_lens, extend_lens,
        # starts, out, out_stride, B, H, Hkv, D, scale, window, softcap
        argtypes = [ptr, i64, ptr, ptr, ptr, i64, ptr, ptr, ptr, ptr, ptr, i64]
        argtypes += [i64, i64, i64, i64, ctypes.c_float, i64, ctypes.c_float]
        self._functions = bind_functions(library, _SYMBOLS, argtypes)
        # over a quantized pool: the same, then k_scale, v_scale
        self._code_functions = bind_functions(
            library, code_symbols(_SYMBOLS), [*argtypes, ptr, ptr]
        )
        library.radixlm_extend_bf16_dot.restype = ctypes.c_int
        # whether bfloat16 calls over a bfloat16 pool take AVX512-BF16 dot products in
        # this build, rounding the softmax weights to bfloat16 before p V
        self.bf16_dot_products: bool = bool(library.radixlm_extend_bf16_dot())

    @staticmethod
    def supports(num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> bool:
        """Whether a model of this shape and dtype can use the kernel."""
        return shape_supported(num_heads, num_kv_heads, head_dim, dtype, MAX_GROUP)

    def __call__(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        req_to_token: torch.Tensor,
        rows: torch.Tensor,
        prefix_lens: torch.Tensor,
        extend_lens: torch.Tensor,
        starts: torch.Tensor,
        scale: float,
        window: int = 0,
        softcap: float = 0.0,
        k_scale: torch.Tensor | None = None,
        v_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q: (T, H, D); k_cache/v_cache: (slots, Hkv, D); req_to_token: (R, C) int64;
        rows/prefix_lens/extend_lens/starts: (B,) int64; window, softcap: 0 for none
        (see the module); k_scale/v_scale: (slots, Hkv) bfloat16 for a quantized
        cache, None for a float one. Returns (T, H, D), zero in the rows no request
        covers.

        q may be a row-strided view (a slice of a fused QKV projection); within a
        row, (heads, D) must be contiguous. Dtypes, shapes and layouts are
        checked, and every request's rows of q must lie inside q without
        overlapping another's; the slot ids are the caller's to keep in range.
        """
        _check(
            q, k_cache, v_cache, req_to_token, rows, prefix_lens, extend_lens, starts, k_scale,
            v_scale,
        )  # fmt: skip
        num_tokens, num_heads, head_dim = q.shape
        if not self.supports(num_heads, k_cache.shape[1], head_dim, q.dtype):
            raise KernelShapeError(
                f"extend attention kernel: unsupported dtype {q.dtype} or shape "
                f"(heads {num_heads}, KV heads {k_cache.shape[1]}, head dim {head_dim})"
            )
        out = torch.zeros((num_tokens, num_heads, head_dim), dtype=q.dtype)
        self.launch(
            q, k_cache, v_cache, req_to_token, rows, prefix_lens, extend_lens, starts, scale, out,
            window, softcap, k_scale, v_scale,
        )  # fmt: skip
        return out

    def launch(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        req_to_token: torch.Tensor,
        rows: torch.Tensor,
        prefix_lens: torch.Tensor,
        extend_lens: torch.Tensor,
        starts: torch.Tensor,
        scale: float,
        out: torch.Tensor,
        window: int = 0,
        softcap: float = 0.0,
        k_scale: torch.Tensor | None = None,
        v_scale: torch.Tensor | None = None,
    ) -> None:
        """The call without its checks, writing the requests' rows of ``out`` (a
        contiguous (T, H, D) tensor of q's dtype), for a caller that guarantees what
        they check (``CpuAttentionBackend``: its pool and table are checked once,
        and its ``prepare`` makes the request tensors from a checked pass)."""
        _, num_heads, head_dim = q.shape
        if k_scale is None or v_scale is None:
            function, scales = self._functions[q.dtype], ()
        else:
            function = self._code_functions[q.dtype, k_cache.dtype]
            scales = (k_scale.data_ptr(), v_scale.data_ptr())
        status = function(
            q.data_ptr(),
            q.stride(0),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            req_to_token.data_ptr(),
            req_to_token.stride(0),
            rows.data_ptr(),
            prefix_lens.data_ptr(),
            extend_lens.data_ptr(),
            starts.data_ptr(),
            out.data_ptr(),
            out.stride(0),
            rows.shape[0],
            num_heads,
            k_cache.shape[1],
            head_dim,
            scale,
            window,
            softcap,
            *scales,
        )
        raise_for_status(status, "extend attention kernel")


def _check(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    rows: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    starts: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """What the kernel assumes and cannot check itself: dtypes, devices, layouts,
    and that each request's rows of q and keys exist."""
    num_tokens, _, head_dim = q.shape
    problems = cache_problems(k_cache, v_cache, req_to_token, q.dtype, head_dim, k_scale, v_scale)
    if q.device.type != "cpu" or (k_scale is None and q.dtype != k_cache.dtype):
        problems.append(f"q must be a CPU {k_cache.dtype} tensor")
    elif k_scale is not None and q.dtype not in _SYMBOLS:
        problems.append("q must be a CPU float32 or bfloat16 tensor")
    elif num_tokens and not rows_contiguous(q):
        problems.append("q must be contiguous within each row")
    batch = rows.shape[0] if rows.dim() == 1 else -1
    names = ("rows", "prefix_lens", "extend_lens", "starts")
    tensors = (rows, prefix_lens, extend_lens, starts)
    for name, t in zip(names, tensors, strict=True):
        if t.dtype != torch.int64 or t.device.type != "cpu" or t.shape != (batch,):
            problems.append(f"{name} must be a CPU int64 tensor of shape (B,), like rows")
        elif t.stride(-1) != 1:
            problems.append(f"{name} must be contiguous")
    if not problems and batch:
        if bool((extend_lens < 1).any()) or bool((prefix_lens < 0).any()):
            problems.append("extend_lens must be >= 1 and prefix_lens >= 0")
        elif bool((starts < 0).any()) or bool((starts + extend_lens > num_tokens).any()):
            problems.append(
                f"each request's rows starts .. starts + extend_lens must lie in q's {num_tokens}"
            )
        elif bool((prefix_lens + extend_lens > req_to_token.shape[1]).any()):
            problems.append(
                f"prefix_lens + extend_lens must fit req_to_token's {req_to_token.shape[1]} columns"
            )
        elif bool((rows < 0).any()) or bool((rows >= req_to_token.shape[0]).any()):
            problems.append(f"rows must index req_to_token's {req_to_token.shape[0]} rows")
        elif _overlap(starts, extend_lens):
            problems.append("requests' rows of q must not overlap (each is written once)")
    if problems:
        raise KernelShapeError("extend attention kernel: " + "; ".join(problems))


def _overlap(starts: torch.Tensor, extend_lens: torch.Tensor) -> bool:
    """Whether two requests' row ranges [start, start + extend) share a row."""
    order = torch.argsort(starts)
    ends = (starts + extend_lens)[order]
    return bool((starts[order][1:] < ends[:-1]).any())


def extend_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    rows: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    starts: torch.Tensor,
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """The kernel's computation in plain torch (float32 arithmetic), one request at
    a time; zero in the rows no request covers. A quantized cache (with
    k_scale/v_scale) is dequantized to float32 first."""
    group = q.shape[1] // k_cache.shape[1]
    out = torch.zeros_like(q)
    for b in range(rows.shape[0]):
        n, e, start = int(prefix_lens[b]), int(extend_lens[b]), int(starts[b])
        slots = req_to_token[rows[b], : n + e]
        keys = gather_float(k_cache, k_scale, slots)
        values = gather_float(v_cache, v_scale, slots)
        keys = keys.repeat_interleave(group, dim=1).transpose(0, 1)  # (H, S, D)
        values = values.repeat_interleave(group, dim=1).transpose(0, 1)
        queries = q[start : start + e].float().transpose(0, 1)  # (H, e, D)
        scores = cap_scores(queries @ keys.transpose(1, 2) * scale, softcap)  # (H, e, S)
        allowed = allowed_keys(n + torch.arange(e), n + e, window)  # (e, S)
        weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        out[start : start + e] = (weights @ values).transpose(0, 1).to(q.dtype)
    return out


@functools.cache
def load_extend_attention(build_dir: Path, target: KernelTarget = NATIVE) -> ExtendAttention:
    """The process's kernel built for ``target``, into ``build_dir`` the first time.

    Raises KernelBuildError (radixlm.kernels.cpu.native) when it cannot be built.
    """
    return ExtendAttention(load_library(SOURCE, build_dir, target))
