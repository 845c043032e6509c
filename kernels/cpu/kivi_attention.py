"""Decode and extend attention over a KIVI KV pool on CPU, reading its codes in place.

``KiviAttention`` wraps two C++ libraries, ``decode_attention_kivi_cpu.cpp`` (decode
rows) and ``extend_attention_kivi_cpu.cpp`` (prefill rows), built by
``radixlm.kernels.cpu.native``. A layer of the pool is a ``KiviCache``: its packed
4- or 2-bit codes, their float16 parameters and the rows' float windows, laid out
as ``radixlm.runtime.mem_cache.kivi`` says (its ``gather`` is the reading the
kernels equal; the tests hold them to it).

Both read every position of a request from the pool: a pass over a KIVI pool stores
its own tokens first (``KiviWrites``), so, unlike the other kernels, a decode row's
new token is read from the pool too, and a decode row gives the tokens stored
(``seq_lens``, its new one included) where the others give its cached prefix.
Per request of n tokens, positions below n // G * G are codes, dequantized in
float32 (a key group's scales multiplied into the query once per group, a token's
value scales into its softmax weight), the rest its window's floats. Scores,
window, soft-cap and the softmax are the float kernels' (``decode_attention``,
``extend_attention``).
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from radixlm.kernels.cpu.decode_attention import MAX_GROUP as DECODE_MAX_GROUP
from radixlm.kernels.cpu.decode_attention import (
    KernelShapeError,
    bind_functions,
    raise_for_status,
    rows_contiguous,
    shape_supported,
)
from radixlm.kernels.cpu.extend_attention import MAX_GROUP as EXTEND_MAX_GROUP
from radixlm.kernels.cpu.native import NATIVE, KernelTarget, load_library

__all__ = [
    "KiviAttention",
    "KiviCache",
    "decode_attention_kivi_op",
    "load_kivi_attention",
]

DECODE_SOURCE = Path(__file__).with_name("decode_attention_kivi_cpu.cpp")
EXTEND_SOURCE = Path(__file__).with_name("extend_attention_kivi_cpu.cpp")
_DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16"}
_BITS = (4, 2)

_loaded: KiviAttention | None = None


@dataclass(frozen=True)
class KiviCache:
    """One layer of a KIVI pool, as the kernels read it.

    k, v: (slots, Hkv, D * bits / 8) uint8 packed codes.
    meta: (slots, Hkv, 2 D / group + 2 D / value_group) float16 parameters.
    window_k, window_v: (rows, group, Hkv, D) in the model's dtype.
    bits: 4 or 2; group: key positions per group; value_group: value channels per group.
    """

    k: torch.Tensor
    v: torch.Tensor
    meta: torch.Tensor
    window_k: torch.Tensor
    window_v: torch.Tensor
    bits: int
    group: int
    value_group: int

    @property
    def head_dim(self) -> int:
        return self.window_k.shape[-1]

    @property
    def num_kv_heads(self) -> int:
        return self.window_k.shape[-2]

    def problems(self, dtype: torch.dtype) -> list[str]:
        """What the kernels cannot take in this layer for a model of ``dtype``."""
        heads, dim, bits = self.num_kv_heads, self.head_dim, self.bits
        problems = []
        if bits not in _BITS:
            problems.append(f"KIVI codes of 4 or 2 bits, not {bits}")
        elif (
            self.value_group % 16
            or dim % self.value_group
            or (2 * dim) % self.group
            or self.window_k.shape[1] != self.group
        ):
            problems.append(
                f"value groups of a multiple of 16 channels dividing the head dim, and key "
                f"groups dividing 2 D (head dim {dim}, group {self.group}, value group "
                f"{self.value_group}, window of {self.window_k.shape[1]})"
            )
        else:
            codes = (self.k.shape[0], heads, dim * bits // 8)
            meta = (self.k.shape[0], heads, 2 * dim // self.group + 2 * dim // self.value_group)
            for name, t, shape, want in (
                ("k", self.k, codes, torch.uint8),
                ("v", self.v, codes, torch.uint8),
                ("meta", self.meta, meta, torch.float16),
                ("window_v", self.window_v, tuple(self.window_k.shape), dtype),
                ("window_k", self.window_k, tuple(self.window_k.shape), dtype),
            ):
                if t.dtype != want or tuple(t.shape) != shape:
                    problems.append(f"{name} must be a {want} tensor of shape {shape}")
                elif t.device.type != "cpu" or not t.is_contiguous():
                    problems.append(f"{name} must be a contiguous CPU tensor")
        return problems

    def args(self) -> tuple:
        """The layer's pointers, as the entry points take them."""
        return (
            self.k.data_ptr(),
            self.v.data_ptr(),
            self.meta.data_ptr(),
            self.window_k.data_ptr(),
            self.window_v.data_ptr(),
        )


