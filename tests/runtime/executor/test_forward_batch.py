"""``ForwardBatch.to`` / ``AttentionInputs.to``: the one seam where a pass moves to
the model's device. On the CPU it is free (the same object back); elsewhere every
tensor moves ("meta" stands in for an accelerator here)."""

from __future__ import annotations

import dataclasses

import torch

from radixlm.runtime.attention import AttentionInputs
from radixlm.runtime.executor.forward_batch import ForwardBatch

CPU, META = torch.device("cpu"), torch.device("meta")


def _inputs() -> AttentionInputs:
    return AttentionInputs(
        rows=torch.tensor([0, 1]),
        prefix_lens=torch.tensor([3, 0]),
        extend_lens=torch.tensor([1, 2]),
        out_cache_loc=torch.tensor([4, 5, 6]),
    )


def _batch(grammar: bool) -> ForwardBatch:
    return ForwardBatch(
        input_ids=torch.tensor([11, 12, 13]),
        positions=torch.tensor([3, 0, 1]),
        attn=_inputs(),
        sample_indices=torch.tensor([0, 2]),
        sampling_rows=(),
        return_logprobs=False,
        prompt_logprob_indices=torch.tensor([1]),
        prompt_logprob_targets=torch.tensor([13]),
        prompt_top_k=0,
        grammar_bitmask=torch.zeros(1, 4, dtype=torch.int32) if grammar else None,
        grammar_rows=torch.tensor([1]) if grammar else None,
    )


def _tensors(obj: object) -> dict[str, torch.Tensor]:
    """Every tensor field, the attention inputs' as ``attn.<name>``."""
    found = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, torch.Tensor):
            found[f.name] = value
        elif isinstance(value, AttentionInputs):
            found |= {f"attn.{k}": v for k, v in _tensors(value).items()}
    return found


def test_attention_inputs_stay_put_on_their_device_and_move_elsewhere() -> None:
    inputs = _inputs()
    assert inputs.to(CPU) is inputs
    moved = inputs.to(META)
    assert set(_tensors(moved)) == {"rows", "prefix_lens", "extend_lens", "out_cache_loc"}
    for name, t in _tensors(moved).items():
        assert t.device == META, name
        assert t.shape == getattr(inputs, name).shape and t.dtype == torch.int64


def test_a_batch_on_the_cpu_is_returned_as_is() -> None:
    for grammar in (False, True):
        batch = _batch(grammar)
        assert batch.to(CPU) is batch


def test_a_move_takes_every_tensor_along_and_keeps_the_rest() -> None:
    batch = _batch(grammar=True)
    moved = batch.to(META)
    tensors = _tensors(moved)
    assert set(tensors) == set(_tensors(batch))
    assert {"grammar_bitmask", "grammar_rows", "attn.out_cache_loc"} <= set(tensors)
    for name, t in tensors.items():
        assert t.device == META, name
    assert moved.sampling_rows == batch.sampling_rows and moved.prompt_top_k == 0
    unconstrained = _batch(grammar=False).to(META)
    assert unconstrained.grammar_bitmask is None and unconstrained.grammar_rows is None
    assert unconstrained.input_ids.device == META
