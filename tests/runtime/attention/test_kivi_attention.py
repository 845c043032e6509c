"""Attention over a KIVI pool (kivi4, kivi2): every backend against float64 attention
over the pool as ``kivi.gather`` reads it after the pass wrote its own tokens (codes
below each sequence's last whole group, its float window past it), decode rows and
prefills, fresh or on a cached prefix, with groups completed by the pass."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from radixlm.runtime.attention import (
    AttentionBackend,
    AttentionInputs,
    CpuAttentionBackend,
    TorchAttentionBackend,
)
from radixlm.runtime.mem_cache import kivi
from radixlm.runtime.mem_cache.kivi import KiviWrites
from radixlm.runtime.mem_cache.kv_pool import KVPool, ReqToTokenTable
from radixlm.runtime.mem_cache.kv_quant import kv_format
from radixlm.runtime.model_store import cache_root

H, HKV, D = 4, 2, 64
G = kivi.KIVI_GROUP
FORMATS = ["kivi4", "kivi2"]
# cpu: both KIVI kernels; cpu-sdpa-prefill: the decode kernel, prefill rows through
# the torch backend's groups (the extend kernel off)
BACKENDS = ["torch", "cpu", "cpu-sdpa-prefill"]
TOLERANCE = 2e-5  # float32 attention over float32 values, against float64
SHAPES = {
    # (cached, new) per row: groups completed by a decode token (31 -> 32, 63 -> 64),
    # decode rows inside a group and past several
    "decode": [(31, 1), (5, 1), (63, 1), (40, 1), (96, 1)],
    # fresh prompts with and without whole groups, extends completing groups from the
    # window and the pass together, one ending exactly on a group
    "extend": [(0, 45), (32, 7), (20, 50), (0, 9), (33, 31)],
    "mixed": [(31, 1), (0, 70), (50, 1), (10, 22)],
}


def _backend(name: str, pool: KVPool, table: ReqToTokenTable) -> AttentionBackend:
    if name == "torch":
        return TorchAttentionBackend(pool, table, D**-0.5)
    if name.startswith("cpu"):
        extend = name == "cpu"
        return CpuAttentionBackend.load(
            pool, table, D**-0.5, cache_root() / "kernels", extend=extend
        )
    raise AssertionError(name)


@dataclass
class _Pass:
    pool: KVPool
    table: ReqToTokenTable
    inputs: AttentionInputs
    q: torch.Tensor  # (T, H, D)
    k: torch.Tensor  # (T, Hkv, D)
    v: torch.Tensor


def _pass(fmt: str, shape: list[tuple[int, int]], dtype: torch.dtype, seed: int = 0) -> _Pass:
    """Rows of (cached, new) tokens, the cached ones written by earlier passes of
    uneven sizes (their groups quantized, the rest in the windows)."""
    gen = torch.Generator().manual_seed(seed)
    total = sum(c + n for c, n in shape)
    pool = KVPool(1, total + 8, HKV, D, dtype, fmt=kv_format(fmt, dtype), rows=len(shape) + 1)
    table = ReqToTokenTable(len(shape) + 1, 256)
    table.allocate_row()  # row 0 unused: rows need not start at 0
    next_slot, rows, new_slots = 3, [], []
    for cached, new in shape:
        row = table.allocate_row()
        assert row is not None
        slots = torch.arange(next_slot, next_slot + cached + new).flip(0)  # any order
        next_slot += cached + new
        table.write(row, 0, slots)
        done = 0
        while done < cached:  # the prefix in passes of 13 tokens
            n = min(13, cached - done)
            k, v = (torch.randn(2, n, HKV, D, generator=gen) * 3 + 1).to(dtype)
            writes = KiviWrites.plan(table.table, [row], [done], [n], G, torch.device("cpu"))
            writes.store(pool, 0, k, v)
            done += n
        rows.append(row)
        new_slots.append(slots[cached:])
    inputs = AttentionInputs(
        rows=torch.tensor(rows),
        prefix_lens=torch.tensor([c for c, _ in shape]),
        extend_lens=torch.tensor([n for _, n in shape]),
        out_cache_loc=torch.cat(new_slots),
    )
    num_tokens = sum(n for _, n in shape)
    q = torch.randn(num_tokens, H, D, generator=gen).to(dtype)
    k, v = (torch.randn(2, num_tokens, HKV, D, generator=gen) * 3 + 1).to(dtype)
    return _Pass(pool, table, inputs, q, k, v)


def _reference(
    p: _Pass, dtype: torch.dtype | None = None, decode_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """float64 causal attention of each row's new tokens over the pool as stored, K/V
    as ``kivi.gather`` reads them in ``dtype`` (the model's by default; decode rows'
    in ``decode_dtype``, by default ``dtype``)."""
    out, start = [], 0
    for row, cached, new in zip(
        p.inputs.rows.tolist(), p.inputs.prefix_lens.tolist(), p.inputs.extend_lens.tolist()
    ):
        n = cached + new
        slots = p.table.table[row, :n][None]
        keys, values = kivi.gather(
            p.pool,
            0,
            slots,
            torch.tensor([row]),
            torch.tensor([n]),
            (decode_dtype or dtype) if new == 1 else dtype,
        )
        keys = keys[0].double().repeat_interleave(H // HKV, dim=1)
        values = values[0].double().repeat_interleave(H // HKV, dim=1)
        q = p.q[start : start + new].double()
        scores = torch.einsum("thd,shd->ths", q, keys) * D**-0.5
        allowed = torch.arange(n)[None, :] <= (cached + torch.arange(new))[:, None]
        scores = scores.masked_fill(~allowed[:, None, :], float("-inf"))
        out.append(torch.einsum("ths,shd->thd", scores.softmax(-1), values))
        start += new
    return torch.cat(out)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_attention_over_a_kivi_pool_is_attention_over_its_values(
    backend: str, fmt: str, shape: list[tuple[int, int]]
) -> None:
    p = _pass(fmt, shape, torch.float32)
    attention = _backend(backend, p.pool, p.table)
    out = attention.forward(0, p.q, p.k, p.v, attention.prepare(p.inputs))
    torch.testing.assert_close(out.double(), _reference(p), atol=TOLERANCE, rtol=0)
    # the pass stored what one writer of the same tokens stores
    ref = _pass(fmt, shape, torch.float32)
    kivi_writes = KiviWrites.plan(
        ref.table.table,
        ref.inputs.rows.tolist(),
        ref.inputs.prefix_lens.tolist(),
        ref.inputs.extend_lens.tolist(),
        G,
        torch.device("cpu"),
    )
    kivi_writes.store(ref.pool, 0, ref.k, ref.v)
    used = p.inputs.out_cache_loc
    stored = kivi_writes.group_slots.flatten()
    for ours, theirs in (
        (p.pool.k, ref.pool.k),
        (p.pool.v, ref.pool.v),
        (p.pool.meta, ref.pool.meta),
    ):
        assert torch.equal(ours[0, stored], theirs[0, stored])
    assert torch.equal(p.pool.window_k, ref.pool.window_k)
    assert torch.equal(p.pool.window_v, ref.pool.window_v)
    assert used.numel() == p.q.shape[0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_bfloat16_model_over_a_kivi_pool(backend: str) -> None:
    """A bfloat16 model's pool: windows in bfloat16, values rounded once to it."""
    p = _pass("kivi4", SHAPES["mixed"], torch.bfloat16, seed=2)
    attention = _backend(backend, p.pool, p.table)
    out = attention.forward(0, p.q, p.k, p.v, attention.prepare(p.inputs))
    assert out.dtype == torch.bfloat16
    # the C++ kernels dequantize in float32 and never round K/V to bfloat16 (without the
    # extend kernel, prefill rows attend through the torch backend's groups, which do)
    in_kernel = {"cpu": (torch.float32, None), "cpu-sdpa-prefill": (None, torch.float32)}
    dtype, decode_dtype = in_kernel.get(backend, (None, None))
    want = _reference(p, dtype, decode_dtype)
    torch.testing.assert_close(out.double(), want, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_no_staged_decode_over_a_kivi_pool(backend: str) -> None:
    p = _pass("kivi4", SHAPES["decode"], torch.float32)
    attention = _backend(backend, p.pool, p.table)
    with pytest.raises(ValueError, match="KIVI"):
        attention.prepare_staged_decode(p.inputs)
