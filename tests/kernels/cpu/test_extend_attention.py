"""The C++ extend (prefill) attention kernel against its plain-torch reference."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
import torch
import torch.nn.functional as F

from radixlm.kernels.cpu.decode_attention import KernelShapeError
from radixlm.kernels.cpu.extend_attention import (
    ExtendAttention,
    extend_attention_reference,
    load_extend_attention,
)
from radixlm.kernels.cpu.native import NATIVE, KernelTarget, cpu_flags
from radixlm.runtime.model_store import cache_root
from tests import numerics as num
from tests.kernels.cpu import quantized_kv as qkv_cache


@pytest.fixture(scope="module")
def kernel(kernel_target_and_native: KernelTarget) -> ExtendAttention:
    return load_extend_attention(cache_root() / "kernels", kernel_target_and_native)


@dataclass
class Case:
    """A pass: requests with cached prefixes and new tokens over a pool of random
    K/V (every key, new tokens' included, in scattered slots), and a fused QKV
    projection whose q is a row-strided view, as the model hands it over."""

    q: torch.Tensor  # (T, H, D)
    k_cache: torch.Tensor  # (slots, Hkv, D)
    v_cache: torch.Tensor
    table: torch.Tensor  # (R, C)
    rows: torch.Tensor  # (B,)
    prefix_lens: torch.Tensor
    extend_lens: torch.Tensor
    starts: torch.Tensor
    scale: float

    def args(self) -> tuple:
        return (
            self.q,
            self.k_cache,
            self.v_cache,
            self.table,
            self.rows,
            self.prefix_lens,
            self.extend_lens,
            self.starts,
            self.scale,
        )


def _case(
    heads: int,
    kv_heads: int,
    head_dim: int,
    requests: list[tuple[int, int]],  # (cached, new) per request
    dtype: torch.dtype = torch.float32,
    q_scale: float = 1.0,
    seed: int = 0,
) -> Case:
    gen = torch.Generator().manual_seed(seed)
    width = max((c + n for c, n in requests), default=1)
    num_slots = 2 * width + 64
    k_cache = torch.randn(num_slots, kv_heads, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(num_slots, kv_heads, head_dim, generator=gen).to(dtype)
    table = torch.stack([torch.randperm(num_slots, generator=gen)[:width] for _ in requests + [0]])
    rows = torch.randperm(len(requests) + 1, generator=gen)[: len(requests)]
    num_tokens = sum(n for _, n in requests)
    qkv = torch.randn(num_tokens, heads + 2 * kv_heads, head_dim, generator=gen) * q_scale
    q = qkv.to(dtype)[:, :heads]
    extend = torch.tensor([n for _, n in requests], dtype=torch.int64)
    return Case(
        q,
        k_cache,
        v_cache,
        table,
        rows,
        torch.tensor([c for c, _ in requests], dtype=torch.int64),
        extend,
        torch.cumsum(extend, 0) - extend,
        head_dim**-0.5,
    )


def _weights(kernel: ExtendAttention, case: Case) -> torch.dtype | None:
    """What the kernel rounds the softmax weights to before p V: bfloat16 where its
    bfloat16 calls take AVX512-BF16 dot products, else nothing."""
    bf16 = case.q.dtype == torch.bfloat16 and case.k_cache.dtype == torch.bfloat16
    return torch.bfloat16 if kernel.bf16_dot_products and bf16 else None


def _bound(kernel: ExtendAttention, case: Case, window: int = 0, softcap: float = 0.0):
    """|kernel - reference| (or SDPA): two float32 evaluations (bfloat16 inputs are
    exact in float32), each rounded once to a bfloat16 output; the kernel's weights
    rounded as ``_weights`` says."""
    exact = num.extend_attention(
        num.exact(case.q), *case.args()[1:], window, softcap, _weights(kernel, case)
    )
    return num.between_two(exact, None if case.q.dtype == torch.float32 else case.q.dtype)


def _assert_matches_reference(kernel: ExtendAttention, case: Case) -> torch.Tensor:
    got = kernel(*case.args())
    want = extend_attention_reference(*case.args())
    assert got.dtype == case.q.dtype and got.shape == case.q.shape
    num.assert_within(got, want, _bound(kernel, case))
    return got


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim"),
    [
        (9, 3, 64),  # the default model: tiles of 4 tokens x 3 heads
        (8, 8, 128),  # no grouping: tiles of 12 tokens
        (16, 2, 32),  # 8 heads per KV head: tiles of one token
        (12, 1, 256),  # 12 heads per KV head, the widest head
        (14, 2, 80),  # 7 per KV head; 80 = 64 + 16 (a partial group of columns)
        (10, 2, 48),  # 5 per KV head: tiles of 2 tokens x 5 = 10 rows
        (2, 2, 16),
    ],
)
def test_kernel_matches_reference(kernel, dtype, heads, kv_heads, head_dim) -> None:
    """Every tile height from the head grouping, head dims off the 64-column
    blocks; fresh prompts, extends on a prefix, and single new tokens."""
    requests = [(0, 13), (5, 1), (40, 7), (0, 1), (3, 30)]
    _assert_matches_reference(kernel, _case(heads, kv_heads, head_dim, requests, dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "requests",
    [[(0, 1000)], [(700, 300)], [(255, 2), (256, 1), (0, 257), (511, 2), (1, 600)]],
)
def test_long_requests_cross_key_blocks(kernel, dtype, requests) -> None:
    """Keys walked in blocks of 256 with an online softmax: lengths on both sides
    of the block and panel (32) edges, and a tile whose rows end in different blocks."""
    _assert_matches_reference(kernel, _case(9, 3, 64, requests, dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("window", "softcap"),
    [(1, 0.0), (7, 0.0), (100, 0.0), (256, 0.0), (300, 0.0), (0, 5.0), (100, 5.0)],
)
def test_window_and_softcap_match_reference(kernel, dtype, window, softcap) -> None:
    """Sliding windows of one position (each token alone), within a tile, of a key
    block, and across blocks; prefixes longer than the window (a chunk on a long
    cached prefix: its packs start at the window's block) and shorter; soft-capped
    scores of up to tens."""
    requests = [(0, 300), (700, 60), (5, 1), (1000, 3), (250, 20), (3, 30)]
    case = _case(9, 3, 64, requests, dtype, q_scale=8.0, seed=window)
    got = kernel(*case.args(), window, softcap)
    want = extend_attention_reference(*case.args(), window, softcap)
    bound = _bound(kernel, case, window, softcap)
    num.assert_within(got, want, bound)
    plain = extend_attention_reference(*case.args())
    assert ((got.double() - plain.double()).abs() / bound).amax() > 100  # it did change


def test_a_windowed_prompt_equals_banded_sdpa(kernel) -> None:
    """A fresh prompt under a window W is SDPA with a band mask p - W < k <= p."""
    case = _case(9, 3, 64, [(0, 333)])
    slots = case.table[case.rows[0], :333]
    k, v = (c[slots].transpose(0, 1)[None] for c in (case.k_cache, case.v_cache))
    positions = torch.arange(333)
    band = (positions[None, :] <= positions[:, None]) & (
        positions[None, :] > positions[:, None] - 40
    )
    want = F.scaled_dot_product_attention(
        case.q.transpose(0, 1)[None], k, v, attn_mask=band, scale=case.scale, enable_gqa=True
    )[0].transpose(0, 1)
    exact = num.extend_attention(num.exact(case.q), *case.args()[1:], 40)
    num.assert_within(kernel(*case.args(), 40), want, num.between_two(exact))


def test_fresh_prompt_equals_causal_sdpa(kernel) -> None:
    """A prompt with no cached prefix is plain causal attention."""
    case = _case(9, 3, 64, [(0, 333)])
    slots = case.table[case.rows[0], :333]
    k, v = (c[slots].transpose(0, 1)[None] for c in (case.k_cache, case.v_cache))
    want = F.scaled_dot_product_attention(
        case.q.transpose(0, 1)[None], k, v, is_causal=True, scale=case.scale, enable_gqa=True
    )[0].transpose(0, 1)
    num.assert_within(kernel(*case.args()), want, _bound(kernel, case))


def test_large_scores_stay_finite(kernel) -> None:
    """Scores in the hundreds: the online softmax subtracts the running maximum.
    Float32 rounding of scores that large moves the weights more (the bound grows
    with the scores' magnitude)."""
    case = _case(9, 3, 64, [(300, 20), (0, 9)], q_scale=60.0)
    got = kernel(*case.args())
    assert torch.isfinite(got).all()
    num.assert_within(got, extend_attention_reference(*case.args()), _bound(kernel, case))


def test_only_the_requests_rows_are_written(kernel) -> None:
    """Requests in any order of their rows of q; rows no request covers (a pass's
    decode rows, attended by the decode kernel) keep what out held."""
    case = _case(9, 3, 64, [(4, 6), (0, 3)])
    q = torch.randn(12, 9, 64)
    q[1:7], q[9:12] = case.q[:6], case.q[6:]
    case = replace(case, q=q, starts=torch.tensor([1, 9]))
    out = torch.full_like(q, 7.0)
    kernel.launch(*case.args(), out)
    want, bound = extend_attention_reference(*case.args()), _bound(kernel, case)
    num.assert_within(out[1:7], want[1:7], bound[1:7])
    num.assert_within(out[9:], want[9:], bound[9:])
    assert (out[0] == 7).all() and (out[7:9] == 7).all()


def test_a_request_attends_only_its_own_slots(kernel) -> None:
    """Changing a value no request reads changes nothing; changing one request's
    changes that request's rows only."""
    case = _case(9, 3, 64, [(5, 4), (2, 6)])
    before = kernel(*case.args())
    seen = set(case.table[case.rows[0], :9].tolist()) | set(case.table[case.rows[1], :8].tolist())
    unseen = next(s for s in range(case.k_cache.shape[0]) if s not in seen)
    case.v_cache[unseen] += 1.0
    assert torch.equal(kernel(*case.args()), before)
    case.v_cache[case.table[case.rows[0], 0]] += 1.0  # request 0's first key
    after = kernel(*case.args())
    assert not torch.equal(after[:4], before[:4])
    assert torch.equal(after[4:], before[4:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_request_does_not_depend_on_its_batch_or_threads(kernel, dtype) -> None:
    """Each output row depends on its own query, keys and values only: alone or
    batched, on one thread or two, the same to the bit."""
    case = _case(9, 3, 64, [(3, 50), (700, 9), (0, 1), (0, 400), (30, 2)], dtype)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one_thread = kernel(*case.args())
        torch.set_num_threads(2)
        together = kernel(*case.args())
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one_thread, together)
    for b in range(case.rows.numel()):
        start, n = int(case.starts[b]), int(case.extend_lens[b])
        alone = replace(
            case,
            q=case.q[start : start + n],
            rows=case.rows[b : b + 1],
            prefix_lens=case.prefix_lens[b : b + 1],
            extend_lens=case.extend_lens[b : b + 1],
            starts=torch.zeros(1, dtype=torch.int64),
        )
        assert torch.equal(kernel(*alone.args()), together[start : start + n])


def test_dot_products_where_the_build_has_them(kernel, kernel_target_and_native) -> None:
    """The native build on a CPU with AVX512-BF16 takes its dot products; the ISA
    builds (x86-64-v3, -v4) never do."""
    native = kernel_target_and_native is NATIVE
    assert kernel.bf16_dot_products == (native and "avx512_bf16" in cpu_flags())


def test_empty_pass(kernel) -> None:
    case = _case(9, 3, 64, [])
    assert kernel(*case.args()).shape == (0, 9, 64)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim", "dtype", "supported"),
    [
        (9, 3, 64, torch.float32, True),
        (32, 8, 128, torch.bfloat16, True),
        (24, 2, 64, torch.float32, True),  # 12 query heads per KV head
        (26, 2, 64, torch.float32, False),  # 13
        (9, 3, 64, torch.float16, False),
        (9, 3, 72, torch.float32, False),  # not a multiple of 16
        (9, 3, 272, torch.float32, False),  # over 256
        (9, 2, 64, torch.float32, False),  # heads not a multiple of KV heads
    ],
)
def test_supports(heads, kv_heads, head_dim, dtype, supported) -> None:
    assert ExtendAttention.supports(heads, kv_heads, head_dim, dtype) is supported


def test_unsupported_inputs_raise(kernel) -> None:
    case = _case(9, 3, 64, [(4, 3), (0, 5)])
    bad = {
        "unsupported dtype": replace(
            case, q=case.q.half(), k_cache=case.k_cache.half(), v_cache=case.v_cache.half()
        ),
        "k_cache and v_cache must be contiguous": replace(
            case, k_cache=case.k_cache[::2], v_cache=case.v_cache[::2]
        ),
        "q must be contiguous within each row": replace(
            case, q=case.q.transpose(1, 2).contiguous().transpose(1, 2)
        ),
        r"q must be a CPU torch.float32": replace(case, q=case.q.bfloat16()),
        "req_to_token must be": replace(case, table=case.table.int()),
        r"extend_lens must be a CPU int64 tensor of shape \(B,\)": replace(
            case, extend_lens=case.extend_lens[:1]
        ),
        "starts must be a CPU int64": replace(case, starts=case.starts.int()),
        "extend_lens must be >= 1": replace(case, extend_lens=torch.tensor([3, 0])),
        "must lie in q's 8": replace(case, starts=torch.tensor([0, 4])),
        "must fit req_to_token's": replace(case, prefix_lens=torch.tensor([4, 100])),
        "rows must index req_to_token's 3 rows": replace(case, rows=torch.tensor([0, 3])),
        "must not overlap": replace(case, starts=torch.tensor([2, 0])),
    }
    for message, args in bad.items():
        with pytest.raises(KernelShapeError, match=message):
            kernel(*args.args())


def test_launch_equals_the_checked_call(kernel) -> None:
    case = _case(9, 3, 64, [(5, 8), (0, 21), (301, 1)])
    out = torch.empty_like(case.q, memory_format=torch.contiguous_format)
    kernel.launch(*case.args(), out)
    assert torch.equal(out, kernel(*case.args()))


# A quantized pool: int8 / fp8 codes with a bfloat16 scale per slot and KV head.


def _quantized_case(
    fmt: str, heads: int, kv_heads: int, head_dim: int, requests, dtype, seed: int = 0
) -> tuple[Case, torch.Tensor, torch.Tensor]:
    """``_case``'s pass over a quantized cache (its K/V replaced by codes), and the
    codes' k and v scales."""
    case = _case(heads, kv_heads, head_dim, requests, dtype, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    slots = case.k_cache.shape[0]
    k_codes, k_scale, _ = qkv_cache.quantized_cache(fmt, slots, kv_heads, head_dim, gen)
    v_codes, v_scale, _ = qkv_cache.quantized_cache(fmt, slots, kv_heads, head_dim, gen)
    return replace(case, k_cache=k_codes, v_cache=v_codes), k_scale, v_scale


def _truth(case: Case, k_scale, v_scale, window: int = 0, softcap: float = 0.0):
    q, k_codes, v_codes, table, rows, prefix, extend, starts, scale = case.args()
    caches = (k_codes, v_codes, k_scale, v_scale)
    return qkv_cache.extend_truth(
        q, caches, table, rows, prefix, extend, starts, scale, window, softcap
    )


@pytest.mark.parametrize("fmt", qkv_cache.FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(9, 3, 64), (32, 8, 64), (8, 2, 96)])
def test_quantized_cache_matches_float64_attention(
    kernel, fmt, dtype, heads, kv_heads, head_dim
) -> None:
    """Prompts on cached prefixes (and a fresh one) over int8 / fp8 codes: within
    float32 rounding of float64 attention over the dequantized cache."""
    case, k_scale, v_scale = _quantized_case(
        fmt, heads, kv_heads, head_dim, [(0, 7), (300, 40), (29, 300)], dtype
    )
    got = kernel(*case.args(), k_scale=k_scale, v_scale=v_scale)
    assert got.dtype == dtype and got.shape == case.q.shape
    qkv_cache.assert_near_truth(got, _truth(case, k_scale, v_scale))


@pytest.mark.parametrize("fmt", qkv_cache.FORMATS)
@pytest.mark.parametrize(("window", "softcap"), [(64, 0.0), (0, 5.0), (100, 5.0)])
def test_quantized_cache_window_and_softcap(kernel, fmt, window, softcap) -> None:
    case, k_scale, v_scale = _quantized_case(
        fmt, 9, 3, 64, [(600, 20), (5, 300)], torch.float32, seed=2
    )
    got = kernel(*case.args(), window, softcap, k_scale, v_scale)
    qkv_cache.assert_near_truth(got, _truth(case, k_scale, v_scale, window, softcap))


def test_quantized_reference_dequantizes_first(kernel) -> None:
    """extend_attention_reference over codes and scales is the float reference over
    code * scale, and the kernel agrees with it within float32 rounding."""
    case, k_scale, v_scale = _quantized_case("int8", 8, 2, 64, [(40, 9)], torch.float32)
    k_float = case.k_cache.float() * k_scale[..., None]
    v_float = case.v_cache.float() * v_scale[..., None]
    want = extend_attention_reference(*replace(case, k_cache=k_float, v_cache=v_float).args())
    assert torch.equal(
        extend_attention_reference(*case.args(), k_scale=k_scale, v_scale=v_scale), want
    )
    num.assert_within(
        kernel(*case.args(), k_scale=k_scale, v_scale=v_scale), want,
        num.between_two(_truth(case, k_scale, v_scale)),
    )  # fmt: skip
