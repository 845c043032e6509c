"""TorchAttentionBackend against a per-request reference attention (decode rows)."""

from __future__ import annotations

import pytest
import torch

from radixlm.runtime.kv_pool import KVPool, ReqToTokenTable
from radixlm.runtime.layers.attention import AttentionInputs, TorchAttentionBackend

H, HKV, D = 4, 2, 8


def _reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """q: (H, D) one query; keys/values: (S, Hkv, D) -> (H, D)."""
    group = H // HKV
    k, v = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
    scores = torch.einsum("hd,shd->hs", q, k) * D**-0.5
    return torch.einsum("hs,shd->hd", scores.softmax(-1), v)


@pytest.mark.parametrize("seq_lens", [[7], [5, 5, 5], [3, 9, 6]])
def test_decode_rows_match_reference(seq_lens: list[int]) -> None:
    """Rows of one length attend without a mask; mixed lengths are padded and masked."""
    gen = torch.Generator().manual_seed(0)
    pool = KVPool(1, 64, HKV, D, torch.float32)
    table = ReqToTokenTable(len(seq_lens), 32)
    backend = TorchAttentionBackend(pool, table, D**-0.5)
    next_slot, rows, cached_kv = 1, [], []
    for n in seq_lens:  # the n-1 cached tokens of each request, then its new token's slot
        row = table.allocate_row()
        assert row is not None
        slots = torch.arange(next_slot, next_slot + n)
        next_slot += n
        table.write(row, 0, slots)
        k, v = torch.randn(2, n - 1, HKV, D, generator=gen)
        pool.write(0, slots[:-1], k, v)
        rows.append(row)
        cached_kv.append((k, v, slots[-1:]))
    inputs = AttentionInputs(
        rows=torch.tensor(rows),
        prefix_lens=torch.tensor(seq_lens) - 1,
        extend_lens=torch.ones(len(seq_lens), dtype=torch.int64),
        out_cache_loc=torch.cat([slot for _, _, slot in cached_kv]),
    )
    q = torch.randn(len(seq_lens), H, D, generator=gen)
    k_new, v_new = torch.randn(2, len(seq_lens), HKV, D, generator=gen)
    metadata = backend.prepare(inputs)
    (group,) = metadata.groups
    assert (group.mask is None) == (len(set(seq_lens)) == 1)
    out = backend.forward(0, q, k_new, v_new, metadata)
    for i, (k, v, _) in enumerate(cached_kv):
        keys, values = torch.cat((k, k_new[i : i + 1])), torch.cat((v, v_new[i : i + 1]))
        torch.testing.assert_close(out[i], _reference(q[i], keys, values))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_fresh_prefill_is_causal_in_the_pool_dtype(dtype: torch.dtype) -> None:
    """Reduced precision attends in float32 on CPU and rounds once to the pool dtype."""
    gen = torch.Generator().manual_seed(1)
    num_tokens = 11
    pool = KVPool(1, 32, HKV, D, dtype)
    table = ReqToTokenTable(1, 32)
    backend = TorchAttentionBackend(pool, table, D**-0.5)
    row = table.allocate_row()
    assert row is not None
    slots = torch.arange(1, num_tokens + 1)
    table.write(row, 0, slots)
    inputs = AttentionInputs(
        rows=torch.tensor([row]),
        prefix_lens=torch.tensor([0]),
        extend_lens=torch.tensor([num_tokens]),
        out_cache_loc=slots,
    )
    q = torch.randn(num_tokens, H, D, generator=gen).to(dtype)
    k, v = torch.randn(2, num_tokens, HKV, D, generator=gen).to(dtype)
    out = backend.forward(0, q, k, v, backend.prepare(inputs))
    assert out.dtype == dtype
    for t in range(num_tokens):
        expected = _reference(q[t].double(), k[: t + 1].double(), v[: t + 1].double())
        torch.testing.assert_close(out[t], expected.to(dtype))
    torch.testing.assert_close(pool.k[0, slots], k, rtol=0, atol=0)  # stored as given
