"""Turns the scheduler's choice of work into one model pass: a ``ScheduledBatch``
around the ``ForwardBatch`` the runner reads.

Ownership: reads requests, never mutates them. Its only side effects are the
pass's KV slots (through ``KVBudget.allocate_pass``) and the grammar matchers'
bitmask fills, which ``MaskWorker`` starts here and may finish while the model runs
(``GrammarMatcher.fill_bitmask`` writes the mask, not the matcher).

Flat token layout of a pass (B requests, T tokens)::

    work:        [ decode a | decode b | chunk of c ........ | prompt of d ... ]
    extend_lens:     1          1         n_c                  n_d
    ends:            0          1         1 + n_c              1 + n_c + n_d   (last flat index)
    sample_indices: ends of the items that complete their request (they sample)

With overlap scheduling a decode may run on a token the pass in flight samples
(it carries its token): its input id is a placeholder the runner fills on the device
(``ForwardBatch.carried_positions`` / ``carried_rows``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from radixlm.runtime.attention import AttentionInputs
from radixlm.runtime.constrained import TokenVocabulary
from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.scheduling.kv_budget import KVBudget
from radixlm.runtime.scheduling.mask_worker import MaskWorker
from radixlm.runtime.scheduling.request import Request
from radixlm.runtime.scheduling.stats import SchedulerStats
from radixlm.runtime.speculative.ngram import Proposal

__all__ = [
    "BatchBuilder",
    "PromptLogprobPlan",
    "ScheduledBatch",
    "WorkItem",
    "plan_prompt_logprobs",
]


class WorkItem(NamedTuple):
    """One request's share of a pass: tokens [start, start + num_tokens) of all_ids,
    or, for a decode with a speculative ``proposal``, its pending token and the K
    proposed ones after it (num_tokens = 1 + K; verified after the pass). A tuple:
    one is made per request per pass."""

    req: Request
    start: int
    num_tokens: int
    proposal: Proposal | None = None

    @property
    def num_proposed(self) -> int:
        return 0 if self.proposal is None else self.proposal.num_tokens


@dataclass(frozen=True, eq=False)  # one pass is equal to itself only
class ScheduledBatch:
    """A ForwardBatch plus the scheduler's own record of whose tokens it holds."""

    forward: ForwardBatch
    work: tuple[WorkItem, ...]
    sampled: tuple[Request, ...]
    # (request, prompt position) of each entry of forward.prompt_logprob_indices
    prompt_logprob_owners: tuple[tuple[Request, int], ...]
    # the requests whose input token the pass carries from the one before it
    carried: tuple[Request, ...] = ()


@dataclass(frozen=True)
class PromptLogprobPlan:
    """Which flat tokens' logits give wanted prompt logprobs (P entries each).

    indices: flat index in the pass of the token whose logits are read.
    targets: the prompt token those logits must score (the next one).
    owners: (request, prompt position of the target) to file each result under.
    top_k: alternatives per position, the most any owner wants.
    """

    indices: list[int]
    targets: list[int]
    owners: tuple[tuple[Request, int], ...]
    top_k: int


