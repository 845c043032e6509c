"""The C++ decode and extend kernels over a KIVI pool (kivi4, kivi2) against float64
attention over the pool as ``kivi.gather`` reads it in float32 (the kernels
dequantize in float32 and never round K/V to the model's dtype), on every ISA build.

A pool holds each request's tokens as earlier passes of uneven sizes wrote them
(``KiviWrites``): whole key groups as codes, the rest in the row's float window.
Lengths on both sides of a group's edge, shorter than a group (window only), whole
groups (the window empty), and past a decode span (512 positions)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from radixlm.kernels.cpu.decode_attention import KernelShapeError
from radixlm.kernels.cpu.kivi_attention import (
    KiviAttention,
    KiviCache,
    decode_attention_kivi_op,
    load_kivi_attention,
)
from radixlm.kernels.cpu.native import KernelTarget
from radixlm.kernels.paged_attention import allowed_keys, cap_scores
from radixlm.runtime.mem_cache import kivi
from radixlm.runtime.mem_cache.kivi import KiviWrites
from radixlm.runtime.mem_cache.kv_pool import KVPool, ReqToTokenTable
from radixlm.runtime.mem_cache.kv_quant import kv_format
from radixlm.runtime.model_store import cache_root

G = kivi.KIVI_GROUP
FORMATS = ["kivi4", "kivi2"]
DTYPES = [torch.float32, torch.bfloat16]
DECODE_LENS = [1, 5, 31, 32, 33, 64, 100, 700, 1100]  # tokens stored, the new one's included
EXTEND = [(0, 45), (32, 7), (20, 50), (0, 9), (33, 31), (0, 64), (100, 300)]  # (cached, new)
SHAPES = [(4, 2, 64), (9, 3, 64), (8, 1, 128), (8, 8, 32), (6, 2, 96), (2, 2, 256)]


@pytest.fixture(scope="module")
def kernel(kernel_target_and_native: KernelTarget) -> KiviAttention:
    """Every ISA build and the native one: its extend kernel shares the float extend
    kernel's tiles, whose bfloat16 queries take the dot products there."""
    return load_kivi_attention(cache_root() / "kernels", kernel_target_and_native)


