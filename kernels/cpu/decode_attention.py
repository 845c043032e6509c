"""Decode attention over the KV pool on CPU, reading K/V slots in place.

``DecodeAttention`` wraps the C++ kernel in ``decode_attention_cpu.cpp`` (built
by ``radixlm.kernels.cpu.native``); ``decode_attention_reference`` is the same
computation in plain torch, which the tests hold the kernel to.

What one call computes, for each decode row b (query ``q[b]``, (H, D))::

    slots = req_to_token[rows[b], : prefix_lens[b]]
    keys = cat(k_cache[slots], k_new[b : b + 1])      # (n + 1, Hkv, D)
    values = cat(v_cache[slots], v_new[b : b + 1])
    out[b, h] = softmax(scale * keys[:, h // G] @ q[b, h]) @ values[:, h // G]

with G = H / Hkv query heads per KV head. Two options shape the scores, as
``radixlm.kernels.paged_attention`` says (0: off): a sliding ``window`` W (the
row attends its last W positions, its new token included) and a ``softcap`` c
(scores c tanh(s / c)). The row's own new token comes from
``k_new``/``v_new`` rather than the pool, so the same call serves a pass that
has already written its K/V to the pool and one that stages them (a compiled
step, ``radixlm::decode_attention``).

A quantized pool (int8 or fp8 codes with a bfloat16 scale per token and KV head,
``radixlm.runtime.mem_cache.kv_quant``) is read as it is stored: the kernel takes
the codes as ``k_cache``/``v_cache`` and their scales as ``k_scale``/``v_scale``
((slots, Hkv) bfloat16), widens the codes in registers and multiplies the scales
into each token's score and softmax weight, so it reads a byte per value (plus a
scale per token and head) where a bfloat16 pool costs two. q, k_new, v_new and
the output stay in the model's float dtype; the row's new token is read from
k_new/v_new unquantized.

Reading the slots in place rather than gathering and padding them makes a whole
decode pass faster than the torch backend's gather + SDPA in both dtypes, most
with many rows of unequal lengths (``benchmarks/bench_decode_attention.py``;
benchmarks/README.md, "CPU paths and kernels").
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch

from radixlm.kernels.cpu.native import NATIVE, KernelTarget, load_library
from radixlm.kernels.paged_attention import allowed_keys, cap_scores

__all__ = [
    "CODE_DTYPES",
    "DecodeAttention",
    "KernelShapeError",
    "bind_functions",
    "cache_problems",
    "code_symbols",
    "check_cache",
    "decode_attention_codes_op",
    "decode_attention_op",
    "decode_attention_reference",
    "gather_float",
    "load_decode_attention",
    "raise_for_status",
    "rows_contiguous",
    "shape_supported",
]

SOURCE = Path(__file__).with_name("decode_attention_cpu.cpp")
# The kernel over a quantized pool: a library of its own (it includes SOURCE), so
# that the float kernel's code is what it is alone (see the file).
CODES_SOURCE = Path(__file__).with_name("decode_attention_codes_cpu.cpp")
_SYMBOLS = {
    torch.float32: "radixlm_decode_attention_f32",
    torch.bfloat16: "radixlm_decode_attention_bf16",
}
# A quantized pool's code dtypes, by the suffix of their entry points.
CODE_DTYPES = {torch.int8: "i8", torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}
MAX_GROUP = 8  # query heads per KV head (kMaxGroup in the kernel)
MAX_HEAD_DIM = 256  # kMaxChunks * kLanes
# Head dims the kernels take: whole AVX-512 vectors (16 floats), on the avx2 build
# too (8-float vectors), so a model runs on the kernels on either kind of CPU or neither.
_LANES = 16

_loaded: DecodeAttention | None = None
Key = TypeVar("Key")


class KernelShapeError(ValueError):
    """Tensors the kernel does not take (dtype, device, shape or layout)."""


class DecodeAttention:
    """The built kernel; call it like ``decode_attention_reference``."""

    def __init__(self, library: ctypes.CDLL, code_library: ctypes.CDLL) -> None:
        """library: SOURCE built; code_library: CODES_SOURCE built (the same target)."""
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        # q, q_stride, k, v, table, table_stride, rows, prefix_lens, k_new,
        # k_new_stride, v_new, v_new_stride, out, out_stride, B, H, Hkv, D, scale,
        # window, softcap
        argtypes = [ptr, i64, ptr, ptr, ptr, i64, ptr, ptr, ptr, i64, ptr, i64]
        argtypes += [ptr, i64, i64, i64, i64, i64, ctypes.c_float, i64, ctypes.c_float]
        self._functions = bind_functions(library, _SYMBOLS, argtypes)
        # over a quantized pool: the same, then k_scale, v_scale
        self._code_functions = bind_functions(
            code_library, code_symbols(_SYMBOLS), [*argtypes, ptr, ptr]
        )

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
        k_new: torch.Tensor,
        v_new: torch.Tensor,
        scale: float,
        window: int = 0,
        softcap: float = 0.0,
        k_scale: torch.Tensor | None = None,
        v_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q: (B, H, D); k_cache/v_cache: (slots, Hkv, D); req_to_token: (R, C) int64;
        rows/prefix_lens: (B,) int64; k_new/v_new: (B, Hkv, D); window, softcap: 0
        for none (see the module); k_scale/v_scale: (slots, Hkv) bfloat16 for a
        quantized cache (codes in ``CODE_DTYPES``), None for a float one (q's dtype).
        Returns (B, H, D).

        q, k_new and v_new may be row-strided views (a slice of a fused QKV
        projection); within a row, (heads, D) must be contiguous. Dtypes, shapes
        and layouts are checked; the values are the caller's to keep in range
        (rows < R, prefix_lens <= C, slot ids < slots), as checking them would
        read every index on every layer.
        """
        batch, num_heads, head_dim = q.shape
        num_kv_heads = k_cache.shape[1]
        _check(q, k_cache, v_cache, req_to_token, rows, prefix_lens, k_new, v_new, k_scale, v_scale)
        if not self.supports(num_heads, num_kv_heads, head_dim, q.dtype):
            raise KernelShapeError(
                f"decode attention kernel: unsupported dtype {q.dtype} or shape "
                f"(heads {num_heads}, KV heads {num_kv_heads}, head dim {head_dim})"
            )
        return self.launch(
            q, k_cache, v_cache, req_to_token, rows, prefix_lens, k_new, v_new, scale, window,
            softcap, k_scale, v_scale,
        )  # fmt: skip

    def launch(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        req_to_token: torch.Tensor,
        rows: torch.Tensor,
        prefix_lens: torch.Tensor,
        k_new: torch.Tensor,
        v_new: torch.Tensor,
        scale: float,
        window: int = 0,
        softcap: float = 0.0,
        k_scale: torch.Tensor | None = None,
        v_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The call without its checks, for a caller that guarantees what they check
        (``CpuAttentionBackend``: its pool and table are checked once with
        ``check_cache``, and the model hands it the same layouts every layer). The
        checks cost a large share of a short call, once per layer of every step.
        """
        batch, num_heads, head_dim = q.shape
        out = torch.empty((batch, num_heads, head_dim), dtype=q.dtype)
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
            k_new.data_ptr(),
            k_new.stride(0),
            v_new.data_ptr(),
            v_new.stride(0),
            out.data_ptr(),
            out.stride(0),
            batch,
            num_heads,
            k_cache.shape[1],
            head_dim,
            scale,
            window,
            softcap,
            *scales,
        )
        raise_for_status(status, "decode attention kernel")
        return out


def bind_functions(
    library: ctypes.CDLL, symbols: dict[Key, str], argtypes: list
) -> dict[Key, Callable[..., int]]:
    """The library's entry point for each key (a dtype, or a (dtype, code dtype)
    pair), typed: ``argtypes``, returning a C int status (0 ok, 1 shapes refused,
    2 out of memory)."""
    functions = {}
    for dtype, name in symbols.items():
        function = getattr(library, name)
        function.argtypes = argtypes
        function.restype = ctypes.c_int
        functions[dtype] = function
    return functions


def code_symbols(
    symbols: dict[torch.dtype, str],
) -> dict[tuple[torch.dtype, torch.dtype], str]:
    """The entry points over a quantized pool: ``<float entry point>_<code suffix>``
    for each (float dtype, code dtype) pair."""
    return {
        (dtype, code): f"{name}_{suffix}"
        for dtype, name in symbols.items()
        for code, suffix in CODE_DTYPES.items()
    }


def raise_for_status(status: int, kernel: str) -> None:
    """Turns a ``bind_functions`` entry point's status into an exception."""
    if status == 2:
        raise MemoryError(f"{kernel}: out of memory for its scratch buffers")
    if status != 0:
        raise KernelShapeError(f"{kernel} rejected its inputs (status {status})")


