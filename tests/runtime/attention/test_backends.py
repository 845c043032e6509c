"""The attention backends (torch; cpu, with the C++ kernels; triton, through Triton's
interpreter on CPU) against a per-request reference attention."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import pytest
import torch

from radixlm.kernels.cpu.extend_attention import load_extend_attention
from radixlm.kernels.paged_attention import MIN_SPLIT_LEN
from radixlm.runtime.attention import (
    AttentionBackend,
    AttentionInputs,
    CpuAttentionBackend,
    TorchAttentionBackend,
    TritonAttentionBackend,
)
from radixlm.runtime.attention.cpu_kernels import _DecodeRows
from radixlm.runtime.attention.triton import KVSplits
from radixlm.runtime.mem_cache.kv_pool import KVPool, ReqToTokenTable
from radixlm.runtime.model_store import cache_root
from radixlm.runtime.models.rope import apply_rope
from tests import numerics as num

H, HKV, D = 4, 2, 16
BACKENDS = ["torch", "cpu", "triton"]


def _backend(name: str, pool: KVPool, table: ReqToTokenTable) -> AttentionBackend:
    if name == "torch":
        return TorchAttentionBackend(pool, table, D**-0.5)
    if name == "triton":
        return TritonAttentionBackend(pool, table, D**-0.5)
    return CpuAttentionBackend.load(pool, table, D**-0.5, cache_root() / "kernels")


@functools.cache
def _extend_dot_products() -> bool:
    """Whether the cpu backend's extend kernel (the native build) rounds a bfloat16
    pass's softmax weights to bfloat16 for AVX512-BF16 dot products."""
    return load_extend_attention(cache_root() / "kernels").bf16_dot_products


def _reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """q: (H, D) one query; keys/values: (S, Hkv, D) -> (H, D)."""
    group = H // HKV
    k, v = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
    scores = torch.einsum("hd,shd->hs", q, k) * D**-0.5
    return torch.einsum("hs,shd->hd", scores.softmax(-1), v)


def _exact(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    weights_rounded_to: torch.dtype | None = None,
) -> num.Bounded:
    """``_reference``'s computation under tests.numerics: (H, D)."""
    k, v = (num.exact(t).map(lambda x: x.transpose(0, 1)) for t in (keys, values))
    q1 = num.exact(q[:, None])
    return num.attention(q1, k, v, D**-0.5, None, weights_rounded_to).map(lambda x: x[:, 0])


@dataclass
class _DecodePass:
    """Decode rows over a pool holding each row's cached prefix (every layer)."""

    pool: KVPool
    backend: AttentionBackend
    inputs: AttentionInputs
    cached: list[tuple[torch.Tensor, torch.Tensor]]  # per row: (L, n-1, Hkv, D) k and v
    q: torch.Tensor  # (B, H, D)
    k_new: torch.Tensor  # (B, Hkv, D)
    v_new: torch.Tensor


def _decode_pass(seq_lens: list[int], num_layers: int = 1, backend: str = "torch") -> _DecodePass:
    gen = torch.Generator().manual_seed(0)
    pool = KVPool(num_layers, 64, HKV, D, torch.float32)
    pool.k.zero_()  # the pool starts uninitialised: NaN garbage would defeat torch.equal
    pool.v.zero_()
    table = ReqToTokenTable(len(seq_lens), 32)
    next_slot, rows, cached, new_slots = 1, [], [], []
    for n in seq_lens:  # the n-1 cached tokens of each request, then its new token's slot
        row = table.allocate_row()
        assert row is not None
        slots = torch.arange(next_slot, next_slot + n)
        next_slot += n
        table.write(row, 0, slots)
        k, v = torch.randn(2, num_layers, n - 1, HKV, D, generator=gen)
        for layer in range(num_layers):
            pool.write(layer, slots[:-1], k[layer], v[layer])
        rows.append(row)
        cached.append((k, v))
        new_slots.append(slots[-1:])
    inputs = AttentionInputs(
        rows=torch.tensor(rows),
        prefix_lens=torch.tensor(seq_lens) - 1,
        extend_lens=torch.ones(len(seq_lens), dtype=torch.int64),
        out_cache_loc=torch.cat(new_slots),
    )
    q = torch.randn(len(seq_lens), H, D, generator=gen)
    k_new, v_new = torch.randn(2, len(seq_lens), HKV, D, generator=gen)
    return _DecodePass(pool, _backend(backend, pool, table), inputs, cached, q, k_new, v_new)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seq_lens", [[7], [1], [5, 5, 5], [3, 9, 6]])
def test_decode_rows_match_reference(seq_lens: list[int], backend: str) -> None:
    """torch: rows of one length attend without a mask; mixed lengths are padded and
    masked. cpu and triton: one kernel call for every row, whatever the lengths."""
    p = _decode_pass(seq_lens, backend=backend)
    metadata = p.backend.prepare(p.inputs)
    if backend == "torch":
        (group,) = metadata.groups
        assert (group.mask is None) == (len(set(seq_lens)) == 1)
    out = p.backend.forward(0, p.q, p.k_new, p.v_new, metadata)
    for i, (k, v) in enumerate(p.cached):
        keys, values = torch.cat((k[0], p.k_new[i : i + 1])), torch.cat((v[0], p.v_new[i : i + 1]))
        bound = num.between_two(_exact(p.q[i], keys, values))
        num.assert_within(out[i], _reference(p.q[i], keys, values), bound, f"row {i}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seq_lens", [[7], [2], [5, 5, 5], [3, 9, 6]])
