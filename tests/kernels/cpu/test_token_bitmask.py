"""The C++ grammar-mask pass against the plain-torch reference: the same logits, bit
for bit, for words of all ones, all zeros and mixed ones, a vocabulary that ends inside
a word, masked rows in any order among unmasked ones, and strided rows."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels.bitmask import apply_token_bitmask_reference, bitmask_width
from radixlm.kernels.cpu.decode_attention import KernelShapeError
from radixlm.kernels.cpu.native import KernelTarget
from radixlm.kernels.cpu.token_bitmask import TokenBitmaskKernel, load_token_bitmask_kernel
from radixlm.runtime.model_store import cache_root


@pytest.fixture(scope="module")
def kernel(kernel_target: KernelTarget) -> TokenBitmaskKernel:
    return load_token_bitmask_kernel(cache_root() / "kernels", kernel_target)


def _bitmask(rows: int, vocab: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    words = torch.randint(-(2**31), 2**31 - 1, (rows, bitmask_width(vocab)), generator=gen)
    words = words.to(torch.int32)
    words[:, 0::4] = -1  # every token of the word allowed
    words[:, 1::5] = 0  # none
    return words


@pytest.mark.parametrize("vocab", [32, 100, 49152, 49157])
@pytest.mark.parametrize("rows", [None, [3, 0, 5]], ids=["every-row", "some-rows"])
def test_the_kernel_masks_what_the_reference_masks(kernel, vocab, rows) -> None:
    logits = torch.randn(6, vocab, generator=torch.Generator().manual_seed(vocab))
    num_masked = 6 if rows is None else len(rows)
    bitmask = _bitmask(num_masked, vocab, seed=vocab + num_masked)
    indices = None if rows is None else torch.tensor(rows)
    want, got = logits.clone(), logits.clone()
    apply_token_bitmask_reference(want, bitmask, indices)
    kernel.apply(got, bitmask, indices)
    assert torch.equal(got, want)


def test_rows_of_a_wider_tensor_are_masked_in_place(kernel) -> None:
    """Logits rows that are a slice of a wider buffer (row stride > vocab)."""
    buffer = torch.randn(4, 80)
    logits = buffer[:, :64]
    bitmask = _bitmask(2, 64, seed=1)
    want = logits.clone()
    apply_token_bitmask_reference(want, bitmask, torch.tensor([2, 1]))
    kernel.apply(logits, bitmask, torch.tensor([2, 1]))
    assert torch.equal(logits, want)
    assert not torch.isinf(buffer[:, 64:]).any()  # the rest of the buffer untouched


def test_what_the_kernel_cannot_take_is_refused(kernel) -> None:
    bitmask = _bitmask(1, 64, seed=2)
    with pytest.raises(KernelShapeError, match="float32 CPU rows"):
        kernel.apply(torch.zeros(1, 64, dtype=torch.float64), bitmask)
    with pytest.raises(ValueError, match="bitmask"):
        kernel.apply(torch.zeros(1, 96), bitmask)  # a width for another vocabulary
