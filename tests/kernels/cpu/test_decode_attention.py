"""The C++ decode attention kernel against its plain-torch reference."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels.cpu.decode_attention import (
    DecodeAttention,
    KernelShapeError,
    check_cache,
    decode_attention_codes_op,
    decode_attention_op,
    decode_attention_reference,
    load_decode_attention,
)
from radixlm.kernels.cpu.native import KernelTarget
from radixlm.runtime.model_store import cache_root
from tests import numerics as num
from tests.kernels.cpu import quantized_kv as qkv_cache


@pytest.fixture(scope="module")
def kernel(kernel_target: KernelTarget) -> DecodeAttention:
    return load_decode_attention(cache_root() / "kernels", kernel_target)


def _case(
    heads: int,
    kv_heads: int,
    head_dim: int,
    prefix_lens: list[int],
    dtype: torch.dtype = torch.float32,
    q_scale: float = 1.0,
    seed: int = 0,
) -> tuple:
    """A pool of random K/V, rows of scattered (and shared) slots, and a fused QKV
    projection whose q/k/v are row-strided views, as the model hands them over."""
    gen = torch.Generator().manual_seed(seed)
    num_slots, width = 600, max(prefix_lens, default=0) + 1
    k_cache = torch.randn(num_slots, kv_heads, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(num_slots, kv_heads, head_dim, generator=gen).to(dtype)
    table = torch.randint(1, num_slots, (len(prefix_lens) + 2, width), generator=gen)
    rows = torch.randperm(len(prefix_lens) + 2, generator=gen)[: len(prefix_lens)]
    qkv = torch.randn(len(prefix_lens), heads + 2 * kv_heads, head_dim, generator=gen)
    qkv[:, :heads] *= q_scale
    qkv = qkv.to(dtype)
    q, k_new, v_new = qkv.split([heads, kv_heads, kv_heads], dim=1)
    scale = head_dim**-0.5
    lens = torch.tensor(prefix_lens, dtype=torch.int64)
    return q, k_cache, v_cache, table, rows, lens, k_new, v_new, scale


def _bound(args: tuple) -> torch.Tensor:
    """|kernel - reference|: two float32 evaluations (bfloat16 inputs are exact in
    float32), each rounded once to a bfloat16 output."""
    q, k_cache, v_cache, table, rows, lens, k_new, v_new, scale = args
    exact = num.decode_attention(
        num.exact(q), k_cache, v_cache, table, rows, lens, num.exact(k_new), num.exact(v_new), scale
    )
    return num.between_two(exact, None if q.dtype == torch.float32 else q.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim"),
    [
        (9, 3, 64),
        (8, 8, 128),
        (16, 2, 32),
        (8, 1, 256),
        (12, 4, 96),
        (2, 2, 16),
        (32, 8, 64),
        (28, 4, 128),
    ],
)
def test_kernel_matches_reference(kernel, dtype, heads, kv_heads, head_dim) -> None:
    """Grouped and plain heads, the specialised head dims (64, 128) and the generic
    path, one block of KV heads per work item or several (32/8: two blocks of 4
    KV heads; 28/4: two of 2); rows with no cached token, one, and a few hundred."""
    args = _case(heads, kv_heads, head_dim, [0, 1, 17, 300, 64], dtype)
    got = kernel(*args)
    want = decode_attention_reference(*args)
    assert got.dtype == dtype and got.shape == args[0].shape
    num.assert_within(got, want, _bound(args))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("prefix_lens", [[4000], [511, 512, 1023, 1024, 1500, 3]])
def test_long_rows_split_into_spans_match_reference(kernel, dtype, prefix_lens) -> None:
    """Rows longer than a span (512 positions, the new token included) are split
    and their spans merged; lengths on both sides of each span edge."""
    args = _case(9, 3, 64, prefix_lens, dtype)
    num.assert_within(kernel(*args), decode_attention_reference(*args), _bound(args))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("window", "softcap"),
    [(1, 0.0), (16, 0.0), (300, 0.0), (700, 0.0), (0, 5.0), (100, 5.0), (0, 50.0)],
)
def test_window_and_softcap_match_reference(kernel, dtype, window, softcap) -> None:
    """A sliding window narrower than some rows (one position: the new token alone)
    and wider than others, spans of windowed rows (1100 positions: three spans of
    the last 700), and soft-capped scores of up to tens (the cap bends them)."""
    args = _case(9, 3, 64, [0, 5, 17, 300, 1100, 4000], dtype, q_scale=8.0, seed=window)
    got = kernel(*args, window, softcap)
    want = decode_attention_reference(*args, window, softcap)
    q, k_cache, v_cache, table, rows, lens, k_new, v_new, scale = args
    exact = num.decode_attention(
        num.exact(q), k_cache, v_cache, table, rows, lens, num.exact(k_new), num.exact(v_new),
        scale, window, softcap,
    )  # fmt: skip
    bound = num.between_two(exact, None if dtype == torch.float32 else dtype)
    num.assert_within(got, want, bound)
    plain = decode_attention_reference(*args)
    assert ((got.double() - plain.double()).abs() / bound).amax() > 100  # it did change


def test_a_windowed_row_is_the_plain_row_of_its_window(kernel) -> None:
    """A window of W over n cached tokens and the new one attends exactly what a
    plain row of the last W - 1 cached slots attends, split into the same spans:
    the same result to the bit."""
    q, k_cache, v_cache, table, rows, lens, k_new, v_new, scale = _case(9, 3, 64, [1500, 40])
    window = 600
    windowed = kernel(q, k_cache, v_cache, table, rows, lens, k_new, v_new, scale, window)
    short = table.clone()
    short[rows[0], : window - 1] = table[rows[0], 1500 - window + 1 : 1500]
    short_lens = torch.tensor([window - 1, 40])
    plain = kernel(q, k_cache, v_cache, short, rows, short_lens, k_new, v_new, scale)
    assert torch.equal(windowed, plain)


def test_large_scores_stay_finite(kernel) -> None:
    """Scores in the hundreds: the softmax subtracts the row maximum before exp
    (an exp of them would overflow). Float32 rounding of scores that large moves
    the weights more (the bound grows with the scores' magnitude)."""
    args = _case(9, 3, 64, [40, 250], q_scale=60.0)
    got = kernel(*args)
    assert torch.isfinite(got).all()
    num.assert_within(got, decode_attention_reference(*args), _bound(args))


def test_a_row_attends_only_its_own_slots(kernel) -> None:
    """Changing K/V in slots no row reads changes nothing; changing one a row reads
    changes that row only."""
    q, k_cache, v_cache, table, rows, lens, k_new, v_new, scale = _case(9, 3, 64, [5, 7])
    table[rows[0], :5] = torch.arange(1, 6)
    table[rows[1], :7] = torch.arange(10, 17)
    before = kernel(q, k_cache, v_cache, table, rows, lens, k_new, v_new, scale)
    v_cache[20:] += 1.0  # read by no row
    same = kernel(q, k_cache, v_cache, table, rows, lens, k_new, v_new, scale)
    assert torch.equal(before, same)
    v_cache[3] += 1.0  # row 0's third slot
    after = kernel(q, k_cache, v_cache, table, rows, lens, k_new, v_new, scale)
    assert not torch.equal(after[0], before[0])
    assert torch.equal(after[1], before[1])


def test_a_row_does_not_depend_on_its_batch(kernel) -> None:
    """How a row is split into spans depends on its own length only: alone or
    batched with others, its output is the same to the bit (batch invariance)."""
    q, k_cache, v_cache, table, rows, lens, k_new, v_new, scale = _case(
        9, 3, 64, [3, 700, 90, 0, 2100, 45]
    )
    together = kernel(q, k_cache, v_cache, table, rows, lens, k_new, v_new, scale)
    for b in range(len(rows)):
        one = slice(b, b + 1)
        alone = kernel(
            q[one], k_cache, v_cache, table, rows[one], lens[one], k_new[one], v_new[one], scale
        )
        assert torch.equal(alone[0], together[b])


def test_thread_count_does_not_change_the_result(kernel) -> None:
    args = _case(9, 3, 64, [3, 200, 90, 0, 310, 45, 128])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kernel(*args)
        torch.set_num_threads(2)
        two = kernel(*args)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)


