"""The Triton paged-attention kernels (decode, extend) against their plain-torch
references (``radixlm.kernels.paged_attention``), within bounds derived from the
computation (tests/numerics.py), and the references against torch SDPA."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from radixlm.kernels.paged_attention import (
    MAX_KV_SPLITS,
    MIN_SPLIT_LEN,
    allowed_keys,
    cap_scores,
    choose_kv_splits,
    decode_attention_reference,
    extend_attention_reference,
)
from radixlm.kernels.triton import decode_attention_triton, extend_attention_triton
from radixlm.runtime.mem_cache.kv_pool import PAD_SLOT
from tests import numerics as num

# Triton runs on CUDA, else on CPU through its interpreter (tests/conftest.py).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16

# ---- error bounds ---------------------------------------------------------------------------
#
# A kernel and the reference are two float32 evaluations of one attention over the
# same stored (possibly 16-bit) inputs, so ``num.between_two(num.attention(...))``
# bounds their distance, with the kernels' own extra roundings added:
#
# - 16-bit inputs: the kernels round each softmax weight to the input dtype before
#   it multiplies V on the tensor cores (``weights_rounded_to``; under the
#   interpreter bfloat16 weights stay float32, a smaller error), and both sides
#   round the output to that dtype (``between_two``'s ``rounded_to``);
# - num.attention allows ceil(S / 128) rescales of a block's sums (an exp and a
#   product, EXP_ULPS + 2 units each); the kernels rescale once per block of
#   BLOCK_N >= MIN_BLOCK_N keys;
# - scores are s * fl(scale * log2 e) in one product: 2u |s| more than s * scale;
# - decode merges its splits: each split's weight 2^(lse - top) carries exp2's error,
#   the roundings of lse = m + log2 l (log2 within 4u absolute, the sum u |lse|), of
#   lse - top, of the partial output's and the merge's divisions, and the merge's sum
#   over the splits (first order: splits x u). Base-2 absolute errors are ln 2 < 1
#   times the relative error of a weight, |lse|, |top| <= max |s| log2 e + log2 S.
#
# A relative error eta of every weight moves an output by at most eta (|v| + |o|)
# <= 2 eta max |v| (the argument of num.attention).
MIN_BLOCK_N = 16  # tl.dot's smallest tile; the kernels use 16 to 64 keys


def kernel_extra(
    max_abs_v: float, max_abs_score: float, num_keys: int, num_kv_splits: int | None
) -> float:
    """The kernels' roundings beyond num.attention's, as an absolute output bound."""
    eta = math.ceil(num_keys / MIN_BLOCK_N) * (num.EXP_ULPS + 2) * num.U
    eta += 2 * num.U * max_abs_score
    if num_kv_splits is not None:
        lse_magnitude = max_abs_score * math.log2(math.e) + math.log2(num_keys)
        eta += (num.EXP_ULPS + 8 + num_kv_splits) * num.U + 3 * num.U * lse_magnitude
    return 2 * eta * max_abs_v


def heads_first(*tensors: torch.Tensor) -> list[num.Bounded]:
    """(T, H, D) stored values -> exact (H, T, D) operands of num.attention."""
    return [num.exact(t).map(lambda x: x.transpose(0, 1)) for t in tensors]


def attention_bound(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    scale: float,
    allowed: torch.Tensor | None,
    num_kv_splits: int | None = None,
    softcap: float = 0.0,
) -> torch.Tensor:
    """Bound on |kernel - reference| for (Tq, H, D) queries over (S, Hkv, D) keys,
    scores soft-capped by ``softcap`` (0: not). Capped, the base-2 scores are
    fl(c log2 e) tanh(...): the same 2u of the (capped) scores as scale * log2 e."""
    rounded = None if q.dtype == F32 else q.dtype
    exact = num.attention(
        *heads_first(q, keys, values), scale, allowed, rounded, softcap=softcap or None
    )
    group = q.shape[1] // keys.shape[1]
    scores = torch.einsum("thd,shd->ths", q.double(), keys.double().repeat_interleave(group, dim=1))
    extra = kernel_extra(
        values.double().abs().max().item(),
        cap_scores(scale * scores, softcap).abs().max().item(),
        keys.shape[0],
        num_kv_splits,
    )
    return num.between_two(exact, rounded).transpose(0, 1) + extra  # (Tq, H, D)


# ---- cases ----------------------------------------------------------------------------------


@dataclass
class Paged:
    """One layer's K/V pool holding every request's cached tokens in scattered slots
    (a random permutation; slot 0 is the zeroed padding slot), and the table rows
    that map the requests' positions onto them (unused entries hold random slots)."""

    k_pool: torch.Tensor  # (num_slots, Hkv, D)
    v_pool: torch.Tensor
    table: torch.Tensor  # (R, C) int64
    rows: torch.Tensor  # (B,) int64

    def slots(self, b: int, num_tokens: int) -> torch.Tensor:
        return self.table[self.rows[b], :num_tokens]


