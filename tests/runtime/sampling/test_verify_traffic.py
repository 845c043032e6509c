"""A verify step's device traffic does not grow with its rows.

One wait per step: the host learns every row's emitted tokens in one ``to_host``
(the sampler's draws for deterministic proposals, and the accepted counts and last
tokens of drafted rows), plus the sampler's one top_p read-back where rows use
top_p. Copies: the step's index lists (one, when rows are split by how they are
verified or drafted rows need their positions), the sampler's plan (one, when it
samples), the target distributions' plan (one, with drafted rows) and the emitted
positions for logprobs (one, when asked).
"""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels.bitmask import bitmask_from_allowed
from radixlm.runtime.device import DeviceTraffic, count_traffic
from radixlm.runtime.io.sampling_params import SamplingParams
from radixlm.runtime.sampling.sampler import Sampler, SamplingRow
from radixlm.runtime.sampling.verify import Verifier, VerifyRow

VOCAB = 1000
PROPOSAL = [10, 11, 12]


def verify_row(params: dict, drafted: bool, seed: int = 0) -> VerifyRow:
    sampling = SamplingRow(SamplingParams(**params), [1, 2], frozenset({0}), [5, 6])
    g = torch.Generator().manual_seed(seed)
    q = torch.softmax(torch.randn(len(PROPOSAL), VOCAB, generator=g), dim=-1) if drafted else None
    return VerifyRow(sampling, PROPOSAL, q)


def logits_for(rows: list[VerifyRow]) -> torch.Tensor:
    """Peaked logits (each nucleus within the top 256) favouring the proposals."""
    num_positions = sum(r.num_positions for r in rows)
    logits = torch.randn(num_positions, VOCAB, generator=torch.Generator().manual_seed(1))
    logits[:, 10:13] += 12.0
    return logits


def waits(syncs: int, reads: int, copies: int) -> DeviceTraffic:
    return DeviceTraffic(copies_to_device=copies, copies_to_host=reads, syncs=syncs)


CASES = {
    # deterministic proposals: the sampler draws at every position
    "greedy": ({"temperature": 0}, False, waits(1, 1, copies=0)),
    "sampled": ({"temperature": 0.8}, False, waits(1, 1, copies=1)),
    "top_p": ({"top_p": 0.9}, False, waits(2, 2, copies=1)),
    "seeded_min_p": ({"seed": 3, "min_p": 0.05}, False, waits(1, 1, copies=1)),
    # a draft's distributions: rejection sampling at every position on the device
    "drafted": ({"temperature": 0.8}, True, waits(1, 2, copies=2)),
    "drafted_top_k": ({"top_k": 40, "repetition_penalty": 1.1}, True, waits(1, 2, copies=2)),
    "drafted_seeded": ({"seed": 3, "top_p": 0.9}, True, waits(1, 2, copies=2)),
    "drafted_greedy": ({"temperature": 0}, True, waits(1, 1, copies=0)),  # verified directly
}


@pytest.mark.parametrize("num_rows", [1, 32])
@pytest.mark.parametrize("case", list(CASES))
def test_a_verify_step_waits_once_whatever_its_rows(case: str, num_rows: int) -> None:
    params, drafted, expected = CASES[case]
    rows = [verify_row(params, drafted, seed=i) for i in range(num_rows)]
    logits = logits_for(rows)
    with count_traffic() as seen:
        out = Verifier(Sampler(VOCAB), seed=0).verify(logits, rows)
    assert seen == expected
    assert all(1 <= len(ids) <= len(PROPOSAL) + 1 for ids in out.token_ids)


@pytest.mark.parametrize("num_rows", [3, 32])
def test_a_mixed_step_with_grammar_and_logprobs(num_rows: int) -> None:
    """Direct, drafted and seeded drafted rows side by side, every position under a
    grammar mask (on the device already): 4 copies (index lists, the sampler's plan,
    the target plan, the emitted positions), 3 results read back in one wait."""
    kinds = [({"temperature": 0.8}, False), ({"temperature": 0.8}, True), ({"seed": 9}, True)]
    rows = [verify_row(*kinds[i % 3], seed=i) for i in range(num_rows)]
    logits = logits_for(rows)
    allowed = [list(range(0, 500))] * len(logits)
    with count_traffic() as seen:
        out = Verifier(Sampler(VOCAB), seed=0).verify(
            logits, rows, True, bitmask_from_allowed(allowed, VOCAB)
        )
    assert seen == waits(1, 3, copies=4)
    assert out.logprobs is not None


def test_counting_takes_the_devices_path_to_the_same_tokens() -> None:
    """On a CPU engine a seeded drafted row races only where it stops (its m is a host
    tensor); counted, it races at every position as on a device: the same tokens."""
    kinds = [({"seed": 3, "top_p": 0.9}, True), ({"temperature": 0.8}, True), ({}, False)]
    rows = [verify_row(*kinds[i % 3], seed=i) for i in range(12)]
    logits = logits_for(rows)
    plain = Verifier(Sampler(VOCAB), seed=0).verify(logits, rows, True)
    with count_traffic():
        counted = Verifier(Sampler(VOCAB), seed=0).verify(logits, rows, True)
    assert counted.token_ids == plain.token_ids
    assert plain.logprobs is not None and counted.logprobs is not None
    assert torch.equal(counted.logprobs.logprobs, plain.logprobs.logprobs)