def test_empty_batch(kernel) -> None:
    args = _case(9, 3, 64, [])
    assert kernel(*args).shape == (0, 9, 64)


def test_custom_op_equals_the_direct_call(kernel) -> None:
    """What a compiled graph calls: the same kernel, contiguous copies made where needed."""
    args = list(_case(9, 3, 64, [12, 0, 77]))
    want = kernel(*args)
    assert torch.equal(decode_attention_op(*args), want)
    args[0] = args[0].transpose(1, 2).contiguous().transpose(1, 2)  # q not row-contiguous
    assert torch.equal(decode_attention_op(*args), want)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim", "dtype", "supported"),
    [
        (9, 3, 64, torch.float32, True),
        (32, 8, 128, torch.bfloat16, True),
        (9, 3, 64, torch.float16, False),
        (9, 3, 72, torch.float32, False),  # not a multiple of 16
        (9, 3, 272, torch.float32, False),  # over 256
        (18, 2, 64, torch.float32, False),  # 9 query heads per KV head
        (9, 2, 64, torch.float32, False),  # heads not a multiple of KV heads
    ],
)
def test_supports(heads, kv_heads, head_dim, dtype, supported) -> None:
    assert DecodeAttention.supports(heads, kv_heads, head_dim, dtype) is supported


def test_unsupported_inputs_raise(kernel) -> None:
    q, k_cache, v_cache, table, rows, lens, k_new, v_new, scale = _case(9, 3, 64, [4, 9])
    with pytest.raises(KernelShapeError, match="unsupported dtype"):
        half = [t.half() for t in (q, k_cache, v_cache)]
        kernel(*half, table, rows, lens, k_new.half(), v_new.half(), scale)
    with pytest.raises(KernelShapeError, match="k_cache and v_cache must be contiguous"):
        kernel(q, k_cache[::2], v_cache[::2], table, rows, lens, k_new, v_new, scale)
    with pytest.raises(KernelShapeError, match="k_new must be"):
        kernel(q, k_cache, v_cache, table, rows, lens, k_new[:1], v_new, scale)
    with pytest.raises(KernelShapeError, match="req_to_token must be"):
        kernel(q, k_cache, v_cache, table.int(), rows, lens, k_new, v_new, scale)
    with pytest.raises(KernelShapeError, match=r"rows and prefix_lens must have shape \(2,\)"):
        kernel(q, k_cache, v_cache, table, rows[:1], lens, k_new, v_new, scale)
    with pytest.raises(KernelShapeError, match="q must be contiguous within each row"):
        q_t = q.transpose(1, 2).contiguous().transpose(1, 2)
        kernel(q_t, k_cache, v_cache, table, rows, lens, k_new, v_new, scale)