class KiviAttention:
    """Both built kernels: ``decode`` for decode rows, ``extend`` for prefill rows."""

    def __init__(self, decode_library: ctypes.CDLL, extend_library: ctypes.CDLL) -> None:
        i64, ptr, f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
        pool = [ptr, ptr, ptr, ptr, ptr]  # k, v, meta, window_k, window_v
        layout = [i64, i64, i64, i64, i64, i64, f32, i64, f32]  # H, Hkv, D, group, vgroup,
        # scale, window, softcap (after B)
        # q, q_stride, pool, table, table_stride, rows, seq_lens, out, out_stride, B, layout
        decode = [ptr, i64, *pool, ptr, i64, ptr, ptr, ptr, i64, *layout]
        # q, q_stride, pool, table, table_stride, rows, prefix_lens, extend_lens, starts,
        # out, out_stride, B, layout
        extend = [ptr, i64, *pool, ptr, i64, ptr, ptr, ptr, ptr, ptr, i64, *layout]
        symbols = {(d, b): f"{name}_b{b}" for d, name in _DTYPES.items() for b in _BITS}
        self._decode = bind_functions(
            decode_library,
            {key: f"radixlm_decode_attention_kivi_{name}" for key, name in symbols.items()},
            decode,
        )
        self._extend = bind_functions(
            extend_library,
            {key: f"radixlm_extend_attention_kivi_{name}" for key, name in symbols.items()},
            extend,
        )

    @staticmethod
    def supports(num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> bool:
        """Whether a model of this shape and dtype can use both kernels."""
        shape = (num_heads, num_kv_heads, head_dim, dtype)
        return shape_supported(*shape, DECODE_MAX_GROUP) and shape_supported(
            *shape, EXTEND_MAX_GROUP
        )

    def decode(
        self,
        q: torch.Tensor,
        cache: KiviCache,
        req_to_token: torch.Tensor,
        rows: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
        window: int = 0,
        softcap: float = 0.0,
    ) -> torch.Tensor:
        """Decode rows' attention over their stored positions 0 .. seq_lens[b] - 1.

        q: (B, H, D), row-strided allowed; req_to_token: (R, C) int64; rows, seq_lens:
        (B,) int64, every seq_len >= 1; window, softcap: 0 for none. Returns (B, H, D).
        Checked as ``DecodeAttention`` checks its inputs (the indices are the caller's
        to keep in range)."""
        problems = _common_problems(q, cache, req_to_token, DECODE_MAX_GROUP)
        for name, t in (("rows", rows), ("seq_lens", seq_lens)):
            if t.dtype != torch.int64 or t.device.type != "cpu" or t.shape != (q.shape[0],):
                problems.append(f"{name} must be a CPU int64 tensor of shape ({q.shape[0]},)")
            elif t.stride(-1) != 1:
                problems.append(f"{name} must be contiguous")
        if not problems and q.shape[0] and bool((seq_lens < 1).any()):
            problems.append("every row attends at least its new token: seq_lens >= 1")
        if problems:
            raise KernelShapeError("KIVI decode attention kernel: " + "; ".join(problems))
        return self.launch_decode(q, cache, req_to_token, rows, seq_lens, scale, window, softcap)

    def launch_decode(
        self,
        q: torch.Tensor,
        cache: KiviCache,
        req_to_token: torch.Tensor,
        rows: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
        window: int = 0,
        softcap: float = 0.0,
    ) -> torch.Tensor:
        """``decode`` without its checks (``CpuAttentionBackend``: its pool is checked
        once, and the model hands it the same layouts every layer)."""
        batch, num_heads, head_dim = q.shape
        out = torch.empty((batch, num_heads, head_dim), dtype=q.dtype)
        status = self._decode[q.dtype, cache.bits](
            q.data_ptr(), q.stride(0), *cache.args(), req_to_token.data_ptr(),
            req_to_token.stride(0), rows.data_ptr(), seq_lens.data_ptr(), out.data_ptr(),
            out.stride(0), batch, num_heads, cache.num_kv_heads, head_dim, cache.group,
            cache.value_group, scale, window, softcap,
        )  # fmt: skip
        raise_for_status(status, "KIVI decode attention kernel")
        return out

    def extend(
        self,
        q: torch.Tensor,
        cache: KiviCache,
        req_to_token: torch.Tensor,
        rows: torch.Tensor,
        prefix_lens: torch.Tensor,
        extend_lens: torch.Tensor,
        starts: torch.Tensor,
        scale: float,
        window: int = 0,
        softcap: float = 0.0,
    ) -> torch.Tensor:
        """Prefill rows' causal attention over their stored positions (prefix and new
        tokens both in the pool), as ``ExtendAttention`` computes it. q: (T, H, D);
        rows/prefix_lens/extend_lens/starts: (B,) int64. Returns (T, H, D), zero in
        the rows no request covers."""
        problems = _common_problems(q, cache, req_to_token, EXTEND_MAX_GROUP)
        batch = rows.shape[0] if rows.dim() == 1 else -1
        for name, t in zip(
            ("rows", "prefix_lens", "extend_lens", "starts"),
            (rows, prefix_lens, extend_lens, starts),
            strict=True,
        ):
            if t.dtype != torch.int64 or t.device.type != "cpu" or t.shape != (batch,):
                problems.append(f"{name} must be a CPU int64 tensor of shape (B,), like rows")
            elif t.stride(-1) != 1:
                problems.append(f"{name} must be contiguous")
        if not problems and batch:
            if bool((extend_lens < 1).any()) or bool((prefix_lens < 0).any()):
                problems.append("extend_lens must be >= 1 and prefix_lens >= 0")
            elif bool((starts < 0).any()) or bool((starts + extend_lens > q.shape[0]).any()):
                problems.append(f"each request's rows must lie in q's {q.shape[0]}")
        if problems:
            raise KernelShapeError("KIVI extend attention kernel: " + "; ".join(problems))
        out = torch.zeros(q.shape, dtype=q.dtype)
        self.launch_extend(
            q, cache, req_to_token, rows, prefix_lens, extend_lens, starts, scale, out, window,
            softcap,
        )  # fmt: skip
        return out

    def launch_extend(
        self,
        q: torch.Tensor,
        cache: KiviCache,
        req_to_token: torch.Tensor,
        rows: torch.Tensor,
        prefix_lens: torch.Tensor,
        extend_lens: torch.Tensor,
        starts: torch.Tensor,
        scale: float,
        out: torch.Tensor,
        window: int = 0,
        softcap: float = 0.0,
    ) -> None:
        """``extend`` without its checks, writing the requests' rows of ``out`` (a
        contiguous (T, H, D) tensor of q's dtype)."""
        _, num_heads, head_dim = q.shape
        status = self._extend[q.dtype, cache.bits](
            q.data_ptr(), q.stride(0), *cache.args(), req_to_token.data_ptr(),
            req_to_token.stride(0), rows.data_ptr(), prefix_lens.data_ptr(),
            extend_lens.data_ptr(), starts.data_ptr(), out.data_ptr(), out.stride(0),
            rows.shape[0], num_heads, cache.num_kv_heads, head_dim, cache.group,
            cache.value_group, scale, window, softcap,
        )  # fmt: skip
        raise_for_status(status, "KIVI extend attention kernel")


def _common_problems(
    q: torch.Tensor, cache: KiviCache, req_to_token: torch.Tensor, max_group: int
) -> list[str]:
    """What either kernel cannot take in q, the layer and the table."""
    _, num_heads, head_dim = q.shape
    problems = cache.problems(q.dtype)
    if q.device.type != "cpu" or q.dtype not in _DTYPES:
        problems.append("q must be a CPU float32 or bfloat16 tensor")
    elif q.shape[0] and not rows_contiguous(q):
        problems.append("q must be contiguous within each row")
    if not shape_supported(num_heads, cache.num_kv_heads, head_dim, q.dtype, max_group):
        problems.append(
            f"unsupported shape (heads {num_heads}, KV heads {cache.num_kv_heads}, "
            f"head dim {head_dim})"
        )
    if (
        req_to_token.dtype != torch.int64
        or req_to_token.device.type != "cpu"
        or req_to_token.stride(-1) != 1
    ):
        problems.append("req_to_token must be a contiguous CPU int64 tensor")
    return problems


def load_kivi_attention(build_dir: Path, target: KernelTarget = NATIVE) -> KiviAttention:
    """The process's kernels built for ``target``, into ``build_dir`` the first time.

    ``radixlm::decode_attention_kivi`` runs the kernels loaded last.

    Raises KernelBuildError (radixlm.kernels.cpu.native) when they cannot be built.
    """
    global _loaded
    _loaded = _load(build_dir, target)
    return _loaded


@functools.cache
def _load(build_dir: Path, target: KernelTarget) -> KiviAttention:
    return KiviAttention(
        load_library(DECODE_SOURCE, build_dir, target),
        load_library(EXTEND_SOURCE, build_dir, target),
    )


@torch.library.custom_op("radixlm::decode_attention_kivi", mutates_args=())
def decode_attention_kivi_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    meta: torch.Tensor,
    window_k: torch.Tensor,
    window_v: torch.Tensor,
    req_to_token: torch.Tensor,
    rows: torch.Tensor,
    seq_lens: torch.Tensor,
    bits: int,
    group: int,
    value_group: int,
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
) -> torch.Tensor:
    """The loaded decode kernel as an op ``torch.compile`` calls as is; the layer's
    tensors one by one (an op takes no dataclass). Eager code calls
    ``KiviAttention.decode`` directly."""
    if _loaded is None:
        raise RuntimeError("radixlm::decode_attention_kivi called before load_kivi_attention()")
    q = q if rows_contiguous(q) else q.contiguous()
    cache = KiviCache(k, v, meta, window_k, window_v, bits, group, value_group)
    return _loaded.decode(q, cache, req_to_token, rows, seq_lens, scale, window, softcap)


@decode_attention_kivi_op.register_fake
def _(q: torch.Tensor, *rest: object) -> torch.Tensor:
    return q.new_empty(q.shape)
