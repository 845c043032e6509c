"""Continuous batching: which tokens run in the next model pass.

Every step the scheduler
  1. gives each running request that is decoding one new KV slot, retracting
     the most recently admitted requests back to the queue when the pool runs
     short (they keep their output and recompute their KV when readmitted);
  2. spends the rest of the pass's token budget (``chunked_prefill_size``) on
     prompts: the unfinished chunks of running requests and, with up to half
     of it held for them while any wait, new or retracted requests from the
     queue in the ``AdmissionPolicy``'s order, each admitted only if the KV
     budget expects it to fit beside the decode room the running ones need;
  3. packs all of it into one ``ForwardBatch`` (decodes and prefill chunks mixed).

After the pass, ``process_output`` appends sampled tokens, detokenizes, checks
stop conditions, frees the KV of finished requests and caches computed prefills.

Overlap scheduling: ``schedule`` may be called again while the last pass is in
flight (scheduled, its results not yet applied). It then schedules only what does not
need those results on the host: the in-flight pass's sampled tokens are decoded on
the device (``BatchBuilder.build``), prompts are admitted and continued as usual, and a
request whose sampled token certainly ends it (``max_new_tokens``) is left out. When
the next pass would need them (a grammar's mask, a penalty, speculation, a
retraction, a pass run alone after a failure) it returns None: apply the pass in
flight, then schedule again. A request that turns out to have finished in the pass in
flight wastes its row of the next one; its slot there is freed when it finishes
(``Request.num_settled_tokens``), so outputs and the cache are those of serial steps.

The parts it composes, each in its own module::

    Scheduler (queues: waiting, running; a request's status)
      |-- AdmissionPolicy  order of the queue, wait-for-shared-prefix    (policy)
      |-- KVBudget         slots, req_to_token rows, prefix cache         (kv_budget)
      |-- PassPlanner      the pass's token budget: decodes, proposals,  (pass_plan)
      |                    prompt chunks, admissions
      |-- BatchBuilder     WorkItems -> ScheduledBatch / ForwardBatch     (batch_builder)
      |-- OutputProcessor  ModelOutput -> tokens, stops, finishes        (output_processor)
      '-- PassesInFlight   scheduled passes not yet applied (overlap)     (in_flight)

Ownership: the scheduler and these parts are the only code that mutates a
``Request`` once it is queued (on the engine loop thread); callers see
``OutputDelta``s (what changed).
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING

from radixlm.runtime.config import SchedulerConfig, SpeculativeConfig
from radixlm.runtime.constrained import JumpForward, TokenVocabulary
from radixlm.runtime.errors import InvalidRequestError
from radixlm.runtime.executor.forward_batch import ModelOutput
from radixlm.runtime.io.messages import FinishReason, OutputDelta, TokenizedRequest
from radixlm.runtime.mem_cache.kv_pool import ReqToTokenTable, SlotAllocator
from radixlm.runtime.mem_cache.radix_cache import PrefixCache
from radixlm.runtime.scheduling.batch_builder import BatchBuilder, ScheduledBatch, WorkItem
from radixlm.runtime.scheduling.in_flight import PassesInFlight, certainly_finishes, runs_ahead
from radixlm.runtime.scheduling.kv_budget import KVBudget
from radixlm.runtime.scheduling.output_processor import OutputProcessor, deltas
from radixlm.runtime.scheduling.pass_plan import PassPlanner, num_tokens
from radixlm.runtime.scheduling.policy import AdmissionPolicy
from radixlm.runtime.scheduling.request import Request, RequestStatus
from radixlm.runtime.scheduling.stats import SchedulerStats
from radixlm.runtime.speculative.controller import Speculator

if TYPE_CHECKING:
    from radixlm.runtime.speculative.draft import DraftModel

__all__ = ["Scheduler", "ScheduledBatch", "SchedulerStats"]


class Scheduler:
    """The engine's one scheduler.

    Args:
        config: batching limits and the admission policy.
        allocator, req_to_token, cache: the KV pool's bookkeeping (see ``KVBudget``).
        vocab: the vocabulary grammar masks are sized by, and
        jump: the jump-forward planner (both None: no request may carry a grammar).
        speculative: speculative decoding's options (None or off: none), and
        draft: its draft model, for ``speculative="draft"``.
    """

    def __init__(
        self,
        config: SchedulerConfig,
        allocator: SlotAllocator,
        req_to_token: ReqToTokenTable,
        cache: PrefixCache,
        vocab: TokenVocabulary | None = None,
        jump: JumpForward | None = None,
        speculative: SpeculativeConfig | None = None,
        draft: DraftModel | None = None,
    ) -> None:
        self._config = config
        self.vocab = vocab
        self.jump = jump
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.stats = SchedulerStats()
        self._policy = AdmissionPolicy(config, cache)
        self._budget = KVBudget(config, allocator, req_to_token, cache, self.stats)
        self._builder = BatchBuilder(
            self._budget,
            vocab,
            self.stats,
            overlap_masks=config.overlap_grammar_masks,
            mask_threads=config.grammar_mask_threads or 1,  # the engine resolves None
        )
        self.speculator: Speculator | None = None
        if speculative is not None and speculative.enabled:
            self.speculator = Speculator(speculative, cache, draft, jump)
        self._outputs = OutputProcessor(
            self.stats,
            jump,
            retire=self._retire,
            truncate=self._budget.truncate,
            speculator=self.speculator,
        )
        self._admit_counter = 0
        self._plan = PassPlanner(
            config,
            self._budget,
            self._policy,
            self.stats,
            self.speculator,
            (self.waiting, self.running),
            admit=self._admit,
            retract=self._retract,
        )
        # the requests of a failed pass, each to run in a pass of its own next
        self._run_alone: deque[Request] = deque()
        self._in_flight = PassesInFlight()  # scheduled, results not applied yet

    @property
    def config(self) -> SchedulerConfig:
        """Read-only: the parts were built with it (make a new Scheduler to change it)."""
        return self._config

    @property
    def allocator(self) -> SlotAllocator:
        return self._budget.allocator

    @property
    def req_to_token(self) -> ReqToTokenTable:
        return self._budget.req_to_token

    @property
    def cache(self) -> PrefixCache:
        return self._budget.cache

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- queue changes -------------------------------------------------------------

    def add_request(self, tokenized: TokenizedRequest) -> Request:
        """Queues a request; returns its state (read-only outside the scheduler)."""
        req = Request.from_tokenized(tokenized)
        if self.speculator is not None:
            req.spec = self.speculator.new_state(req.prompt_ids, req.params)
        if req.jump_forward and not req.output_ids and req.params.max_new_tokens > 0:
            # text forced from the start, e.g. `{"`
            self._outputs.jump_forward(req, replaceable=False)
        self.stats.num_prompt_tokens += len(req.prompt_ids) * req.log_metrics
        req.queued_at_step = self.stats.num_steps
        self.waiting.append(req)
        return req

    def abort(self, rid: str) -> list[OutputDelta]:
        """Stops a request wherever it is and frees its KV; its final chunk, or none
        if the id is unknown (or the request already finished)."""
        for req in self.waiting:
            if req.rid == rid:
                self.waiting.remove(req)
                self._outputs.finish(req, FinishReason("abort", message="aborted by the caller"))
                return deltas([req])
        for req in self.running:
            if req.rid == rid:
                self._outputs.finish(req, FinishReason("abort", message="aborted by the caller"))
                return deltas([req])
        return []

    def abort_all(self, message: str) -> list[OutputDelta]:
        reqs = list(self.waiting) + list(self.running)
        self.waiting.clear()
        for req in reqs:
            self._outputs.finish(req, FinishReason("abort", message=message))
        return deltas(reqs)

    def flush_cache(self) -> None:
        """Empties the prefix cache. Raises InvalidRequestError while requests are queued."""
        if self.has_work:
            raise InvalidRequestError(
                f"cannot flush the cache while {len(self.running)} requests run and "
                f"{len(self.waiting)} wait"
            )
        self.cache.reset()

    # ---- scheduling ------------------------------------------------------------------

    def schedule(self) -> ScheduledBatch | None:
        """Picks the next pass's tokens; None when there is nothing to run, or, while
        a pass is in flight, when the next one needs its results first (see the
        module docstring). Its tokens count as computed from now on."""
        ahead = bool(self._in_flight)
        assert len(self._in_flight) == ahead, "apply the pass in flight first"
        while self._run_alone:  # after a failed pass: its requests run one by one
            if ahead:
                return None
            suspect = self._run_alone.popleft()
            if not suspect.finished:  # (aborted meanwhile: nothing to run)
                self.stats.num_steps += 1
                return self._in_flight.start(self._builder.build([self._solo_work(suspect)]))
        decodes = self._ahead_decodes() if ahead else self._reserve_decode_slots()
        if decodes is None:
            return None
        work = self._plan.decodes(decodes)
        # prefills whose pass is in flight are not cached yet either
        uncached = self._in_flight.uncached_prefills()
        work += self._plan.prompts(num_tokens(work), uncached)
        if not work and self.running and not ahead:
            # Only unfinished prefills remain and they starve each other of slots:
            # give one's slots back so the others can finish (a lone request always fits).
            self._retract(max(self.running, key=lambda r: r.admit_order))
            return self.schedule()
        if not work:
            return None
        self.stats.num_steps += 1
        self.stats.num_steps_ahead += ahead
        self._budget.decay_new_token_ratio()
        return self._in_flight.start(self._builder.build(work))

    def _ahead_decodes(self) -> list[Request] | None:
        """With a pass in flight: the requests that decode in the next one (those whose
        sampled token certainly ends them left out), or None when one of them needs the
        host to see its token first or the pool is short (a retraction waits for the
        pass in flight)."""
        decodes = [r for r in self.running if r.num_pending_tokens == 1]
        speculating = self.speculator is not None
        if any(r.num_unseen and not runs_ahead(r, speculating) for r in decodes):
            return None
        decodes = [r for r in decodes if not certainly_finishes(r)]
        return decodes if self._budget.available_slots >= len(decodes) else None

    def _solo_work(self, req: Request) -> WorkItem:
        """The request's next tokens, alone in a pass (its chunk as usual)."""
        room = self._budget.available_slots
        n = min(req.num_pending_tokens, self._config.chunked_prefill_size, room)
        return WorkItem(req, req.num_computed_tokens, max(n, 1))

    def _reserve_decode_slots(self) -> list[Request]:
        """Running requests that decode this step; retracts until each has a slot."""
        while True:
            decodes = [r for r in self.running if r.num_pending_tokens == 1]
            if self._budget.available_slots >= len(decodes) or not self.running:
                return decodes
            self._retract(max(self.running, key=lambda r: r.admit_order))
            self._budget.raise_new_token_ratio()

    def _admit(self, req: Request) -> None:
        if req.admitted_at is None:
            req.admitted_at = time.perf_counter()
            if req.log_metrics:
                self.stats.queue.observe(req.admitted_at - req.created_at)
        self._budget.admit(req)
        req.status = RequestStatus.RUNNING
        req.admit_order = self._admit_counter
        self._admit_counter += 1
        self.running.append(req)

    def _retract(self, req: Request) -> None:
        """Returns a running request to the queue front; its KV is recomputed later."""
        self._budget.retract(req)
        if self.speculator is not None:
            self.speculator.release(req)
        req.status = RequestStatus.WAITING
        self.running.remove(req)
        req.queued_at_step = self.stats.num_steps
        self.waiting.appendleft(req)

    def _retire(self, req: Request) -> None:
        """A running request finished: its KV goes to the cache, it leaves ``running``."""
        self._budget.release(req)
        if self.speculator is not None:
            self.speculator.release(req)
        self.running.remove(req)

    # ---- results -----------------------------------------------------------------------

    def process_output(self, batch: ScheduledBatch, output: ModelOutput) -> list[OutputDelta]:
        """Applies a pass's results; returns a chunk for each request with something new
        to report (streaming ones after every token, the others when they finish)."""
        self._in_flight.settle(batch)
        updated = self._outputs.apply(batch, output)
        for w in batch.work:
            if w.num_tokens > 1 and w.proposal is None and not w.req.finished:
                self._budget.cache_computed_prefix(w.req)
        return deltas(updated)

    def observe_pass(self, batch: ScheduledBatch, seconds: float) -> None:
        """A pass's time, from its start (or the end of the pass before it, if later)
        to its results: what paces prompt chunks beside decodes (``target_tpot_ms``;
        without one, nothing reads it)."""
        if self._config.target_tpot_ms is not None:
            self._plan.pace.observe(num_tokens(batch.work), seconds)

    def close(self) -> None:
        """Stops the grammar mask threads (at shutdown, after the last pass)."""
        self._builder.masks.close()

    def fail_batch(self, batch: ScheduledBatch, message: str) -> list[OutputDelta]:
        """A pass raised. If it held one request, that request is failed (its KV and
        this pass's slots freed). Otherwise nobody is blamed yet: the pass is undone
        (its slots freed; nothing it computed was applied) and each of its requests
        then runs alone once, so only a request whose own rows fail is failed."""
        self._in_flight.settle(batch)
        live = [w for w in batch.work if not w.req.finished]
        if len(live) <= 1:
            return deltas(self._outputs.fail(batch, message))
        self._budget.free_pass(batch.forward.attn.out_cache_loc)
        for w in live:  # nothing it computed counts
            w.req.num_computed_tokens = w.start
        self._run_alone.extend(w.req for w in live)
        return []