def test_launch_equals_the_checked_call(kernel) -> None:
    args = _case(9, 3, 64, [5, 0, 301])
    assert torch.equal(kernel.launch(*args), kernel(*args))


def test_check_cache_refuses_what_launch_cannot_take() -> None:
    """What a caller of the unchecked ``launch`` (CpuAttentionBackend) checks once."""
    k, v = torch.zeros(2, 2, 10, 3, 64)
    table = torch.zeros(4, 16, dtype=torch.int64)
    check_cache(k, v, table)  # a whole pool: (layers, slots, Hkv, D)
    check_cache(k[0], v[0], table)  # one layer
    with pytest.raises(KernelShapeError, match="unsupported dtype torch.float16"):
        check_cache(k.half(), v.half(), table)
    with pytest.raises(KernelShapeError, match="must be contiguous"):
        check_cache(k[:, ::2], v[:, ::2], table)
    with pytest.raises(KernelShapeError, match="req_to_token must be"):
        check_cache(k, v, table.int())
    with pytest.raises(KernelShapeError, match="v_cache must be a CPU torch.float32"):
        check_cache(k, v.bfloat16(), table)


# A quantized pool: int8 / fp8 codes with a bfloat16 scale per slot and KV head.


def _quantized_case(
    fmt: str, heads: int, kv_heads: int, head_dim: int, prefix_lens: list[int], dtype, seed=0
) -> tuple:
    """``_case``'s pass over a quantized cache: (args as the kernel takes them, with
    the codes as k_cache/v_cache, then k_scale, v_scale)."""
    gen = torch.Generator().manual_seed(seed)
    num_slots, width = max(prefix_lens) + 300, max(prefix_lens) + 1
    k_codes, k_scale, _ = qkv_cache.quantized_cache(fmt, num_slots, kv_heads, head_dim, gen)
    v_codes, v_scale, _ = qkv_cache.quantized_cache(fmt, num_slots, kv_heads, head_dim, gen)
    table = torch.randint(0, num_slots, (len(prefix_lens) + 2, width), generator=gen)
    rows = torch.randperm(len(prefix_lens) + 2, generator=gen)[: len(prefix_lens)]
    qkv = torch.randn(len(prefix_lens), heads + 2 * kv_heads, head_dim, generator=gen).to(dtype)
    q, k_new, v_new = qkv.split([heads, kv_heads, kv_heads], dim=1)
    lens = torch.tensor(prefix_lens, dtype=torch.int64)
    args = (q, k_codes, v_codes, table, rows, lens, k_new, v_new, head_dim**-0.5)
    return args, k_scale, v_scale


def _truth(args: tuple, k_scale, v_scale, window: int = 0, softcap: float = 0.0):
    q, k_codes, v_codes, table, rows, lens, k_new, v_new, scale = args
    caches = (k_codes, v_codes, k_scale, v_scale)
    return qkv_cache.decode_truth(
        q, caches, table, rows, lens, k_new, v_new, scale, window, softcap
    )