class BatchBuilder:
    """Builds each pass's ``ScheduledBatch``; allocates its slots from ``budget``;
    ``overlap_masks``: grammar masks are filled while the model runs (``MaskWorker``),
    by ``mask_threads`` threads."""

    def __init__(
        self,
        budget: KVBudget,
        vocab: TokenVocabulary | None,
        stats: SchedulerStats,
        overlap_masks: bool = True,
        mask_threads: int = 1,
    ) -> None:
        self._budget = budget
        self.masks = MaskWorker(vocab, stats, overlap_masks, mask_threads)

    def build(self, work: list[WorkItem]) -> ScheduledBatch:
        """The pass computing ``work`` (non-empty; it fits in the KV budget)."""
        num_tokens: list[int] = []
        input_ids: list[int] = []
        carried: list[Request] = []
        carried_positions: list[int] = []
        sampling: list[int] = []  # the items that sample (their index in ``work``)
        for i, w in enumerate(work):  # one walk: this runs for every request, every step
            req, start, n = w.req, w.start, w.num_tokens
            num_tokens.append(n)
            total, proposal = req.num_total_tokens, w.proposal
            end = start + n - (0 if proposal is None else proposal.num_tokens)
            if end == total + req.num_unseen:  # its last pending token: it samples
                sampling.append(i)
            if start >= total:  # it carries an unseen token: a placeholder, filled on the device
                assert n == 1 and req.sample_index >= 0
                carried.append(req)
                carried_positions.append(len(input_ids))
                input_ids.append(0)
                continue
            input_ids += _token_slice(req, start, end)
            if proposal is not None:
                input_ids += proposal.token_ids
        extend_lens = torch.tensor(num_tokens, dtype=torch.int64)
        prefix_lens = torch.tensor([w.start for w in work], dtype=torch.int64)
        rows = torch.tensor([w.req.row for w in work], dtype=torch.int64)
        positions = _positions(prefix_lens, extend_lens)
        slots = self._budget.allocate_pass(rows, extend_lens, positions)
        ends = torch.cumsum(extend_lens, 0) - 1
        sampled = [work[i].req for i in sampling]
        proposals = draft_probs = None
        if any(w.num_proposed for w in work):  # every position of each verify block
            items = [work[i] for i in sampling]
            proposals = tuple(w.proposal.token_ids if w.proposal else () for w in items)
            draft_probs = tuple(w.proposal.draft_probs if w.proposal else None for w in items)
            ends_list = ends.tolist()
            sample_indices = torch.tensor(
                [
                    p
                    for i in sampling
                    for p in range(ends_list[i] - work[i].num_proposed, ends_list[i] + 1)
                ],
                dtype=torch.int64,
            )
        else:
            sample_indices = ends[sampling]
        plan = plan_prompt_logprobs(work, ends.tolist())
        # the last use of the matchers before sampling
        mask = self.masks.start(sampled, proposals)
        forward = ForwardBatch(
            input_ids=torch.tensor(input_ids, dtype=torch.int64),
            positions=positions,
            attn=AttentionInputs(rows, prefix_lens, extend_lens, slots, max(num_tokens)),
            sample_indices=sample_indices,
            sampling_rows=tuple(req.sampling_row() for req in sampled),
            return_logprobs=any(req.logprob.enabled for req in sampled),
            prompt_logprob_indices=torch.tensor(plan.indices, dtype=torch.int64),
            prompt_logprob_targets=torch.tensor(plan.targets, dtype=torch.int64),
            prompt_top_k=plan.top_k,
            grammar_bitmask=mask.bitmask if mask is not None else None,
            grammar_rows=mask.rows if mask is not None else None,
            grammar_ready=mask.wait if mask is not None else None,
            proposals=proposals,
            draft_probs=draft_probs,
            carried_positions=_index_tensor(carried_positions),
            carried_rows=_index_tensor([req.sample_index for req in carried]),
        )
        return ScheduledBatch(forward, tuple(work), tuple(sampled), plan.owners, tuple(carried))


def plan_prompt_logprobs(work: Sequence[WorkItem], ends: Sequence[int]) -> PromptLogprobPlan:
    """Which flat tokens' logits give the wanted prompt logprobs of a pass.

    The logits at position p predict the token at p + 1; a request wants
    predictions for prompt positions q in [max(start_len, 1), num_prompt), so a
    chunk [start, start + n) contributes the p in [start, start + n) with
    max(start_len, 1) - 1 <= p < num_prompt - 1::

        prompt:  t0 t1 t2 t3 t4 t5     chunk = positions [2, 5), start_len = 0
        p:             2  3  4         logits at p score target t(p+1): t3 t4 t5

    Args:
        work: the pass's items, in flat order.
        ends: flat index of each item's last token.
    """
    indices, targets, owners, top_k = [], [], [], 0
    for w, end in zip(work, ends):
        req = w.req
        if not req.logprob.enabled or req.logprob.start_len >= len(req.prompt_ids):
            continue
        first = max(w.start, max(req.logprob.start_len, 1) - 1)
        last = min(w.start + w.num_tokens, len(req.prompt_ids) - 1)
        flat_start = end - w.num_tokens + 1
        for p in range(first, last):
            indices.append(flat_start + p - w.start)
            targets.append(req.prompt_ids[p + 1])
            owners.append((req, p + 1))
        top_k = max(top_k, req.logprob.top_k)
    return PromptLogprobPlan(indices, targets, tuple(owners), top_k)


def _positions(prefix_lens: torch.Tensor, extend_lens: torch.Tensor) -> torch.Tensor:
    """(T,) absolute position of every new token: prefix_len + offset within its request."""
    if int(extend_lens.max()) == 1:  # a decode-only pass: one token per request
        return prefix_lens.clone()
    starts = torch.cumsum(extend_lens, 0) - extend_lens
    offsets = torch.arange(int(extend_lens.sum())) - torch.repeat_interleave(starts, extend_lens)
    return torch.repeat_interleave(prefix_lens, extend_lens) + offsets


def _index_tensor(indices: list[int]) -> torch.Tensor | None:
    return torch.tensor(indices, dtype=torch.int64) if indices else None


def _token_slice(req: Request, start: int, end: int) -> list[int]:
    num_prompt = len(req.prompt_ids)
    if start >= num_prompt:
        return req.output_ids[start - num_prompt : end - num_prompt]
    return req.prompt_ids[start:end] + req.output_ids[: max(0, end - num_prompt)]
