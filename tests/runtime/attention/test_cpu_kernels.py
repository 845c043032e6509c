"""The "cpu" attention backend over a quantized KV pool (int8 / fp8 codes with a
bfloat16 scale per slot and KV head): its kernels read the codes and scales, and
the new tokens' K/V reach the pool quantized, staged or not."""

from __future__ import annotations

import pytest
import torch

from radixlm.runtime.attention import AttentionInputs, CpuAttentionBackend
from radixlm.runtime.mem_cache.kv_pool import KVPool, ReqToTokenTable
from radixlm.runtime.mem_cache.kv_quant import kv_format, quantize
from radixlm.runtime.model_store import cache_root
from tests.kernels.cpu import quantized_kv as qkv_cache

H, HKV, D = 6, 2, 32
FORMATS = ["int8", "fp8_e4m3", "fp8_e5m2"]


def _pass(name: str, dtype: torch.dtype, requests: list[tuple[int, int]], staged: bool = False):
    """A quantized pool holding each request's cached tokens, the backend over it,
    the pass's inputs and its q/k/v. requests: (cached, new) per request."""
    gen = torch.Generator().manual_seed(0)
    total = sum(c + n for c, n in requests)
    pool = KVPool(1, total + 1, HKV, D, dtype, fmt=kv_format(name, dtype))
    table = ReqToTokenTable(len(requests), max(c + n for c, n in requests))
    next_slot, rows, new_slots = 1, [], []
    for cached, new in requests:
        row = table.allocate_row()
        slots = torch.arange(next_slot, next_slot + cached + new)
        next_slot += cached + new
        table.write(row, 0, slots)
        k, v = torch.randn(2, cached, HKV, D, generator=gen).to(dtype)
        pool.write(0, slots[:cached], k, v)
        rows.append(row)
        new_slots.append(slots[cached:])
    inputs = AttentionInputs(
        rows=torch.tensor(rows),
        prefix_lens=torch.tensor([c for c, _ in requests]),
        extend_lens=torch.tensor([n for _, n in requests]),
        out_cache_loc=torch.cat(new_slots),
    )
    backend = CpuAttentionBackend.load(pool, table, D**-0.5, cache_root() / "kernels")
    tokens = sum(n for _, n in requests)
    q, k, v = (torch.randn(tokens, h, D, generator=gen).to(dtype) for h in (H, HKV, HKV))
    return pool, table, backend, inputs, q, k, v


def _caches(pool: KVPool) -> tuple[torch.Tensor, ...]:
    return pool.k[0], pool.v[0], pool.k_scale[0], pool.v_scale[0]  # type: ignore[index]


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mixed_pass_reads_and_writes_the_quantized_pool(name: str, dtype: torch.dtype) -> None:
    """Decode rows (the decode kernel) and prompts on cached prefixes (the extend
    kernel) in one pass: the new K/V land in the pool as ``kv_quant.quantize``
    makes them, and each row's output is within float32 rounding of float64
    attention over the dequantized pool (a decode row's own new token as stored)."""
    requests = [(40, 1), (0, 9), (300, 1), (25, 30)]
    pool, table, backend, inputs, q, k, v = _pass(name, dtype, requests)
    out = backend.forward(0, q, k, v, backend.prepare(inputs))
    fmt = pool.format
    for codes, scales, x in ((pool.k, pool.k_scale, k), (pool.v, pool.v_scale, v)):
        want_codes, want_scales = quantize(x, fmt)
        got = codes.view(torch.uint8)[0, inputs.out_cache_loc]
        assert torch.equal(got, want_codes.view(torch.uint8))
        assert torch.equal(scales[0, inputs.out_cache_loc], want_scales)  # type: ignore[index]
    starts = torch.cumsum(inputs.extend_lens, 0) - inputs.extend_lens
    for b, (_, new) in enumerate(requests):
        rows = slice(int(starts[b]), int(starts[b]) + new)
        if new == 1:
            stored_k, stored_v = pool.dequantized(0, inputs.out_cache_loc[rows])
            truth = qkv_cache.decode_truth(
                q[rows], _caches(pool), table.table, inputs.rows[b : b + 1],
                inputs.prefix_lens[b : b + 1], stored_k, stored_v, D**-0.5,
            )  # fmt: skip
        else:
            truth = qkv_cache.extend_truth(
                q[rows], _caches(pool), table.table, inputs.rows[b : b + 1],
                inputs.prefix_lens[b : b + 1], inputs.extend_lens[b : b + 1],
                torch.zeros(1, dtype=torch.int64), D**-0.5,
            )  # fmt: skip
        qkv_cache.assert_near_truth(out[rows], truth)


@pytest.mark.parametrize("name", FORMATS)
def test_staged_decode_commits_quantized_kv(name: str) -> None:
    """A staged pass of decode rows leaves the pool alone until ``commit``, which
    stores the new K/V quantized; its output is the writing pass's, bit for bit."""
    requests = [(17, 1), (200, 1), (0, 1)]
    pool, _, backend, inputs, q, k, v = _pass(name, torch.bfloat16, requests)
    before = [t.clone() for t in (pool.k.view(torch.uint8), pool.k_scale)]
    staged = backend.prepare_staged_decode(inputs)
    out = backend.forward(0, q, k, v, staged)
    assert torch.equal(pool.k.view(torch.uint8), before[0])
    assert torch.equal(pool.k_scale, before[1])
    backend.commit(staged)
    want_codes, want_scales = quantize(k, pool.format)
    got = pool.k.view(torch.uint8)[0, inputs.out_cache_loc]
    assert torch.equal(got, want_codes.view(torch.uint8))
    assert torch.equal(pool.k_scale[0, inputs.out_cache_loc], want_scales)  # type: ignore[index]
    writing = backend.forward(0, q, k, v, backend.prepare(inputs))
    assert torch.equal(out, writing)


def test_compiled_staged_decode_over_a_quantized_pool() -> None:
    """A staged decode layer compiled as the compiled decode step compiles the model
    (inductor's C++ wrapper, dynamic shapes) calls ``radixlm::decode_attention_codes``
    with its scales, and gives the eager result bit for bit."""
    pool, _, backend, inputs, q, k, v = _pass("int8", torch.float32, [(17, 1), (40, 1)])
    staged = backend.prepare_staged_decode(inputs)

    def layer(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return staged.attend(backend, 0, q, k, v)

    eager = layer(q, k, v)
    compiled = torch.compile(layer, dynamic=True, fullgraph=True, options={"cpp_wrapper": True})
    assert torch.equal(compiled(q, k, v), eager)