def paged(
    lengths: list[int], kv_heads: int, head_dim: int, dtype: torch.dtype, gen: torch.Generator
) -> Paged:
    num_slots = sum(lengths) + 9
    shape = (num_slots, kv_heads, head_dim)
    k_pool = torch.randn(shape, generator=gen).to(dtype)
    v_pool = torch.randn(shape, generator=gen).to(dtype)
    k_pool[PAD_SLOT] = 0
    v_pool[PAD_SLOT] = 0
    table = torch.randint(num_slots, (len(lengths) + 2, max(lengths) + 5), generator=gen)
    rows = torch.randperm(len(lengths) + 2, generator=gen)[: len(lengths)]
    slots = torch.randperm(num_slots - 1, generator=gen) + 1
    used = 0
    for row, n in zip(rows.tolist(), lengths, strict=True):
        table[row, :n] = slots[used : used + n]
        used += n
    return Paged(k_pool, v_pool, table, rows)


def fused_q(num_tokens: int, heads: int, kv_heads: int, head_dim: int, dtype, gen, q_scale=1.0):
    """q as the model hands it over: a row-strided view of a fused QKV projection."""
    qkv = torch.randn(num_tokens, heads + 2 * kv_heads, head_dim, generator=gen) * q_scale
    return qkv.to(dtype)[:, :heads]


def on_device(args: tuple) -> tuple:
    return tuple(a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args)


@dataclass
class DecodeCase:
    q: torch.Tensor  # (B, H, D), strided
    paged: Paged
    seq_lens: torch.Tensor  # (B,)
    scale: float
    window: int = 0  # the kernels' options (0: none)
    softcap: float = 0.0

    def args(self) -> tuple:
        p = self.paged
        return (self.q, p.k_pool, p.v_pool, p.table, p.rows, self.seq_lens, self.scale)

    def options(self) -> dict:
        return {"window": self.window, "softcap": self.softcap}

    def bound(self, num_kv_splits: int) -> torch.Tensor:
        """(B, H, D) bound on |kernel - reference|."""
        p = self.paged
        parts = []
        for b, n in enumerate(self.seq_lens.tolist()):
            slots = p.slots(b, n)
            keys, values = p.k_pool[slots], p.v_pool[slots]
            q = self.q[b : b + 1]
            allowed = allowed_keys(torch.tensor([n - 1]), n, self.window)
            parts.append(
                attention_bound(q, keys, values, self.scale, allowed, num_kv_splits, self.softcap)
            )
        return torch.cat(parts)


def decode_case(
    heads: int,
    kv_heads: int,
    head_dim: int,
    seq_lens: list[int],
    dtype: torch.dtype = F32,
    q_scale: float = 1.0,
    seed: int = 0,
) -> DecodeCase:
    gen = torch.Generator().manual_seed(seed)
    p = paged(seq_lens, kv_heads, head_dim, dtype, gen)
    q = fused_q(len(seq_lens), heads, kv_heads, head_dim, dtype, gen, q_scale)
    return DecodeCase(q, p, torch.tensor(seq_lens), head_dim**-0.5)


