"""Token bitmask: the Triton kernel against the reference, the reference against a
plain Python loop over bits, and the packing helpers against each other."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels import (
    allowed_token_ids,
    apply_token_bitmask,
    apply_token_bitmask_reference,
    bitmask_from_allowed,
    bitmask_width,
    unpack_bitmask,
)
from radixlm.kernels.triton import apply_token_bitmask_triton

# Triton runs on CUDA, else on CPU through its interpreter (tests/conftest.py).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NEG_INF = float("-inf")
VOCAB_SIZES = [1, 31, 32, 33, 1000, 4099, 49152]


def pack(allowed: list[list[bool]]) -> torch.Tensor:
    """(R, V) allowed flags -> (R, W) int32 bitmask, one Python int per word."""
    rows = []
    for flags in allowed:
        words = []
        for w in range(bitmask_width(len(flags))):
            word = sum(1 << b for b in range(32) if 32 * w + b < len(flags) and flags[32 * w + b])
            words.append(word - 2**32 if word >= 2**31 else word)  # bit 31 is the sign
        rows.append(words)
    return torch.tensor(rows, dtype=torch.int32).reshape(len(allowed), -1)


def slow_apply(logits: torch.Tensor, bitmask: torch.Tensor, indices: list[int]) -> torch.Tensor:
    """A copy of ``logits`` with -inf where the bit (read one token at a time) is 0."""
    out = logits.clone()
    for r, row in enumerate(indices):
        for t in range(logits.shape[1]):
            if (int(bitmask[r, t // 32]) >> (t % 32)) & 1 == 0:  # Python >> sign-extends
                out[row, t] = NEG_INF
    return out


def random_bitmask(num_rows: int, vocab_size: int, seed: int) -> torch.Tensor:
    """Random words over the whole int32 range (bit 31 set about half the time)."""
    gen = torch.Generator().manual_seed(seed)
    shape = (num_rows, bitmask_width(vocab_size))
    return torch.randint(-(2**31), 2**31, shape, generator=gen, dtype=torch.int64).to(torch.int32)


def both(logits: torch.Tensor, bitmask: torch.Tensor, indices=None):
    """(reference result, Triton result) on copies of ``logits``."""
    ref = logits.clone()
    apply_token_bitmask_reference(ref, bitmask, indices)
    tri = logits.to(DEVICE)
    apply_token_bitmask_triton(tri, bitmask.to(DEVICE), None if indices is None else indices)
    return ref, tri.cpu()


@pytest.mark.parametrize("vocab_size", VOCAB_SIZES)
def test_triton_matches_reference(vocab_size):
    logits = torch.randn(3, vocab_size, generator=torch.Generator().manual_seed(vocab_size))
    ref, tri = both(logits, random_bitmask(3, vocab_size, seed=vocab_size))
    assert torch.equal(ref, tri)


@pytest.mark.parametrize("vocab_size", [1, 31, 33, 100])
def test_reference_matches_bit_by_bit_loop(vocab_size):
    logits = torch.randn(4, vocab_size)
    bitmask = random_bitmask(2, vocab_size, seed=vocab_size)
    indices = torch.tensor([3, 1])
    ref, tri = both(logits, bitmask, indices)
    expected = slow_apply(logits, bitmask, [3, 1])
    assert torch.equal(ref, expected) and torch.equal(tri, expected)


def test_indices_map_bitmask_rows_to_logits_rows_and_leave_others_alone():
    logits = torch.randn(5, 70)
    bitmask = bitmask_from_allowed([[0], [69], [5, 6]], 70)
    ref, tri = both(logits, bitmask, torch.tensor([4, 0, 2]))
    for out in (ref, tri):
        assert allowed_ids(out[4]) == [0] and allowed_ids(out[0]) == [69]
        assert allowed_ids(out[2]) == [5, 6]
        assert torch.equal(out[[1, 3]], logits[[1, 3]])
        assert torch.equal(out[2, [5, 6]], logits[2, [5, 6]])  # allowed logits untouched


def allowed_ids(row: torch.Tensor) -> list[int]:
    return (row > NEG_INF).nonzero().squeeze(1).tolist()


@pytest.mark.parametrize("token", [0, 30, 31, 32, 63, 64])
def test_single_allowed_token_including_the_sign_bit(token):
    bitmask = bitmask_from_allowed([[token]], 65)
    assert (bitmask[0, token // 32] < 0).item() == (token % 32 == 31)
    for out in both(torch.randn(1, 65), bitmask):
        assert allowed_ids(out[0]) == [token]


def test_sign_bit_clear_and_all_other_bits_set():
    bitmask = torch.full((1, 2), 2**31 - 1, dtype=torch.int32)  # bits 0..30 of each word
    for out in both(torch.randn(1, 64), bitmask):
        assert allowed_ids(out[0]) == [t for t in range(64) if t % 32 != 31]


def test_bits_past_the_vocab_are_ignored():
    bitmask = torch.full((1, 2), -1, dtype=torch.int32)  # every bit, even 33..63
    logits = torch.randn(1, 33)
    for out in both(logits, bitmask):
        assert torch.equal(out, logits)


def test_all_and_none_allowed():
    logits = torch.randn(2, 100)
    for out in both(logits, bitmask_from_allowed([range(100), []], 100)):
        assert torch.equal(out[0], logits[0])
        assert bool((out[1] == NEG_INF).all())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_float_dtypes(dtype):
    logits = torch.randn(2, 100).to(dtype)
    ref, tri = both(logits, random_bitmask(2, 100, seed=1))
    assert ref.dtype == dtype and torch.equal(ref, tri)
    assert torch.equal(ref.isinf(), ~unpack_bitmask(random_bitmask(2, 100, seed=1), 100))


def test_reference_on_a_strided_logits_view():
    base = torch.randn(3, 2, 40)
    logits = base[:, 0, :]  # (3, 40), row stride 80
    bitmask = random_bitmask(3, 40, seed=2)
    expected = slow_apply(logits.clone(), bitmask, [0, 1, 2])
    apply_token_bitmask_reference(logits, bitmask)
    assert torch.equal(base[:, 0, :], expected)


def test_dispatch_on_cpu_is_the_reference():
    logits = torch.randn(2, 50)
    bitmask = random_bitmask(2, 50, seed=3)
    out = logits.clone()
    apply_token_bitmask(out, bitmask)
    assert torch.equal(out, slow_apply(logits, bitmask, [0, 1]))


def test_pack_and_unpack_round_trip():
    vocab_size = 1000
    flags = torch.rand(3, vocab_size, generator=torch.Generator().manual_seed(4)) < 0.3
    flags[2] = False
    bitmask = pack(flags.tolist())
    ids = [allowed_token_ids(bitmask[r], vocab_size) for r in range(3)]
    assert torch.equal(unpack_bitmask(bitmask, vocab_size), flags)
    assert [i.tolist() for i in ids] == [f.nonzero().squeeze(1).tolist() for f in flags]
    assert torch.equal(bitmask_from_allowed(ids, vocab_size), bitmask)
    assert torch.equal(
        bitmask_from_allowed([[5, 5, 3]], 40), pack([[t in (3, 5) for t in range(40)]])
    )


@pytest.mark.parametrize(
    "logits, bitmask, indices",
    [
        (torch.zeros(2, 64), torch.zeros(2, 3, dtype=torch.int32), None),  # width
        (torch.zeros(2, 64), torch.zeros(2, 2, dtype=torch.int64), None),  # dtype
        (torch.zeros(2, 64), torch.zeros(3, 2, dtype=torch.int32), None),  # rows
        (torch.zeros(2, 64), torch.zeros(1, 2, dtype=torch.int32), torch.tensor([0, 1])),
        (torch.zeros(64), torch.zeros(1, 2, dtype=torch.int32), None),  # logits dim
        (torch.zeros(2, 64, dtype=torch.int32), torch.zeros(2, 2, dtype=torch.int32), None),
    ],
)
def test_shape_and_dtype_errors(logits, bitmask, indices):
    for apply in (apply_token_bitmask_reference, apply_token_bitmask_triton):
        with pytest.raises(ValueError):
            apply(logits, bitmask, indices)


def test_helper_errors():
    with pytest.raises(ValueError, match=r"\[40\]"):
        bitmask_from_allowed([[1, 40]], 40)
    with pytest.raises(ValueError):
        allowed_token_ids(torch.zeros(1, 2, dtype=torch.int32), 64)