@dataclass
class Pool:
    """One layer of a KIVI pool holding requests' tokens, its table and rows."""

    pool: KVPool
    table: ReqToTokenTable
    rows: torch.Tensor  # (B,) each request's req_to_token row
    lens: torch.Tensor  # (B,) its tokens stored

    def cache(self) -> KiviCache:
        p, layout = self.pool, self.pool.kivi_layout
        return KiviCache(
            p.k[0], p.v[0], p.meta[0], p.window_k[0], p.window_v[0], layout.bits, layout.group,
            layout.value_group,
        )  # fmt: skip

    def values(self, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Request b's K and V as stored: (n, Hkv, D) float64 each."""
        n, row = int(self.lens[b]), self.rows[b : b + 1]
        slots = self.table.table[row, :n]
        keys, values = kivi.gather(self.pool, 0, slots, row, self.lens[b : b + 1], torch.float32)
        return keys[0].double(), values[0].double()


def _pool(fmt: str, lens: list[int], kv_heads: int, head_dim: int, dtype, seed: int = 0) -> Pool:
    """Requests of ``lens`` tokens in scattered slots, written in passes of 13 tokens,
    then one of the rest (K/V of varied magnitudes and offsets)."""
    gen = torch.Generator().manual_seed(seed)
    total = sum(lens)
    pool = KVPool(
        1, total + 8, kv_heads, head_dim, dtype, fmt=kv_format(fmt, dtype), rows=len(lens) + 2
    )
    table = ReqToTokenTable(len(lens) + 2, max(lens, default=1) + 1)
    table.allocate_row()  # row 0 unused: rows need not start at 0
    slots = torch.randperm(total, generator=gen) + 2
    rows, at = [], 0
    for n in lens:
        row = table.allocate_row()
        assert row is not None
        table.write(row, 0, slots[at : at + n])
        at += n
        done = 0
        while done < n:
            step = min(13 if done < 40 else n, n - done)
            k, v = torch.randn(2, step, kv_heads, head_dim, generator=gen)
            k = k * torch.rand(1, 1, head_dim, generator=gen) * 4 + torch.randn(
                head_dim, generator=gen
            )
            v = v * 3 + 1
            writes = KiviWrites.plan(table.table, [row], [done], [step], G, torch.device("cpu"))
            writes.store(pool, 0, k.to(dtype), v.to(dtype))
            done += step
        rows.append(row)
    return Pool(pool, table, torch.tensor(rows, dtype=torch.int64), torch.tensor(lens))


def _decode_truth(p: Pool, q: torch.Tensor, scale: float, window: int, softcap: float):
    """float64 attention of each decode row (its last stored position) over its stored
    K/V: (B, H, D)."""
    out = []
    for b in range(q.shape[0]):
        keys, values = p.values(b)
        n = keys.shape[0]
        group = q.shape[1] // keys.shape[1]
        keys, values = (x.repeat_interleave(group, dim=1) for x in (keys, values))
        scores = cap_scores(torch.einsum("hd,shd->hs", q[b].double(), keys) * scale, softcap)
        allowed = allowed_keys(torch.tensor([n - 1]), n, window)  # (1, n)
        scores = scores.masked_fill(~allowed, float("-inf"))
        out.append(torch.einsum("hs,shd->hd", scores.softmax(-1), values))
    return torch.stack(out)


def _extend_truth(p: Pool, q, prefix_lens, starts, scale: float, window: int, softcap: float):
    """float64 causal attention of each request's new tokens: (T, H, D), zero elsewhere."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    for b in range(p.rows.shape[0]):
        keys, values = p.values(b)
        n, cached, start = keys.shape[0], int(prefix_lens[b]), int(starts[b])
        group = q.shape[1] // keys.shape[1]
        keys, values = (x.repeat_interleave(group, dim=1) for x in (keys, values))
        queries = q[start : start + n - cached].double()
        scores = cap_scores(torch.einsum("thd,shd->ths", queries, keys) * scale, softcap)
        allowed = allowed_keys(cached + torch.arange(n - cached), n, window)  # (t, n)
        scores = scores.masked_fill(~allowed[:, None], float("-inf"))
        out[start : start + n - cached] = torch.einsum("ths,shd->thd", scores.softmax(-1), values)
    return out


def _assert_near(got: torch.Tensor, truth: torch.Tensor) -> None:
    """float32 evaluation (orders of sums, exp and tanh approximations), plus one
    rounding to a bfloat16 output."""
    rtol = 0.0 if got.dtype == torch.float32 else 2.0**-8
    torch.testing.assert_close(got.double(), truth, atol=5e-5, rtol=rtol)


def _queries(num_tokens: int, heads: int, kv_heads: int, head_dim: int, dtype, seed: int = 1):
    """q of a fused QKV projection: a row-strided view, as the model hands it over."""
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(num_tokens, heads + 2 * kv_heads, head_dim, generator=gen).to(dtype)
    return qkv[:, :heads]


# ---- decode -----------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), SHAPES)
def test_decode_matches_attention_over_gathered_values(
    kernel, fmt, dtype, heads, kv_heads, head_dim
):
    """Grouped and plain heads, the specialised head dims (64, 128) and the generic
    path; rows wholly in the window, wholly codes and both, some over several spans."""
    p = _pool(fmt, DECODE_LENS, kv_heads, head_dim, dtype)
    q = _queries(len(DECODE_LENS), heads, kv_heads, head_dim, dtype)
    scale = head_dim**-0.5
    got = kernel.decode(q, p.cache(), p.table.table, p.rows, p.lens, scale)
    assert got.dtype == dtype and got.shape == q.shape
    _assert_near(got, _decode_truth(p, q, scale, 0, 0.0))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("window", "softcap"), [(1, 0.0), (16, 0.0), (40, 0.0), (600, 0.0), (0, 5.0), (100, 30.0)]
)
def test_decode_window_and_softcap(kernel, fmt, dtype, window, softcap) -> None:
    """A window of the new token alone, one starting inside a group, one inside the
    codes; soft-capped scores (q scaled up so that the cap bends them)."""
    p = _pool(fmt, DECODE_LENS, 3, 64, dtype, seed=window)
    q = (_queries(len(DECODE_LENS), 9, 3, 64, torch.float32) * 4).to(dtype)
    got = kernel.decode(q, p.cache(), p.table.table, p.rows, p.lens, 0.125, window, softcap)
    _assert_near(got, _decode_truth(p, q, 0.125, window, softcap))


def test_decode_op_equals_the_direct_call(kernel) -> None:
    p = _pool("kivi4", [7, 40, 64], 3, 64, torch.float32)
    q = _queries(3, 9, 3, 64, torch.float32)
    c = p.cache()
    want = kernel.decode(q, c, p.table.table, p.rows, p.lens, 0.125, 16, 5.0)
    op = decode_attention_kivi_op(
        q, c.k, c.v, c.meta, c.window_k, c.window_v, p.table.table, p.rows, p.lens, c.bits,
        c.group, c.value_group, 0.125, 16, 5.0,
    )  # fmt: skip
    assert torch.equal(op, want)
    assert torch.equal(
        kernel.launch_decode(q, c, p.table.table, p.rows, p.lens, 0.125, 16, 5.0), want
    )


def test_decode_thread_count_does_not_change_the_result(kernel) -> None:
    p = _pool("kivi2", [1100, 33], 3, 64, torch.float32)
    q = _queries(2, 9, 3, 64, torch.float32)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kernel.decode(q, p.cache(), p.table.table, p.rows, p.lens, 0.125)
        torch.set_num_threads(2)
        two = kernel.decode(q, p.cache(), p.table.table, p.rows, p.lens, 0.125)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)


def test_decode_inputs_are_checked(kernel) -> None:
    p = _pool("kivi4", [5, 40], 3, 64, torch.float32)
    q, c, table = _queries(2, 9, 3, 64, torch.float32), p.cache(), p.table.table
    with pytest.raises(KernelShapeError, match="seq_lens >= 1"):
        kernel.decode(q, c, table, p.rows, torch.tensor([0, 3]), 0.125)
    with pytest.raises(KernelShapeError, match="window_k must be a torch.bfloat16"):
        kernel.decode(q.bfloat16(), c, table, p.rows, p.lens, 0.125)
    with pytest.raises(KernelShapeError, match="4 or 2 bits"):
        kernel.decode(q, KiviCache(**{**c.__dict__, "bits": 3}), table, p.rows, p.lens, 0.125)
    with pytest.raises(KernelShapeError, match="meta must be"):
        kernel.decode(
            q, KiviCache(**{**c.__dict__, "meta": c.meta.float()}), table, p.rows, p.lens, 0.125
        )
    with pytest.raises(KernelShapeError, match="unsupported shape"):
        kernel.decode(_queries(2, 8, 3, 64, torch.float32), c, table, p.rows, p.lens, 0.125)
    with pytest.raises(KernelShapeError, match="rows must be"):
        kernel.decode(q, c, table, p.rows[:1], p.lens, 0.125)


# ---- extend -----------------------------------------------------------------------------


def _extend_case(fmt, dtype, heads, kv_heads, head_dim, requests, seed: int = 0):
    p = _pool(fmt, [c + n for c, n in requests], kv_heads, head_dim, dtype, seed)
    prefix = torch.tensor([c for c, _ in requests])
    extend = torch.tensor([n for _, n in requests])
    starts = torch.cumsum(extend, 0) - extend
    q = _queries(int(extend.sum()), heads, kv_heads, head_dim, dtype, seed + 1)
    return p, q, prefix, extend, starts


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), SHAPES)
def test_extend_matches_attention_over_gathered_values(
    kernel, fmt, dtype, heads, kv_heads, head_dim
):
    """Fresh prompts with and without whole groups, extends on cached prefixes that
    do or do not end on a group, one ending exactly on a group, a long one."""
    p, q, prefix, extend, starts = _extend_case(fmt, dtype, heads, kv_heads, head_dim, EXTEND)
    scale = head_dim**-0.5
    got = kernel.extend(q, p.cache(), p.table.table, p.rows, prefix, extend, starts, scale)
    assert got.dtype == dtype and got.shape == q.shape
    _assert_near(got, _extend_truth(p, q, prefix, starts, scale, 0, 0.0))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    ("window", "softcap"), [(1, 0.0), (40, 0.0), (300, 0.0), (0, 5.0), (64, 30.0)]
)
def test_extend_window_and_softcap(kernel, fmt, window, softcap) -> None:
    requests = [*EXTEND, (600, 20)]  # a window hiding a long prefix's first key blocks
    p, q, prefix, extend, starts = _extend_case(fmt, torch.float32, 9, 3, 64, requests, window)
    q = q * 4
    got = kernel.extend(
        q, p.cache(), p.table.table, p.rows, prefix, extend, starts, 0.125, window, softcap
    )
    _assert_near(got, _extend_truth(p, q, prefix, starts, 0.125, window, softcap))


def test_extend_rows_no_request_covers_are_left_alone(kernel) -> None:
    p, q, prefix, extend, starts = _extend_case(
        "kivi4", torch.float32, 9, 3, 64, [(3, 30), (40, 2)]
    )
    wider = torch.cat((q, q[:4])).contiguous()
    out = torch.full(wider.shape, 7.0)
    kernel.launch_extend(
        wider, p.cache(), p.table.table, p.rows, prefix, extend, starts + 4, 0.125, out
    )
    assert bool((out[:4] == 7.0).all())
    _assert_near(out[4:], _extend_truth(p, wider[4:], prefix, starts, 0.125, 0, 0.0))


def test_extend_inputs_are_checked(kernel) -> None:
    p, q, prefix, extend, starts = _extend_case("kivi2", torch.float32, 9, 3, 64, [(3, 30)])
    with pytest.raises(KernelShapeError, match="must lie in q"):
        kernel.extend(q[:10], p.cache(), p.table.table, p.rows, prefix, extend, starts, 0.125)
    with pytest.raises(KernelShapeError, match="extend_lens must be >= 1"):
        kernel.extend(q, p.cache(), p.table.table, p.rows, prefix, extend * 0, starts, 0.125)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim", "dtype", "supported"),
    [
        (9, 3, 64, torch.float32, True),
        (32, 8, 128, torch.bfloat16, True),
        (9, 3, 64, torch.float16, False),
        (18, 2, 64, torch.float32, False),  # 9 query heads per KV head: the decode kernel's 8
    ],
)
def test_supports(heads, kv_heads, head_dim, dtype, supported) -> None:
    assert KiviAttention.supports(heads, kv_heads, head_dim, dtype) is supported