@dataclass
class ExtendCase:
    q: torch.Tensor  # (T, H, D), strided
    k: torch.Tensor  # (T, Hkv, D), strided
    v: torch.Tensor
    paged: Paged  # the prefixes only: the new tokens' K/V are in k/v alone
    prefix_lens: torch.Tensor  # (B,)
    extend_lens: torch.Tensor
    extend_starts: torch.Tensor
    scale: float
    window: int = 0  # the kernels' options (0: none)
    softcap: float = 0.0

    def options(self) -> dict:
        return {"window": self.window, "softcap": self.softcap}

    def args(self) -> tuple:
        p = self.paged
        lens = (self.prefix_lens, self.extend_lens, self.extend_starts)
        max_extend = int(self.extend_lens.max())
        pool = (p.k_pool, p.v_pool, p.table, p.rows)
        return (self.q, self.k, self.v, *pool, *lens, max_extend, self.scale)

    def bound(self) -> torch.Tensor:
        """(T, H, D) bound on |kernel - reference| (0 in rows no request covers)."""
        bound = torch.zeros(self.q.shape, dtype=torch.float64)
        p = self.paged
        for b, (n, e, start) in enumerate(
            zip(self.prefix_lens.tolist(), self.extend_lens.tolist(), self.extend_starts.tolist())
        ):
            new = slice(start, start + e)
            keys = torch.cat((p.k_pool[p.slots(b, n)], self.k[new]))
            values = torch.cat((p.v_pool[p.slots(b, n)], self.v[new]))
            allowed = allowed_keys(n + torch.arange(e), n + e, self.window)
            bound[new] = attention_bound(
                self.q[new], keys, values, self.scale, allowed, None, self.softcap
            )
        return bound


def extend_case(
    heads: int,
    kv_heads: int,
    head_dim: int,
    requests: list[tuple[int, int]],  # (prefix_len, extend_len) per request
    dtype: torch.dtype = F32,
    seed: int = 0,
) -> ExtendCase:
    gen = torch.Generator().manual_seed(seed)
    prefix = [n for n, _ in requests]
    extend = [e for _, e in requests]
    # The table also maps the new positions, to slots whose pool K/V are not the new
    # tokens' (they are garbage the kernel must not read).
    p = paged([n + e for n, e in requests], kv_heads, head_dim, dtype, gen)
    num_tokens = sum(extend)
    qkv = torch.randn(num_tokens, heads + 2 * kv_heads, head_dim, generator=gen).to(dtype)
    q, k, v = qkv.split([heads, kv_heads, kv_heads], dim=1)
    starts = torch.tensor([0, *extend[:-1]]).cumsum(0)
    return ExtendCase(
        q, k, v, p, torch.tensor(prefix), torch.tensor(extend), starts, head_dim**-0.5
    )