def test_staged_decode_reads_the_pool_and_commits_after(seq_lens: list[int], backend: str) -> None:
    """The staged form attends exactly like the writing one, leaves the pool alone
    until ``commit``, and then stores the new K/V of every layer in their slots."""
    layers = 2
    p = _decode_pass(seq_lens, num_layers=layers, backend=backend)
    metadata = p.backend.prepare_staged_decode(p.inputs)
    before_k, before_v = p.pool.k.clone(), p.pool.v.clone()
    for layer in range(layers):  # every layer sees different new K/V
        k_new, v_new = p.k_new + layer, p.v_new - layer
        out = p.backend.forward(layer, p.q, k_new, v_new, metadata)
        for i, (k, v) in enumerate(p.cached):
            keys = torch.cat((k[layer], k_new[i : i + 1]))
            values = torch.cat((v[layer], v_new[i : i + 1]))
            bound = num.between_two(_exact(p.q[i], keys, values))
            num.assert_within(out[i], _reference(p.q[i], keys, values), bound, f"row {i}")
    assert torch.equal(p.pool.k, before_k) and torch.equal(p.pool.v, before_v)
    p.backend.commit(metadata)
    slots = p.inputs.out_cache_loc
    for layer in range(layers):
        assert torch.equal(p.pool.k[layer, slots], p.k_new + layer)
        assert torch.equal(p.pool.v[layer, slots], p.v_new - layer)
    written = torch.zeros(p.pool.k.shape[1], dtype=torch.bool)
    written[slots] = True
    assert torch.equal(p.pool.k[:, ~written], before_k[:, ~written])  # nothing else touched


