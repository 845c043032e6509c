"""Attention over a quantized KV pool (int8, fp8_e4m3, fp8_e5m2): the torch and Triton
(interpreted on CPU) backends against float64 attention over the pool as
``KVPool.dequantized`` reads it, decode rows and extends on a cached prefix; every
query, a pass's own new tokens included, attends K/V as stored."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from radixlm.runtime.attention import (
    AttentionBackend,
    AttentionInputs,
    CpuAttentionOptions,
    TorchAttentionBackend,
    TritonAttentionBackend,
)
from radixlm.runtime.attention.base import BackendContext
from radixlm.runtime.attention.cpu_kernels import cpu_entry
from radixlm.runtime.mem_cache.kv_pool import KVPool, ReqToTokenTable
from radixlm.runtime.mem_cache.kv_quant import kv_format

H, HKV, D = 4, 2, 16
FORMATS = ["int8", "fp8_e4m3", "fp8_e5m2"]
BACKENDS = ["torch", "triton"]
# float32 attention over values float64 rounds to float32: a few ulp of the output scale
TOLERANCE = 2e-5


def _backend(name: str, pool: KVPool, table: ReqToTokenTable) -> AttentionBackend:
    if name == "torch":
        return TorchAttentionBackend(pool, table, D**-0.5)
    return TritonAttentionBackend(pool, table, D**-0.5)


@dataclass
class _Pass:
    """A pass of rows (cached prefix, new tokens) over a quantized pool."""

    pool: KVPool
    table: ReqToTokenTable
    inputs: AttentionInputs
    slots: list[torch.Tensor]  # per row: every position's slot, prefix then new tokens
    q: torch.Tensor  # (T, H, D)
    k: torch.Tensor  # (T, Hkv, D)
    v: torch.Tensor


def _pass(fmt: str, shape: list[tuple[int, int]], seed: int = 0) -> _Pass:
    """Rows of (cached, new) tokens; the cached K/V written through ``KVPool.write``."""
    gen = torch.Generator().manual_seed(seed)
    pool = KVPool(1, 96, HKV, D, torch.float32, fmt=kv_format(fmt, torch.float32))
    table = ReqToTokenTable(len(shape), 48)
    next_slot, rows, slots, new_slots = 1, [], [], []
    for cached, new in shape:
        row = table.allocate_row()
        assert row is not None
        row_slots = torch.arange(next_slot, next_slot + cached + new)
        next_slot += cached + new
        table.write(row, 0, row_slots)
        k, v = torch.randn(2, cached, HKV, D, generator=gen) * 3
        pool.write(0, row_slots[:cached], k, v)
        rows.append(row)
        slots.append(row_slots)
        new_slots.append(row_slots[cached:])
    inputs = AttentionInputs(
        rows=torch.tensor(rows),
        prefix_lens=torch.tensor([c for c, _ in shape]),
        extend_lens=torch.tensor([n for _, n in shape]),
        out_cache_loc=torch.cat(new_slots),
    )
    num_tokens = sum(n for _, n in shape)
    q = torch.randn(num_tokens, H, D, generator=gen)
    k, v = torch.randn(2, num_tokens, HKV, D, generator=gen) * 3
    return _Pass(pool, table, inputs, slots, q, k, v)


def _reference(p: _Pass) -> torch.Tensor:
    """float64 causal attention of each row's new tokens over the pool's dequantized
    K/V (read after the pass wrote its own): (T, H, D)."""
    out, start = [], 0
    for row_slots, cached, new in zip(
        p.slots, p.inputs.prefix_lens.tolist(), p.inputs.extend_lens.tolist()
    ):
        keys, values = (x.double() for x in p.pool.dequantized(0, row_slots))  # (S, Hkv, D)
        keys = keys.repeat_interleave(H // HKV, dim=1)
        values = values.repeat_interleave(H // HKV, dim=1)
        q = p.q[start : start + new].double()
        scores = torch.einsum("thd,shd->ths", q, keys) * D**-0.5
        positions = torch.arange(cached + new)
        allowed = positions[None, :] <= (cached + torch.arange(new))[:, None]  # (T, S)
        scores = scores.masked_fill(~allowed[:, None, :], float("-inf"))
        out.append(torch.einsum("ths,shd->thd", scores.softmax(-1), values))
        start += new
    return torch.cat(out)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    "shape",
    [[(7, 1), (3, 1), (12, 1)], [(9, 4), (0, 5), (5, 1)]],
    ids=["decode", "extend"],
)
def test_attention_over_a_quantized_pool_is_attention_over_its_values(
    backend: str, fmt: str, shape: list[tuple[int, int]]
) -> None:
    p = _pass(fmt, shape)
    attention = _backend(backend, p.pool, p.table)
    out = attention.forward(0, p.q, p.k, p.v, attention.prepare(p.inputs))
    assert p.pool.k.dtype == kv_format(fmt, torch.float32).code_dtype
    torch.testing.assert_close(out.double(), _reference(p), atol=TOLERANCE, rtol=0)
    # the new tokens were stored quantized: what KVPool.write stores of them
    stored = _pass(fmt, shape)
    stored.pool.write(0, stored.inputs.out_cache_loc, stored.k, stored.v)
    loc = p.inputs.out_cache_loc
    for a, b in zip(p.pool.dequantized(0, loc), stored.pool.dequantized(0, loc)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("fmt", FORMATS)
def test_staged_decode_reads_codes_and_commits_them(fmt: str) -> None:
    """The compiled-decode form: attends like the writing pass, stores on commit."""
    shape = [(6, 1), (2, 1), (6, 1)]
    p, q = _pass(fmt, shape), _pass(fmt, shape)
    staged_backend = TorchAttentionBackend(p.pool, p.table, D**-0.5)
    staged = staged_backend.prepare_staged_decode(p.inputs)
    assert staged.new_k.dtype == torch.float32  # staged in the model's dtype
    out = staged_backend.forward(0, p.q, p.k, p.v, staged)
    staged_backend.commit(staged)
    writing = TorchAttentionBackend(q.pool, q.table, D**-0.5)
    want = writing.forward(0, q.q, q.k, q.v, writing.prepare(q.inputs))
    torch.testing.assert_close(out, want, atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(out.double(), _reference(p), atol=TOLERANCE, rtol=0)
    used = torch.cat(p.slots)  # the pool is uninitialised elsewhere
    for a, b in zip(p.pool.dequantized(0, used), q.pool.dequantized(0, used)):
        assert torch.equal(a, b)


def test_triton_rotating_store_quantizes_int8_as_kv_pool_write() -> None:
    """The fused rotate-and-store launch writes the codes and scales ``KVPool.write``
    writes of the rotated k (and of v), bit for bit."""
    shape = [(4, 3), (0, 2)]
    p, ref = _pass("int8", shape), _pass("int8", shape)
    gen = torch.Generator().manual_seed(3)
    angles = torch.rand(p.q.shape[0], D // 2, generator=gen) * 30
    rope = (angles.cos(), angles.sin())
    attention = TritonAttentionBackend(p.pool, p.table, D**-0.5)
    q, k = p.q.clone(), p.k.clone()
    attention.forward_rotating(0, q, k, p.v, rope, attention.prepare(p.inputs))
    loc = p.inputs.out_cache_loc
    ref.pool.write(0, loc, k, p.v)  # k: rotated in place by the launch
    for ours, theirs in ((p.pool.k, ref.pool.k), (p.pool.v, ref.pool.v)):
        assert torch.equal(ours[0, loc], theirs[0, loc])
    for ours, theirs in ((p.pool.k_scale, ref.pool.k_scale), (p.pool.v_scale, ref.pool.v_scale)):
        assert torch.equal(ours[0, loc], theirs[0, loc])  # type: ignore[index]


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2"])
def test_triton_rotating_store_into_an_fp8_pool_casts_as_kv_pool_write(fmt: str) -> None:
    shape = [(4, 3)]
    p, ref = _pass(fmt, shape), _pass(fmt, shape)
    angles = torch.rand(p.q.shape[0], D // 2, generator=torch.Generator().manual_seed(4))
    rope = (angles.cos(), angles.sin())
    attention = TritonAttentionBackend(p.pool, p.table, D**-0.5)
    q, k = p.q.clone(), p.k.clone()
    attention.forward_rotating(0, q, k, p.v, rope, attention.prepare(p.inputs))
    loc = p.inputs.out_cache_loc
    ref.pool.write(0, loc, k, p.v)
    for ours, theirs in zip(p.pool.dequantized(0, loc), ref.pool.dequantized(0, loc)):
        assert torch.equal(ours, theirs)


def test_the_cpu_backend_takes_quantized_pools_as_float_ones() -> None:
    """The C++ kernels read codes and scales: the "cpu" backend is available over any
    pool (tests/kernels/cpu test what it computes there)."""
    entry = cpu_entry(CpuAttentionOptions("avx2"))
    table = ReqToTokenTable(1, 8)

    def context(pool: KVPool) -> BackendContext:
        return BackendContext(
            arch=None,  # type: ignore[arg-type]  # unread by the availability check
            dtype=torch.float32,
            device="cpu",
            kv_pool=pool,
            req_to_token=table,
        )

    assert entry.unavailable(context(_pass("int8", [(3, 1)]).pool)) is None
    assert entry.unavailable(context(KVPool(1, 8, HKV, D, torch.float32))) is None