@pytest.mark.parametrize("fmt", qkv_cache.FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim"), [(9, 3, 64), (32, 8, 64), (8, 1, 128), (12, 4, 96)]
)
def test_quantized_cache_matches_float64_attention(
    kernel, fmt, dtype, heads, kv_heads, head_dim
) -> None:
    """Over int8 / fp8 codes and their scales, the kernel is within float32 rounding
    of float64 attention over the dequantized cache: GQA ratios 3, 4, 8 and 1 KV
    head of 8, the specialised head dims and the generic path, rows of 0 to 1,100
    cached tokens (three spans); zero head vectors (scale 0) among the slots."""
    args, k_scale, v_scale = _quantized_case(
        fmt, heads, kv_heads, head_dim, [0, 1, 17, 300, 1100], dtype
    )
    got = kernel(*args, k_scale=k_scale, v_scale=v_scale)
    assert got.dtype == dtype and got.shape == args[0].shape
    qkv_cache.assert_near_truth(got, _truth(args, k_scale, v_scale))


@pytest.mark.parametrize("fmt", qkv_cache.FORMATS)
@pytest.mark.parametrize(("window", "softcap"), [(16, 0.0), (700, 0.0), (0, 5.0), (100, 5.0)])
def test_quantized_cache_window_and_softcap(kernel, fmt, window, softcap) -> None:
    args, k_scale, v_scale = _quantized_case(fmt, 9, 3, 64, [0, 5, 300, 1100], torch.float32, 1)
    got = kernel(*args, window, softcap, k_scale, v_scale)
    qkv_cache.assert_near_truth(got, _truth(args, k_scale, v_scale, window, softcap))


def test_quantized_reference_is_the_float_reference_over_dequantized_values() -> None:
    """decode_attention_reference dequantizes in float32 (code * scale), then
    computes as over a float cache."""
    args, k_scale, v_scale = _quantized_case("fp8_e4m3", 8, 2, 64, [3, 40], torch.float32)
    q, k_codes, v_codes, table, rows, lens, k_new, v_new, scale = args
    k_float = k_codes.float() * k_scale[..., None]
    v_float = v_codes.float() * v_scale[..., None]
    want = decode_attention_reference(q, k_float, v_float, table, rows, lens, k_new, v_new, scale)
    got = decode_attention_reference(*args, k_scale=k_scale, v_scale=v_scale)
    assert torch.equal(got, want)


def test_quantized_custom_op_equals_the_direct_call(kernel) -> None:
    args, k_scale, v_scale = _quantized_case("int8", 9, 3, 64, [0, 20, 600], torch.bfloat16)
    direct = kernel(*args, k_scale=k_scale, v_scale=v_scale)
    q, k_codes, v_codes, table, rows, lens, k_new, v_new, scale = args
    op = decode_attention_codes_op(
        q, k_codes, v_codes, table, rows, lens, k_new, v_new, k_scale, v_scale, scale
    )
    assert torch.equal(op, direct)


def test_quantized_launch_equals_the_checked_call(kernel) -> None:
    args, k_scale, v_scale = _quantized_case("fp8_e5m2", 9, 3, 64, [7, 70], torch.float32)
    checked = kernel(*args, k_scale=k_scale, v_scale=v_scale)
    assert torch.equal(kernel.launch(*args, 0, 0.0, k_scale, v_scale), checked)


def test_quantized_inputs_are_checked(kernel) -> None:
    """Codes need their scales, scales their codes, and scales the codes' shape."""
    args, k_scale, v_scale = _quantized_case("int8", 9, 3, 64, [7], torch.float32)
    q, k_codes, v_codes, table, rows, lens, k_new, v_new, scale = args
    with pytest.raises(KernelShapeError, match="must be a CPU torch.float32"):
        kernel(*args)  # codes without scales
    with pytest.raises(KernelShapeError, match="come together"):
        kernel(*args, k_scale=k_scale)
    with pytest.raises(KernelShapeError, match="k_scale must have shape"):
        kernel(*args, k_scale=k_scale[:-1].contiguous(), v_scale=v_scale)
    with pytest.raises(KernelShapeError, match="k_scale must be a contiguous CPU bfloat16"):
        kernel(*args, k_scale=k_scale.float(), v_scale=v_scale)
    float_cache = (q, k_new.contiguous(), v_new.contiguous(), table, rows, lens, k_new, v_new)
    with pytest.raises(KernelShapeError, match="int8 or fp8 codes"):
        kernel(*float_cache, scale, k_scale=k_scale[: len(k_new)], v_scale=v_scale[: len(k_new)])
    check_cache(k_codes, v_codes, table, k_scale, v_scale)  # a quantized pool passes
    with pytest.raises(KernelShapeError, match="unsupported dtype"):
        check_cache(k_codes, v_codes, table)
