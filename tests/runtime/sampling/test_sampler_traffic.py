"""A sampling step's device traffic does not grow with its rows.

``count_traffic`` counts what a step would copy to a GPU and wait for there (on the
CPU every crossing takes the path it takes on a GPU). A staged step sends its plan
(row order, parameters, penalty entries) in one copy; it reads back only whether the
top-256 candidates hold the nucleus of its top_p rows (one wait). The fused step
(``masked_sample``) sends its per-row arguments in one copy and reads nothing back.
The caller's ``to_host`` of the sampled ids is not part of a step.
"""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels.bitmask import bitmask_from_allowed
from radixlm.runtime.device import DeviceTraffic, count_traffic
from radixlm.runtime.io.sampling_params import SamplingParams
from radixlm.runtime.sampling.sampler import Sampler, SamplingRow

VOCAB = 1000  # above the 256 candidates a top_p row looks at before sorting all V

NOTHING = DeviceTraffic()
ONE_COPY = DeviceTraffic(copies_to_device=1)
ONE_COPY_ONE_WAIT = DeviceTraffic(copies_to_device=1, copies_to_host=1, syncs=1)


def sampling_row(params: dict) -> SamplingRow:
    return SamplingRow(SamplingParams(**params), [1, 2, 3, 2], frozenset({0}), [5, 6, 7])


def peaked(num_rows: int) -> torch.Tensor:
    """Logits whose nucleus lies in the top 256 candidates."""
    logits = torch.randn(num_rows, VOCAB, generator=torch.Generator().manual_seed(0))
    logits[:, 10:20] += 20.0
    return logits


def flat(num_rows: int) -> torch.Tensor:
    """The last row and every other one before it flat (a 0.9-nucleus of 900 tokens,
    beyond the candidates), the others peaked: both parts of the top_p split."""
    logits = peaked(num_rows)
    logits[(num_rows - 1) % 2 :: 2] = 0.0
    return logits


STAGED = {
    "greedy": ({"temperature": 0}, peaked, NOTHING),
    "plain": ({}, peaked, ONE_COPY),
    "top_k": ({"top_k": 20, "temperature": 0.7}, peaked, ONE_COPY),
    "top_p": ({"top_p": 0.9}, peaked, ONE_COPY_ONE_WAIT),
    "top_p_beyond_the_candidates": ({"top_p": 0.9}, flat, ONE_COPY_ONE_WAIT),
    "min_p": ({"min_p": 0.1}, peaked, ONE_COPY),
    "penalised": (
        {
            "repetition_penalty": 1.2,
            "frequency_penalty": 0.3,
            "presence_penalty": 0.1,
            "min_new_tokens": 10,
        },
        peaked,
        ONE_COPY,
    ),
    "seeded": ({"seed": 5, "temperature": 0.8}, peaked, ONE_COPY),
    "seeded_top_p": ({"seed": 5, "top_p": 0.9}, flat, ONE_COPY_ONE_WAIT),
    "seeded_top_k_min_p": ({"seed": 5, "top_k": 30, "min_p": 0.05}, peaked, ONE_COPY),
}


def step(sampler: Sampler, logits: torch.Tensor, rows: list[SamplingRow], **kw) -> DeviceTraffic:
    with count_traffic() as seen:
        sampler.sample(logits, rows, False, **kw)
    return seen


@pytest.mark.parametrize("num_rows", [1, 64])
@pytest.mark.parametrize("case", list(STAGED))
def test_a_staged_step_copies_once_and_waits_only_for_top_p(case: str, num_rows: int) -> None:
    params, logits, expected = STAGED[case]
    rows = [sampling_row(params)] * num_rows
    assert step(Sampler(VOCAB, fused=False), logits(num_rows), rows) == expected


@pytest.mark.parametrize("num_rows", [len(STAGED), 64])
def test_a_mixed_batch_with_grammar_and_logprobs_copies_once(num_rows: int) -> None:
    """Every kind of row in one batch, some constrained: the plan's row order, the
    parameters and the penalties still cross together; the mask and its rows are on
    the device already (the batch moved them)."""
    kinds = list(STAGED.values())
    rows = [sampling_row(kinds[i % len(kinds)][0]) for i in range(num_rows)]
    constrained = torch.arange(0, num_rows, 2)
    bitmask = bitmask_from_allowed([list(range(0, VOCAB, 3))] * len(constrained), VOCAB)
    with count_traffic() as seen:
        Sampler(VOCAB, fused=False).sample(
            flat(num_rows), rows, True, grammar_bitmask=bitmask, grammar_rows=constrained
        )
    assert seen == ONE_COPY_ONE_WAIT


FUSED = {
    "plain": {},
    "top_k_top_p": {"top_k": 20, "top_p": 0.9, "temperature": 0.7},
    "penalised": {"repetition_penalty": 1.2, "presence_penalty": 0.1, "min_new_tokens": 10},
    "min_p": {"min_p": 0.1},
    "seeded": {"seed": 5, "top_k": 30, "min_p": 0.05},
}


@pytest.mark.parametrize("num_rows", [1, 64])
@pytest.mark.parametrize("case", list(FUSED))
def test_a_fused_step_copies_once_and_never_waits(case: str, num_rows: int) -> None:
    rows = [sampling_row(FUSED[case])] * num_rows
    bitmask = bitmask_from_allowed([list(range(0, VOCAB, 2))] * num_rows, VOCAB)
    seen = step(Sampler(VOCAB, fused=True), flat(num_rows), rows, grammar_bitmask=bitmask)
    assert seen == ONE_COPY
