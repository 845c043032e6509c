"""BatchBuilder: a pass's flat layout, its prompt-logprob plan over a chunked prompt,
and the grammar mask of its constrained sampling rows."""

from __future__ import annotations

import pytest
import torch

from radixlm.runtime.config import SchedulerConfig
from radixlm.runtime.io.messages import LogprobSpec
from radixlm.runtime.mem_cache.kv_pool import ReqToTokenTable, SlotAllocator
from radixlm.runtime.mem_cache.radix_cache import DisabledCache
from radixlm.runtime.scheduling.batch_builder import (
    BatchBuilder,
    WorkItem,
    _positions,
    plan_prompt_logprobs,
)
from radixlm.runtime.scheduling.kv_budget import KVBudget
from radixlm.runtime.scheduling.stats import SchedulerStats
from tests.runtime.scheduling.helpers import CountingGrammar, Vocab, request

PROMPT = list(range(100, 110))  # 10 tokens


def test_prompt_logprob_plan_follows_the_chunks_of_a_prompt():
    other = request("other", [7, 8, 9, 10, 11])  # decoding, no logprobs: 1 flat token
    req = request("r", PROMPT, logprob=LogprobSpec(True, start_len=0, top_k=2))
    chunk = [WorkItem(other, 5, 1), WorkItem(req, 4, 4)]  # r's positions 4..7 at flat 1..4
    plan = plan_prompt_logprobs(chunk, ends=[0, 4])
    assert plan.indices == [1, 2, 3, 4]
    assert plan.targets == PROMPT[5:9]  # the logits at p score the token at p + 1
    assert plan.owners == ((req, 5), (req, 6), (req, 7), (req, 8))
    assert plan.top_k == 2
    last = plan_prompt_logprobs([WorkItem(req, 8, 2)], ends=[1])  # positions 8, 9
    assert (last.indices, last.targets, last.owners) == ([0], [PROMPT[9]], ((req, 9),))


def test_prompt_logprob_plan_starts_at_start_len():
    req = request("r", PROMPT, logprob=LogprobSpec(True, start_len=6))
    first = plan_prompt_logprobs([WorkItem(req, 0, 4)], ends=[3])
    assert (first.indices, first.owners, first.top_k) == ([], (), 0)
    second = plan_prompt_logprobs([WorkItem(req, 4, 4)], ends=[3])
    assert second.indices == [1, 2, 3]  # positions 5, 6, 7 predict prompt positions 6, 7, 8
    assert second.targets == PROMPT[6:9]
    off = request("off", PROMPT, logprob=LogprobSpec(True, start_len=10))
    assert plan_prompt_logprobs([WorkItem(off, 0, 10)], ends=[9]).indices == []


@pytest.mark.parametrize("overlap", [True, False])
def test_a_mixed_pass_lays_out_decodes_and_chunks_and_records_its_slots(overlap: bool):
    allocator = SlotAllocator(101)
    stats = SchedulerStats()
    budget = KVBudget(
        SchedulerConfig(), allocator, ReqToTokenTable(4, 64), DisabledCache(allocator.free), stats
    )
    decode, prefill = request("d", [1, 2, 3]), request("p", PROMPT)
    decode.output_ids = [4, 5, 6]
    decode.grammar = CountingGrammar(3)  # type: ignore[assignment]
    for req in (decode, prefill):
        budget.admit(req)
    decode.num_computed_tokens = 5  # its last output token is pending
    builder = BatchBuilder(budget, Vocab(), stats, overlap_masks=overlap)  # type: ignore[arg-type]
    batch = builder.build([WorkItem(decode, 5, 1), WorkItem(prefill, 0, 3)])
    forward = batch.forward
    assert forward.input_ids.tolist() == [6, 100, 101, 102]
    assert forward.positions.tolist() == [5, 0, 1, 2]
    assert forward.attn.extend_lens.tolist() == [1, 3]
    assert forward.sample_indices.tolist() == [0]  # only the decode completes its request
    assert batch.sampled == (decode,)
    assert forward.attn.out_cache_loc.tolist() == [1, 2, 3, 4]  # a fresh pool's first slots
    table = budget.req_to_token.table
    assert (table[0, 5].item(), table[1, :3].tolist()) == (1, [2, 3, 4])
    assert (forward.grammar_ready is not None) == overlap
    assert forward.grammar_rows.tolist() == [0] and forward.grammar_mask().tolist() == [[3, 3]]
    assert len(stats.mask_fill_seconds) == 1 and list(stats.mask_fill_rows) == [1]
    builder.masks.close()


@pytest.mark.parametrize(
    ("prefix_lens", "extend_lens"),
    [([5, 0, 9], [1, 1, 1]), ([5, 0, 9], [1, 3, 2]), ([0], [4]), ([7, 2], [2, 1])],
)
def test_positions_continue_each_request_after_its_prefix(prefix_lens, extend_lens):
    """Decode-only passes (one token each) and mixed ones."""
    expected = [p + j for p, n in zip(prefix_lens, extend_lens) for j in range(n)]
    prefix, extend = torch.tensor(prefix_lens), torch.tensor(extend_lens)
    positions = _positions(prefix, extend)
    assert positions.tolist() == expected and positions.dtype == torch.int64
    positions.add_(100)  # a tensor of its own: the pass's prefix lengths stay as they were
    assert prefix.tolist() == prefix_lens