def run_decode(case: DecodeCase, num_kv_splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(kernel, reference) outputs, on the CPU."""
    got = decode_attention_triton(
        *on_device(case.args()), num_kv_splits=num_kv_splits, **case.options()
    )
    return got.cpu(), decode_attention_reference(*case.args(), **case.options())


def run_extend(case: ExtendCase) -> tuple[torch.Tensor, torch.Tensor]:
    got = extend_attention_triton(*on_device(case.args()), **case.options())
    return got.cpu(), extend_attention_reference(*case.args(), **case.options())


def check_decode(case: DecodeCase, num_kv_splits: int) -> None:
    got, want = run_decode(case, num_kv_splits)
    assert got.dtype == case.q.dtype
    num.assert_within(got, want, case.bound(num_kv_splits), "decode")


def check_extend(case: ExtendCase) -> None:
    got, want = run_extend(case)
    assert got.dtype == case.q.dtype
    num.assert_within(got, want, case.bound(), "extend")


# ---- decode ---------------------------------------------------------------------------------

# Ragged rows: one position (fewer than the splits), and lengths no block size divides.
RAGGED = [1, 37, 70]


@pytest.mark.parametrize("head_dim", [64, 80, 96, 128, 256])
def test_decode_head_dims(head_dim):
    check_decode(decode_case(4, 2, head_dim, RAGGED, seed=head_dim), num_kv_splits=4)


# 16-bit inputs: both tile shapes (64 keys a block; 32 at D = 256), a masked head dim.
SIXTEEN_BIT = [(F16, 64), (BF16, 64), (F16, 256), (BF16, 80)]


@pytest.mark.parametrize("dtype, head_dim", SIXTEEN_BIT)
def test_decode_16_bit(dtype, head_dim):
    case = decode_case(6, 2, head_dim, [9, 70, 23, 1], dtype, seed=head_dim)  # group 3
    check_decode(case, num_kv_splits=8)


@pytest.mark.parametrize("heads, kv_heads", [(2, 2), (4, 1), (7, 1), (72, 1)])
def test_decode_gqa_groups(heads, kv_heads):
    """Groups 1, 4, 7, and 72: several head blocks per kv head (16 rows in float32)."""
    check_decode(decode_case(heads, kv_heads, 64, [5, 33], seed=heads), num_kv_splits=4)


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_decode_long_context(dtype):
    """Several key blocks (32 or 64 keys) per split, peaked softmax."""
    case = decode_case(2, 1, 64, [300, 257], dtype, q_scale=3.0, seed=2)
    check_decode(case, num_kv_splits=2)


def test_decode_rows_around_the_split_count():
    """16 splits (the Triton backend's): rows shorter than, as long as, and longer than
    the split count, so some splits are empty and others hold one position."""
    check_decode(decode_case(4, 1, 64, [1, 15, 16, 17, 90], seed=13), num_kv_splits=16)


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_decode_splits_no_shorter_than_the_floor(dtype):
    """``min_split_len`` 32 over 8 splits: a row of 300 splits 8 ways (38 each); one of
    70 fills three splits (32, 32, 6) and leaves five empty; one of 1, one split."""
    case = decode_case(4, 2, 64, [300, 70, 1], dtype, seed=21)
    got = decode_attention_triton(
        *on_device(case.args()), num_kv_splits=8, min_split_len=32, **case.options()
    )
    want = decode_attention_reference(*case.args(), **case.options())
    num.assert_within(got.cpu(), want, case.bound(8), "decode")


def test_decode_one_request_into_a_strided_out():
    case = decode_case(4, 2, 64, [5], seed=3)
    buffer = torch.full((1, 4, 2, 64), 7.0, device=DEVICE)
    out = buffer[:, :, 0]  # (1, 4, 64), heads strided
    got = decode_attention_triton(*on_device(case.args()), out=out, num_kv_splits=8)
    assert got is out
    num.assert_within(out.cpu(), decode_attention_reference(*case.args()), case.bound(8))
    assert bool((buffer[:, :, 1] == 7.0).all())


def test_decode_row_of_no_positions_is_zero():
    """A padded row (seq_len 0, e.g. in a captured batch) reads nothing and gives zeros."""
    case = decode_case(2, 1, 64, [3, 4], seed=4)
    case.seq_lens[0] = 0
    got, want = run_decode(case, num_kv_splits=2)
    assert bool((got[0] == 0).all()) and bool((want[0] == 0).all())
    case.seq_lens = case.seq_lens[1:]
    case.q, case.paged.rows = case.q[1:], case.paged.rows[1:]
    num.assert_within(got[1:], want[1:], case.bound(2), "decode")


def test_decode_bound_catches_a_dropped_key():
    """The reference without each row's last key is off by far more than the bound."""
    case = decode_case(4, 2, 64, [20, 45], seed=5)
    got, _ = run_decode(case, num_kv_splits=4)
    short = decode_attention_reference(*case.args()[:5], case.seq_lens - 1, case.scale)
    ratio = (got.double() - short.double()).abs() / case.bound(4)
    assert ratio.amax(dim=(1, 2)).min() > 100


# ---- extend ---------------------------------------------------------------------------------

# A fresh prefill and one on a cached prefix, lengths no block size divides.
REQUESTS = [(0, 20), (13, 7)]


@pytest.mark.parametrize("head_dim", [64, 80, 96, 128, 256])
def test_extend_head_dims(head_dim):
    check_extend(extend_case(4, 2, head_dim, REQUESTS, seed=head_dim))


@pytest.mark.parametrize("dtype, head_dim", SIXTEEN_BIT)
def test_extend_16_bit_mixing_single_tokens_with_longer(dtype, head_dim):
    requests = [(5, 1), (0, 19), (30, 1), (17, 33)]
    check_extend(extend_case(6, 2, head_dim, requests, dtype, seed=head_dim))  # group 3


@pytest.mark.parametrize("heads, kv_heads", [(2, 2), (4, 1), (7, 1)])
def test_extend_gqa_groups(heads, kv_heads):
    check_extend(extend_case(heads, kv_heads, 64, [(3, 9), (0, 1)], seed=heads))


def test_extend_several_query_blocks():
    """One request of 150 new tokens: several query blocks (32 rows in float32), the
    diagonal blocks' causal mask, and programs past the end of a shorter request."""
    check_extend(extend_case(2, 1, 64, [(40, 150), (0, 3)], seed=7))


def test_extend_leaves_rows_no_request_covers():
    case = extend_case(4, 2, 64, [(6, 5), (0, 4)], seed=8)
    case.extend_starts = torch.tensor([4, 0])  # rows 0-3: request 1; 4-8: request 0
    case.extend_lens = torch.tensor([5, 3])  # row 3 is nobody's
    out = torch.full(case.q.shape, 7.0, device=DEVICE)
    got = extend_attention_triton(*on_device(case.args()), out=out)
    assert got is out
    want = extend_attention_reference(*case.args())
    assert bool((out[3] == 7.0).all()) and bool((want[3] == 0).all())
    covered = torch.tensor([0, 1, 2, 4, 5, 6, 7, 8])
    num.assert_within(out.cpu()[covered], want[covered], case.bound()[covered], "extend")


def test_extend_bound_catches_a_missing_prefix_key():
    case = extend_case(4, 2, 64, [(9, 6), (21, 3)], seed=9)
    got, _ = run_extend(case)
    args = list(case.args())
    args[7] = case.prefix_lens - 1  # the reference without each request's last cached key
    short = extend_attention_reference(*args)
    ratio = (got.double() - short.double()).abs() / case.bound()
    assert ratio.amax(dim=(1, 2)).min() > 100


# ---- sliding windows and soft-capping -------------------------------------------------------

# (window, softcap): a window of one position (the token alone), one within a key
# block, one across several; soft-capped scores of up to tens, with and without one.
SCORING = [(1, 0.0), (7, 0.0), (40, 0.0), (0, 5.0), (40, 5.0)]


@pytest.mark.parametrize("window, softcap", SCORING)
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_decode_window_and_softcap(window, softcap, dtype):
    """Rows shorter and longer than the window (70 positions over 4 splits: the
    window's positions shared out, the splits before it empty)."""
    case = decode_case(4, 2, 64, RAGGED + [5], dtype, q_scale=4.0, seed=window + 1)
    case.window, case.softcap = window, softcap
    check_decode(case, num_kv_splits=4)
    got, _ = run_decode(case, num_kv_splits=4)
    plain = decode_attention_reference(*case.args())
    assert ((got.double() - plain.double()).abs() / case.bound(4)).amax() > 100  # it changed


@pytest.mark.parametrize("window, softcap", SCORING)
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_extend_window_and_softcap(window, softcap, dtype):
    """Fresh prompts longer than the window, chunks on cached prefixes longer than
    it (stage 1 starts at the window) and shorter, single tokens; several query
    blocks (32 rows in float32), so a block's rows see different first keys."""
    requests = [(0, 45), (60, 37), (3, 1), (90, 2), (5, 20)]
    case = extend_case(4, 2, 64, requests, dtype, seed=window + 2)
    case.q = case.q * 4.0  # scores of up to tens: the cap bends them
    case.window, case.softcap = window, softcap
    check_extend(case)
    got, _ = run_extend(case)
    plain = extend_attention_reference(*case.args())
    assert ((got.double() - plain.double()).abs() / case.bound()).amax() > 100  # it changed


def test_a_windowed_chunk_matches_the_windowed_prompt():
    """Chunked prefill under a window: a prompt's second chunk on its first, cached
    (prefix 50 > window 16), gives the rows the whole prompt gives."""
    case = extend_case(4, 2, 64, [(0, 80)], seed=14)
    case.window = 16
    whole, _ = run_extend(case)
    p = case.paged
    p.k_pool[p.slots(0, 80)[:50]] = case.k[:50]  # the first chunk's K/V, now in the pool
    p.v_pool[p.slots(0, 80)[:50]] = case.v[:50]
    chunk = ExtendCase(
        case.q[50:], case.k[50:], case.v[50:], p, torch.tensor([50]), torch.tensor([30]),
        torch.tensor([0]), case.scale, window=16,
    )  # fmt: skip
    got, _ = run_extend(chunk)
    num.assert_within(got, whole[50:], chunk.bound() + case.bound()[50:], "chunk")


# ---- the references against torch SDPA ------------------------------------------------------


def sdpa(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float, **mask):
    """(Tq, H, D) over (S, Hkv, D), in float64."""
    qh, kh, vh = (t.double().transpose(0, 1) for t in (q, keys, values))
    out = F.scaled_dot_product_attention(qh, kh, vh, scale=scale, enable_gqa=True, **mask)
    return out.transpose(0, 1)


def test_decode_reference_is_sdpa_over_the_rows_slots():
    case = decode_case(6, 2, 64, RAGGED, seed=10)
    got = decode_attention_reference(*case.args())
    p = case.paged
    for b, n in enumerate(case.seq_lens.tolist()):
        slots = p.slots(b, n)
        want = sdpa(case.q[b : b + 1], p.k_pool[slots], p.v_pool[slots], case.scale)
        exact = num.attention(
            *heads_first(case.q[b : b + 1], p.k_pool[slots], p.v_pool[slots]), case.scale
        )
        num.assert_within(got[b : b + 1], want, num.from_exact(exact).transpose(0, 1))


def test_extend_reference_is_causal_sdpa_over_prefix_and_new_tokens():
    case = extend_case(6, 2, 64, [(0, 12), (7, 5)], seed=11)
    got = extend_attention_reference(*case.args())
    p = case.paged
    fresh = slice(0, 12)  # no prefix: plain causal attention
    want = sdpa(case.q[fresh], case.k[fresh], case.v[fresh], case.scale, is_causal=True)
    allowed = torch.ones(12, 12, dtype=torch.bool).tril()
    exact = num.attention(
        *heads_first(case.q[fresh], case.k[fresh], case.v[fresh]), case.scale, allowed
    )
    num.assert_within(got[fresh], want, num.from_exact(exact).transpose(0, 1))
    cached = slice(12, 17)  # 7 cached tokens, then 5 new ones
    keys = torch.cat((p.k_pool[p.slots(1, 7)], case.k[cached]))
    values = torch.cat((p.v_pool[p.slots(1, 7)], case.v[cached]))
    allowed = torch.arange(12)[None, :] <= (7 + torch.arange(5))[:, None]
    want = sdpa(case.q[cached], keys, values, case.scale, attn_mask=allowed)
    exact = num.attention(*heads_first(case.q[cached], keys, values), case.scale, allowed)
    num.assert_within(got[cached], want, num.from_exact(exact).transpose(0, 1))


# ---- argument errors ------------------------------------------------------------------------


def test_argument_errors():
    case = decode_case(4, 2, 64, [3], seed=12)
    q, k_pool, v_pool, table, rows, seq_lens, scale = case.args()
    bad = [
        (q[0], k_pool, v_pool, table, rows, seq_lens),  # q not (B, H, D)
        (q, k_pool[:, :1].expand(-1, 3, -1), v_pool, table, rows, seq_lens),  # pools differ
        (q.double(), k_pool, v_pool, table, rows, seq_lens),  # dtypes differ
        (q, k_pool, v_pool, table.float(), rows, seq_lens),  # float table
        (q, k_pool, v_pool, table, rows, seq_lens[:0]),  # seq_lens not (B,)
    ]
    for args in bad:
        for attend in (decode_attention_triton, decode_attention_reference):
            with pytest.raises(ValueError):
                attend(*args, scale)
    out = torch.empty(1, 64, 4).transpose(1, 2)  # (1, 4, 64), last dim strided
    with pytest.raises(ValueError):
        decode_attention_triton(q, k_pool, v_pool, table, rows, seq_lens, scale, out=out)
    ext = extend_case(4, 2, 64, [(2, 3)], seed=12)
    args = list(ext.args())
    args[1] = ext.k[:, :1]  # k not (T, Hkv, D)
    for attend in (extend_attention_triton, extend_attention_reference):
        with pytest.raises(ValueError):
            attend(*args)


# ---- the decode split rule ------------------------------------------------------------------

H200_SMS = 132


def test_one_row_fills_the_gpu_with_splits():
    """Batch 1, 8 kv heads (a 1B model): 264 programs wanted -> 33 splits of a long row."""
    assert choose_kv_splits(1, 8, 131_072, H200_SMS) == 33
    assert 1 * 8 * choose_kv_splits(1, 8, 131_072, H200_SMS) >= 2 * H200_SMS


def test_a_full_batch_does_not_split():
    assert choose_kv_splits(64, 8, 131_072, H200_SMS) == 1
    assert choose_kv_splits(33, 8, 131_072, H200_SMS) == 1  # 264 programs already
    assert choose_kv_splits(16, 8, 131_072, H200_SMS) == 3


def test_short_contexts_are_not_split_needlessly():
    """No more splits than the longest row has MIN_SPLIT_LEN runs of positions."""
    assert choose_kv_splits(1, 8, MIN_SPLIT_LEN, H200_SMS) == 1
    assert choose_kv_splits(1, 8, 3 * MIN_SPLIT_LEN + 1, H200_SMS) == 4
    assert choose_kv_splits(1, 1, 10**7, H200_SMS) == MAX_KV_SPLITS


@pytest.mark.parametrize("batch", [1, 2, 3, 8, 24, 64, 128, 512])
@pytest.mark.parametrize("kv_heads", [1, 2, 8, 32])
def test_the_rule_fills_the_gpu_within_its_caps(batch, kv_heads):
    for context in (1, 255, 4096, 131_072):
        splits = choose_kv_splits(batch, kv_heads, context, H200_SMS)
        assert 1 <= splits <= MAX_KV_SPLITS
        capped = splits in (MAX_KV_SPLITS, -(-context // MIN_SPLIT_LEN))
        assert batch * kv_heads * splits >= 2 * H200_SMS or capped
        # the fewest splits that do: one fewer would not fill the GPU
        assert splits == 1 or batch * kv_heads * (splits - 1) < 2 * H200_SMS


def test_the_rule_refuses_nonpositive_arguments():
    with pytest.raises(ValueError, match="batch must be >= 1"):
        choose_kv_splits(0, 8, 100, H200_SMS)
    with pytest.raises(ValueError, match="num_sms must be >= 1"):
        choose_kv_splits(1, 8, 100, 0)