@pytest.mark.parametrize("backend", BACKENDS)
def test_staged_decode_takes_decode_rows_only(backend: str) -> None:
    p = _decode_pass([4], backend=backend)
    extend = AttentionInputs(
        rows=p.inputs.rows,
        prefix_lens=torch.tensor([2]),
        extend_lens=torch.tensor([2]),
        out_cache_loc=torch.tensor([3, 4]),
    )
    with pytest.raises(ValueError, match="decode rows only"):
        p.backend.prepare_staged_decode(extend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_commit_of_writing_metadata_is_a_no_op(backend: str) -> None:
    p = _decode_pass([4, 6], backend=backend)
    metadata = p.backend.prepare(p.inputs)
    p.backend.forward(0, p.q, p.k_new, p.v_new, metadata)
    after_forward = p.pool.k.clone()
    p.backend.commit(metadata)
    assert torch.equal(p.pool.k, after_forward)


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
        exact = _exact(q[t], k[: t + 1], v[: t + 1])
        num.assert_within(out[t], exact.value.to(dtype), num.from_exact(exact, dtype), f"token {t}")
    assert torch.equal(pool.k[0, slots], k)  # stored as given


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mixed_pass_same_on_both_backends(dtype: torch.dtype) -> None:
    """One pass of a fresh prefill, decode rows, and an extend on a cached prefix,
    in interleaved order: the cpu backend's kernel serves the decode rows and
    scatters them back; every token matches the torch backend and the reference."""
    shape = [(0, 5), (6, 1), (4, 3), (0, 1), (9, 1), (2, 1)]  # (cached, new), pass order
    gen = torch.Generator().manual_seed(3)
    cached_k = [torch.randn(c, HKV, D, generator=gen).to(dtype) for c, _ in shape]
    cached_v = [torch.randn(c, HKV, D, generator=gen).to(dtype) for c, _ in shape]
    num_tokens = sum(new for _, new in shape)
    q = torch.randn(num_tokens, H, D, generator=gen).to(dtype)
    k, v = torch.randn(2, num_tokens, HKV, D, generator=gen).to(dtype)
    outs = {}
    for name in BACKENDS:
        pool = KVPool(1, 64, HKV, D, dtype)
        table = ReqToTokenTable(len(shape), 32)
        next_slot, rows, new_slots = 1, [], []
        for i, (cached, new) in enumerate(shape):
            row = table.allocate_row()
            assert row is not None
            slots = torch.arange(next_slot, next_slot + cached + new)
            next_slot += cached + new
            table.write(row, 0, slots)
            pool.write(0, slots[:cached], cached_k[i], cached_v[i])
            rows.append(row)
            new_slots.append(slots[cached:])
        inputs = AttentionInputs(
            rows=torch.tensor(rows),
            prefix_lens=torch.tensor([c for c, _ in shape]),
            extend_lens=torch.tensor([n for _, n in shape]),
            out_cache_loc=torch.cat(new_slots),
        )
        backend = _backend(name, pool, table)
        metadata = backend.prepare(inputs)
        groups = getattr(metadata, "groups", ())  # triton: one launch for the pass
        kernel_rows = [g.rows.tolist() for g in groups if isinstance(g, _DecodeRows)]
        assert kernel_rows == ([[1, 3, 4, 5]] if name == "cpu" else [])
        outs[name] = backend.forward(0, q, k, v, metadata)
    t = 0
    for i, (cached, new) in enumerate(shape):
        for j in range(new):  # token j of request i sees its prefix and new tokens 0..j
            seen_k = torch.cat((cached_k[i], k[t - j : t + 1]))
            seen_v = torch.cat((cached_v[i], v[t - j : t + 1]))
            for name in BACKENDS:
                # float32 arithmetic rounded once to dtype (fresh prefills, the C++
                # kernel's decode rows, every Triton row), or SDPA in the pool dtype;
                # the C++ extend kernel's bfloat16 dot products round the weights too
                dots = name == "cpu" and new > 1 and _extend_dot_products()
                in_float32 = not dots and (
                    cached == 0 or (name == "cpu" and new == 1) or name == "triton"
                )
                rounded = None if in_float32 or dtype == torch.float32 else dtype
                exact = _exact(q[t], seen_k, seen_v, rounded)
                want, bound = exact.value.to(dtype), num.from_exact(exact, dtype)
                num.assert_within(outs[name][t], want, bound, f"{name}, token {t}")
            t += 1


def _mixed_triton_pass(shape: list[tuple[int, int]], gen: torch.Generator):
    """A Triton backend over a fresh pool holding each request's cached prefix, and
    the pass's inputs: requests of (cached, new) tokens, in pass order."""
    pool = KVPool(1, 64, HKV, D, torch.float32)
    pool.k.zero_()  # the pool starts uninitialised: garbage would defeat torch.equal
    pool.v.zero_()
    table = ReqToTokenTable(len(shape), 32)
    next_slot, rows, new_slots = 1, [], []
    for cached, new in shape:
        row = table.allocate_row()
        assert row is not None
        slots = torch.arange(next_slot, next_slot + cached + new)
        next_slot += cached + new
        table.write(row, 0, slots)
        pool.write(0, slots[:cached], *torch.randn(2, cached, HKV, D, generator=gen))
        rows.append(row)
        new_slots.append(slots[cached:])
    inputs = AttentionInputs(
        rows=torch.tensor(rows),
        prefix_lens=torch.tensor([c for c, _ in shape]),
        extend_lens=torch.tensor([n for _, n in shape]),
        out_cache_loc=torch.cat(new_slots),
    )
    return TritonAttentionBackend(pool, table, D**-0.5), inputs


@pytest.mark.parametrize(
    "shape", [[(6, 1), (0, 1), (9, 1)], [(0, 5), (6, 1), (4, 3)]], ids=["decode", "mixed"]
)
def test_triton_rotates_q_and_k_as_it_stores_them(shape: list[tuple[int, int]]) -> None:
    """``forward_rotating`` leaves q and k rotated in place (the model's rotation, to
    rounding) and attends exactly as ``forward`` does on those rotated q and k."""
    num_tokens = sum(new for _, new in shape)
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(num_tokens, H, D, generator=gen)
    k, v = torch.randn(2, num_tokens, HKV, D, generator=gen)
    angles = torch.rand(num_tokens, D // 2, generator=gen) * 30
    cos, sin = angles.cos(), angles.sin()
    fused, inputs = _mixed_triton_pass(shape, torch.Generator().manual_seed(6))
    plain, _ = _mixed_triton_pass(shape, torch.Generator().manual_seed(6))
    assert fused.fuses_rope and not TorchAttentionBackend.fuses_rope
    rq, rk = q.clone(), k.clone()
    out = fused.forward_rotating(0, rq, rk, v, (cos, sin), fused.prepare(inputs))
    for got, x in ((rq, q), (rk, k)):
        bound = num.between_two(num.rope(num.exact(x), cos[:, None], sin[:, None]))
        num.assert_within(got, apply_rope(x, cos, sin), bound)
    assert torch.equal(out, plain.forward(0, rq, rk, v, plain.prepare(inputs)))
    assert torch.equal(fused.kv_pool.k, plain.kv_pool.k)
    assert torch.equal(fused.kv_pool.v, plain.kv_pool.v)


def test_triton_decode_splits_follow_the_batch_size() -> None:
    """On a GPU the split count is the rule's for the pass's batch size over the
    longest context a row may have (so a captured graph's count is right for every
    replay); on a CPU (the interpreter) and when given, a fixed count, no floor."""
    gpu = KVSplits(num_kv_heads=8, max_context=131_072, num_sms=132)
    assert gpu.choose(1) == (33, MIN_SPLIT_LEN)
    assert gpu.choose(64) == (1, MIN_SPLIT_LEN)
    assert KVSplits(8, 131_072, 132, fixed=4).choose(1) == (4, 1)
    p = _decode_pass([3, 9, 6], backend="triton")
    assert p.backend.kv_splits == KVSplits(HKV, 32, 1, fixed=2)
    assert p.backend.prepare(p.inputs).splits == (2, 1)
