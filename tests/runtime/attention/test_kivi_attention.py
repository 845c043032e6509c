"""Attention over a KIVI pool (kivi4, kivi2): every backend against float64 attention
over the pool as ``kivi.gather`` reads it after the pass wrote its own tokens (codes
below each sequence's last whole group, its float window past it), decode rows and
prefills, fresh or on a cached prefix, with groups completed by the pass. The Triton
backend runs under its interpreter on CPU (tests/conftest.py sets TRITON_INTERPRET)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from radixlm.kernels.rope_kv import rotate_in_place
from radixlm.runtime.attention import (
    AttentionBackend,
    AttentionInputs,
    CpuAttentionBackend,
    TorchAttentionBackend,
    TritonAttentionBackend,
)
from radixlm.runtime.attention.base import PLAIN_SCORING, AttentionScoring
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
BACKENDS = ["torch", "triton", "cpu", "cpu-sdpa-prefill"]
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


def _backend(
    name: str, pool: KVPool, table: ReqToTokenTable, scoring: AttentionScoring = PLAIN_SCORING
) -> AttentionBackend:
    if name == "torch":
        return TorchAttentionBackend(pool, table, D**-0.5, scoring)
    if name == "triton":
        pytest.importorskip("triton")
        return TritonAttentionBackend(pool, table, D**-0.5, scoring=scoring)
    if name.startswith("cpu"):
        return CpuAttentionBackend.load(
            pool, table, D**-0.5, cache_root() / "kernels", extend=name == "cpu", scoring=scoring
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
    p: _Pass,
    scoring: AttentionScoring = PLAIN_SCORING,
    dtype: torch.dtype | None = None,
    decode_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """float64 causal attention of each row's new tokens over the pool as stored (layer
    0's window and the soft-cap of ``scoring``), K/V as ``kivi.gather`` reads them in
    ``dtype`` (the model's by default; decode rows' in ``decode_dtype``, by default
    ``dtype``)."""
    window, softcap = scoring.kernel_args(0)
    out, start = [], 0
    for row, cached, new in zip(
        p.inputs.rows.tolist(), p.inputs.prefix_lens.tolist(), p.inputs.extend_lens.tolist()
    ):
        n = cached + new
        slots = p.table.table[row, :n][None]
        as_dtype = (decode_dtype or dtype) if new == 1 else dtype
        rows, lens = torch.tensor([row]), torch.tensor([n])
        keys, values = kivi.gather(p.pool, 0, slots, rows, lens, as_dtype)
        keys = keys[0].double().repeat_interleave(H // HKV, dim=1)
        values = values[0].double().repeat_interleave(H // HKV, dim=1)
        q = p.q[start : start + new].double()
        scores = torch.einsum("thd,shd->ths", q, keys) * D**-0.5
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        k_pos, q_pos = torch.arange(n)[None, :], (cached + torch.arange(new))[:, None]
        allowed = (k_pos <= q_pos) & ((k_pos > q_pos - window) if window else True)
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
    want = _reference(p, PLAIN_SCORING, dtype, decode_dtype)
    torch.testing.assert_close(out.double(), want, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [SHAPES["decode"], SHAPES["mixed"]], ids=["decode", "mixed"])
def test_windowed_capped_layer_over_a_kivi_pool(backend: str, shape) -> None:
    scoring = AttentionScoring(windows=(20,), softcap=2.0)
    p = _pass("kivi2", shape, torch.float32, seed=3)
    attention = _backend(backend, p.pool, p.table, scoring)
    out = attention.forward(0, p.q, p.k, p.v, attention.prepare(p.inputs))
    torch.testing.assert_close(out.double(), _reference(p, scoring), atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_staged_decode_over_a_kivi_pool(backend: str) -> None:
    p = _pass("kivi4", SHAPES["decode"], torch.float32)
    attention = _backend(backend, p.pool, p.table)
    assert not attention.graph_capturable  # no CUDA graph captures its passes
    with pytest.raises(ValueError, match="KIVI"):
        attention.prepare_staged_decode(p.inputs)


def test_triton_over_a_kivi_pool_leaves_the_rotation_to_the_model() -> None:
    """No fused rotate-and-store over a KIVI pool (its writes are torch ops): the model
    rotates; a caller's forward_rotating still rotates, then stores and attends."""
    pytest.importorskip("triton")
    p, ref = (
        _pass("kivi4", SHAPES["mixed"], torch.float32),
        _pass("kivi4", SHAPES["mixed"], torch.float32),
    )
    attention = TritonAttentionBackend(p.pool, p.table, D**-0.5)
    assert not attention.fuses_rope and TritonAttentionBackend.fuses_rope
    angles = torch.rand(p.q.shape[0], D // 2, generator=torch.Generator().manual_seed(5)) * 9
    rope = (angles.cos(), angles.sin())
    out = attention.forward_rotating(0, p.q, p.k, p.v, rope, attention.prepare(p.inputs))
    rotate_in_place(ref.q, ref.k, *rope)
    plain = TritonAttentionBackend(ref.pool, ref.table, D**-0.5)
    assert torch.equal(out, plain.forward(0, ref.q, ref.k, ref.v, plain.prepare(ref.inputs)))
    assert torch.equal(p.pool.window_k, ref.pool.window_k)