def shape_supported(
    num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, max_group: int
) -> bool:
    """What the CPU attention kernels take: float32 or bfloat16, at most
    ``max_group`` query heads per KV head, a head dim that is a multiple of 16 up to 256."""
    return (
        dtype in _SYMBOLS
        and num_kv_heads > 0
        and num_heads % num_kv_heads == 0
        and num_heads // num_kv_heads <= max_group
        and head_dim % _LANES == 0
        and 0 < head_dim <= MAX_HEAD_DIM
    )


def _check(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    rows: torch.Tensor,
    prefix_lens: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """What the kernel assumes and cannot check itself: dtypes, devices, layouts."""
    batch, num_heads, head_dim = q.shape
    cache_shape = (k_cache.shape[1], head_dim)
    problems = cache_problems(k_cache, v_cache, req_to_token, q.dtype, head_dim, k_scale, v_scale)
    if q.device.type != "cpu" or (k_scale is None and q.dtype != k_cache.dtype):
        problems.append(f"q must be a CPU {k_cache.dtype} tensor")
    elif k_scale is not None and q.dtype not in _SYMBOLS:
        problems.append("q must be a CPU float32 or bfloat16 tensor")
    for name, t in (("k_new", k_new), ("v_new", v_new)):
        if t.dtype != q.dtype or tuple(t.shape) != (batch, *cache_shape):
            problems.append(f"{name} must be a {q.dtype} tensor of shape {(batch, *cache_shape)}")
        elif batch and not rows_contiguous(t):
            problems.append(f"{name} must be contiguous within each row")
    if batch and not rows_contiguous(q):
        problems.append("q must be contiguous within each row")
    for name, t in (("rows", rows), ("prefix_lens", prefix_lens)):
        if t.dtype != torch.int64 or t.device.type != "cpu" or t.stride(-1) != 1:
            problems.append(f"{name} must be a contiguous CPU int64 tensor")
    if rows.shape != (batch,) or prefix_lens.shape != (batch,):
        problems.append(f"rows and prefix_lens must have shape ({batch},)")
    if problems:
        raise KernelShapeError("decode attention kernel: " + "; ".join(problems))


def check_cache(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Checks a KV pool's K/V (``(layers, slots, Hkv, D)`` or one layer's
    ``(slots, Hkv, D)``), its scales when quantized (``(layers, slots, Hkv)`` or
    ``(slots, Hkv)``) and its req_to_token table once, for callers of ``launch``."""
    dtype, head_dim = k_cache.dtype, k_cache.shape[-1]
    problems = cache_problems(k_cache, v_cache, req_to_token, dtype, head_dim, k_scale, v_scale)
    if k_scale is None and dtype not in _SYMBOLS:
        problems.append(f"unsupported dtype {dtype}")
    if problems:
        raise KernelShapeError("decode attention kernel: " + "; ".join(problems))


def cache_problems(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    dtype: torch.dtype,
    head_dim: int,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> list[str]:
    """What a CPU attention kernel cannot take in a pool and its table, as messages.

    dtype: the model's (q's); a float cache must hold it. With scales (a quantized
    pool) the cache holds codes of a ``CODE_DTYPES`` dtype instead, and the scales
    must be contiguous bfloat16 tensors shaped like the cache without its last dim.
    """
    problems = []
    if (k_scale is None) != (v_scale is None):
        problems.append("k_scale and v_scale come together")
    quantized = k_scale is not None
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.device.type != "cpu":
            problems.append(f"{name} must be a CPU tensor")
        elif quantized and t.dtype not in CODE_DTYPES:
            problems.append(f"{name} must hold int8 or fp8 codes with k_scale/v_scale")
        elif not quantized and t.dtype != dtype:
            problems.append(f"{name} must be a CPU {dtype} tensor")
    if k_cache.dtype != v_cache.dtype:
        problems.append("k_cache and v_cache must have one dtype")
    if k_cache.shape != v_cache.shape or k_cache.shape[-1] != head_dim:
        problems.append("k_cache and v_cache must both be (slots, Hkv, D)")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        problems.append("k_cache and v_cache must be contiguous")
    for name, t in (("k_scale", k_scale), ("v_scale", v_scale)):
        if t is None:
            continue
        if t.dtype != torch.bfloat16 or t.device.type != "cpu" or not t.is_contiguous():
            problems.append(f"{name} must be a contiguous CPU bfloat16 tensor")
        elif t.shape != k_cache.shape[:-1]:
            problems.append(f"{name} must have shape {tuple(k_cache.shape[:-1])}")
    if (
        req_to_token.dtype != torch.int64
        or req_to_token.device.type != "cpu"
        or req_to_token.stride(-1) != 1
    ):
        problems.append("req_to_token must be a contiguous CPU int64 tensor")
    return problems


def rows_contiguous(t: torch.Tensor) -> bool:
    """Whether a (rows, heads, D) tensor is contiguous within each row (rows may be strided)."""
    return t.stride(2) == 1 and t.stride(1) == t.shape[2]


def decode_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    rows: torch.Tensor,
    prefix_lens: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """The kernel's computation in plain torch (float32 arithmetic), one row at a
    time; a quantized cache (with k_scale/v_scale) is dequantized to float32 first."""
    group = q.shape[1] // k_cache.shape[1]
    out = torch.empty_like(q)
    for b in range(q.shape[0]):
        slots = req_to_token[rows[b], : prefix_lens[b]]
        cached_k = gather_float(k_cache, k_scale, slots)
        cached_v = gather_float(v_cache, v_scale, slots)
        keys = torch.cat((cached_k, k_new[b : b + 1].float()))  # (n + 1, Hkv, D)
        values = torch.cat((cached_v, v_new[b : b + 1].float()))
        keys = keys.repeat_interleave(group, dim=1).transpose(0, 1)  # (H, n + 1, D)
        values = values.repeat_interleave(group, dim=1).transpose(0, 1)
        scores = cap_scores(torch.einsum("hd,hnd->hn", q[b].float(), keys) * scale, softcap)
        allowed = allowed_keys(prefix_lens[b : b + 1], keys.shape[1], window)  # (1, n + 1)
        scores = scores.masked_fill(~allowed, float("-inf"))
        out[b] = torch.einsum("hn,hnd->hd", scores.softmax(-1), values).to(q.dtype)
    return out


def gather_float(
    cache: torch.Tensor, scales: torch.Tensor | None, slots: torch.Tensor
) -> torch.Tensor:
    """cache[slots] as float32: a float cache's values, or a quantized one's codes
    times their scales (``kv_quant.dequantize`` in float32). Gathered as bytes:
    torch indexes no fp8 tensor on the CPU."""
    if scales is None:
        return cache[slots].float()
    codes = cache.view(torch.uint8)[slots].view(cache.dtype)
    return codes.float() * scales[slots].float()[..., None]


def load_decode_attention(build_dir: Path, target: KernelTarget = NATIVE) -> DecodeAttention:
    """The process's kernel built for ``target``, into ``build_dir`` the first time.

    ``radixlm::decode_attention`` (the op compiled graphs call) runs the kernel
    loaded last.

    Raises KernelBuildError (radixlm.kernels.cpu.native) when it cannot be built.
    """
    global _loaded
    _loaded = _load(build_dir, target)
    return _loaded


@functools.cache
def _load(build_dir: Path, target: KernelTarget) -> DecodeAttention:
    return DecodeAttention(
        load_library(SOURCE, build_dir, target), load_library(CODES_SOURCE, build_dir, target)
    )


@torch.library.custom_op("radixlm::decode_attention", mutates_args=())
def decode_attention_op(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    rows: torch.Tensor,
    prefix_lens: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
) -> torch.Tensor:
    """The loaded kernel as an op ``torch.compile`` calls as is (a compiled decode step).

    Eager code calls the ``DecodeAttention`` object directly (an op costs a dispatch more).
    """
    if _loaded is None:
        raise RuntimeError("radixlm::decode_attention called before load_decode_attention()")
    # A compiled graph may hand over other layouts than the eager model makes.
    q, k_new, v_new = (t if rows_contiguous(t) else t.contiguous() for t in (q, k_new, v_new))
    return _loaded(
        q, k_cache, v_cache, req_to_token, rows, prefix_lens, k_new, v_new, scale, window, softcap
    )


@decode_attention_op.register_fake
def _(q: torch.Tensor, *rest: object) -> torch.Tensor:
    return q.new_empty(q.shape)  # the output is shaped like q; the rest only feed the kernel


@torch.library.custom_op("radixlm::decode_attention_codes", mutates_args=())
def decode_attention_codes_op(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    rows: torch.Tensor,
    prefix_lens: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
) -> torch.Tensor:
    """``decode_attention_op`` over a quantized pool: k_cache/v_cache its codes,
    k_scale/v_scale their scales. An op of its own, its scales required: optional
    tensor arguments left at None are dropped from the calls that inductor's C++
    wrapper makes, which then read past their arguments (a crash, seen)."""
    if _loaded is None:
        raise RuntimeError("radixlm::decode_attention_codes called before load_decode_attention()")
    q, k_new, v_new = (t if rows_contiguous(t) else t.contiguous() for t in (q, k_new, v_new))
    return _loaded(
        q, k_cache, v_cache, req_to_token, rows, prefix_lens, k_new, v_new, scale, window, softcap,
        k_scale, v_scale,
    )  # fmt: skip


@decode_attention_codes_op.register_fake
def _(q: torch.Tensor, *rest: object) -> torch.Tensor:
    return q.new_empty(q.shape)
