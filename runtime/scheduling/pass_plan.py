"""How a pass's token budget is spent: decode tokens and the proposals to verify after
them, then prompt chunks and admissions.

Decodes take one token each, and, when speculating, the proposals to verify after it,
within the slots left once every decode has its own and within half the pass's token
budget (speculation is the first thing to shrink when the pool runs short: it never
causes a retraction). Prompts get the rest, but never less than half the budget, and,
under ``target_tpot_ms`` while requests decode, no more than keeps the pass within it
(``PassPace``; ``MIN_PROMPT_TOKENS`` at least). While requests are queued, up to half
of that is held for admitting them (no more than they ask for), and the chunks of
prompts already running get the remainder, so a short request that arrives during a
long prefill starts in the next pass. What the queue does not use goes back to the
running chunks. Queued requests are admitted in the ``AdmissionPolicy``'s order while
tokens and slots remain and the KV budget expects each to fit (``KVBudget.can_admit``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from radixlm.runtime.config import SchedulerConfig
from radixlm.runtime.scheduling.batch_builder import WorkItem
from radixlm.runtime.scheduling.kv_budget import KVBudget
from radixlm.runtime.scheduling.pass_pace import PassPace
from radixlm.runtime.scheduling.policy import AdmissionPolicy
from radixlm.runtime.scheduling.request import Request
from radixlm.runtime.scheduling.stats import SchedulerStats
from radixlm.runtime.speculative.controller import Speculator

__all__ = ["PassPlanner", "num_tokens"]


def num_tokens(work: list[WorkItem]) -> int:
    return sum(w.num_tokens for w in work)


class PassPlanner:
    """Plans one pass's work over the scheduler's queues (see the module docstring).

    Args:
        config: the pass's token budget (``chunked_prefill_size``) and the time per
            output token to keep decodes within (``target_tpot_ms``).
        budget, policy, stats: the scheduler's KV budget, admission order and counters.
        speculator: what proposes tokens to verify (None: no speculation).
        queues: the scheduler's ``waiting`` and ``running`` (read here; changed only
            through ``admit`` and ``retract``, the scheduler's own).
    """

    def __init__(
        self,
        config: SchedulerConfig,
        budget: KVBudget,
        policy: AdmissionPolicy,
        stats: SchedulerStats,
        speculator: Speculator | None,
        queues: tuple[deque[Request], list[Request]],
        admit: Callable[[Request], None],
        retract: Callable[[Request], None],
    ) -> None:
        self._size = config.chunked_prefill_size
        target = config.target_tpot_ms
        self.pace = PassPace(None if target is None else target / 1000)
        self._budget = budget
        self._policy = policy
        self._stats = stats
        self._speculator = speculator
        self._waiting, self._running = queues
        self._admit = admit
        self._retract = retract

    def decodes(self, decodes: list[Request]) -> list[WorkItem]:
        """One token per decoding request, and the proposals to verify after it."""
        work = [WorkItem(r, r.num_computed_tokens, 1) for r in decodes]
        if self._speculator is None or not decodes:
            return work
        room = min(self._budget.available_slots, self._size // 2) - len(decodes)
        if room <= 0:
            return work
        proposals = self._speculator.propose_all(decodes, room)
        return [
            WorkItem(w.req, w.start, 1 + p.num_tokens, p) if p.num_tokens else w
            for w, p in zip(work, proposals)
        ]

    def prompts(self, num_decode_tokens: int, uncached_in_flight: list[Request]) -> list[WorkItem]:
        """The pass's prompt work beside ``num_decode_tokens`` decode tokens (see the
        module docstring). ``uncached_in_flight``: prefills of a pass still in flight,
        whose prefixes the cache does not hold yet either."""
        size = self._size
        budget = max(size - num_decode_tokens, size // 2)
        paced = self.pace.prompt_budget(num_decode_tokens)
        if paced is not None and paced < budget:
            budget = paced
            self._stats.num_paced_passes += 1
        inflight = [r for r in self._running if r.num_pending_tokens > 1]
        held = 0
        if self._waiting:
            held = min(budget // 2, sum(r.num_pending_tokens for r in self._waiting))
        chunks = self._continue_prefills(inflight, budget - held, num_decode_tokens)
        used = num_tokens(chunks)
        admitted: list[WorkItem] = []
        if self._waiting and budget > used:
            uncached = inflight + uncached_in_flight
            admitted = self._admit_waiting(budget - used, num_decode_tokens + used, uncached)
        spare = budget - used - num_tokens(admitted)
        if held and spare > 0:  # the queue took less than it was offered
            chunks = self._continue_prefills(
                inflight, budget - num_tokens(admitted), num_decode_tokens + num_tokens(admitted)
            )
        return chunks + admitted

    def _continue_prefills(
        self, inflight: list[Request], budget: int, num_planned: int
    ) -> list[WorkItem]:
        """The next chunk of each running prefill (``inflight``, in running order)
        within ``budget`` tokens and the slots not yet promised (``num_planned``)."""
        available = self._budget.available_slots  # nothing below changes it
        work: list[WorkItem] = []
        for req in inflight:
            free = available - num_planned
            if budget <= 0 or free <= 0:
                break
            n = min(req.num_pending_tokens, budget, free)
            work.append(WorkItem(req, req.num_computed_tokens, n))
            budget, num_planned = budget - n, num_planned + n
        return work

    def _admit_waiting(
        self, budget: int, num_planned: int, inflight: list[Request]
    ) -> list[WorkItem]:
        """Admits queued requests, in policy order, while tokens and slots remain and
        the KV budget expects each to fit (``KVBudget.can_admit``)."""
        work: list[WorkItem] = []
        kv = self._budget
        reserved = kv.reserved_need(self._running)  # kept up to date as requests start
        # nothing in the round inserts into or evicts from the cache (a retraction ends it)
        policy = self._policy.start_round(inflight)
        for req in policy.order(self._waiting, self._stats.num_steps):
            if budget <= 0 or not kv.can_admit(req, len(self._running), reserved, num_planned):
                break
            if policy.waits_for_shared_prefix(req):
                continue  # admitted once the shared part is cached (after this pass)
            self._waiting.remove(req)
            self._admit(req)  # locks its cached prefix: recount what is free after it
            n = min(req.num_pending_tokens, budget, kv.available_slots - num_planned)
            if n <= 0:  # its cached prefix was all that was left to evict
                self._retract(req)
                break
            work.append(WorkItem(req, req.num_computed_tokens, n))
            budget, num_planned = budget - n, num_planned + n
            reserved += kv.future_need(req)
            policy.add_inflight(req)
        return work
