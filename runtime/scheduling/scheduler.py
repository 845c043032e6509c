"""Continuous batching: which tokens run in the next model pass.

Every step the scheduler
  1. gives each running request that is decoding one new KV slot, retracting
     the most recently admitted requests back to the queue when the pool runs
     short (they keep their output and recompute their KV when readmitted);
  2. spends up to ``chunked_prefill_size`` tokens on prompts: first the
     unfinished chunk of a running request, then new or retracted requests
     from the queue, FCFS;
  3. packs all of it into one ``ForwardBatch`` (decodes and prefill chunks mixed).

After the pass, ``process_output`` appends sampled tokens, detokenizes, checks
stop conditions and frees the KV of finished requests. The scheduler is the
only code that mutates a ``Request`` once it is queued, and the only caller of
the slot allocator.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import torch

from radixlm.runtime.attention.backends import AttentionInputs
from radixlm.runtime.config import SchedulerConfig
from radixlm.runtime.constrained import JumpForward, TokenVocabulary
from radixlm.runtime.errors import InvalidRequestError
from radixlm.runtime.executor.forward_batch import ForwardBatch, ModelOutput
from radixlm.runtime.io.messages import FinishReason, StreamChunk, TokenizedRequest
from radixlm.runtime.mem_cache.kv_pool import ReqToTokenTable, SlotAllocator
from radixlm.runtime.mem_cache.radix_cache import PrefixCache
from radixlm.runtime.sampling.sampler import SamplingRow
from radixlm.runtime.scheduling.request import Request, RequestStatus

__all__ = ["Scheduler", "ScheduledBatch", "SchedulerStats"]

# A queued request waits for an in-flight prefill that shares at least this many
# uncached tokens with it; shorter overlaps are cheaper to recompute than to wait for.
_SHARED_PREFIX_MIN_TOKENS = 32


@dataclass(frozen=True)
class _Work:
    """One request's share of a pass: tokens [start, start + num_tokens) of all_ids."""

    req: Request
    start: int
    num_tokens: int

    @property
    def samples(self) -> bool:
        return self.start + self.num_tokens == self.req.num_total_tokens


@dataclass(frozen=True)
class ScheduledBatch:
    """A ForwardBatch plus the scheduler's own record of whose tokens it holds."""

    forward: ForwardBatch
    work: tuple[_Work, ...]
    sampled: tuple[Request, ...]
    # (request, prompt position) of each entry of forward.prompt_logprob_indices
    prompt_logprob_owners: tuple[tuple[Request, int], ...]


@dataclass
class SchedulerStats:
    num_steps: int = 0
    num_retractions: int = 0
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at admission
    num_generated_tokens: int = 0
    num_finished: int = 0
    num_jump_forward_tokens: int = 0  # output tokens appended by jump-forward, not decoded
    # seconds spent filling grammar bitmasks, one entry per pass that had any (recent ones)
    mask_fill_seconds: deque[float] = field(default_factory=lambda: deque(maxlen=4096))


@dataclass
class Scheduler:
    config: SchedulerConfig
    allocator: SlotAllocator
    req_to_token: ReqToTokenTable
    cache: PrefixCache
    # constrained decoding: the vocabulary masks are sized by, and the jump-forward
    # planner (None: no request may carry a grammar)
    vocab: TokenVocabulary | None = None
    jump: JumpForward | None = None
    waiting: deque[Request] = field(default_factory=deque)
    running: list[Request] = field(default_factory=list)
    stats: SchedulerStats = field(default_factory=SchedulerStats)
    _admit_counter: int = 0

    # ---- queue changes -------------------------------------------------------------

    def add_request(self, tokenized: TokenizedRequest) -> Request:
        """Queues a request; returns its state (read-only outside the scheduler)."""
        req = Request.from_tokenized(tokenized)
        if req.jump_forward and not req.output_ids:
            self._jump_forward(req, replaceable=False)  # text forced from the start, e.g. `{"`
        self.stats.num_prompt_tokens += len(req.prompt_ids)
        req.queued_at_step = self.stats.num_steps
        self.waiting.append(req)
        return req

    def abort(self, rid: str) -> list[StreamChunk]:
        """Stops a request wherever it is and frees its KV; its final chunk, or none
        if the id is unknown (or the request already finished)."""
        for req in self.waiting:
            if req.rid == rid:
                self.waiting.remove(req)
                self._finish(req, FinishReason("abort", message="aborted by the caller"))
                return _chunks([req])
        for req in self.running:
            if req.rid == rid:
                self._finish(req, FinishReason("abort", message="aborted by the caller"))
                return _chunks([req])
        return []

    def abort_all(self, message: str) -> list[StreamChunk]:
        reqs = list(self.waiting) + list(self.running)
        self.waiting.clear()
        for req in reqs:
            self._finish(req, FinishReason("abort", message=message))
        return _chunks(reqs)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- scheduling ------------------------------------------------------------------

    def schedule(self) -> ScheduledBatch | None:
        """Picks the next pass's tokens; None when there is nothing to run."""
        decodes = self._reserve_decode_slots()
        work = [_Work(r, r.num_computed_tokens, 1) for r in decodes]
        work += self._schedule_prefill(num_decode_tokens=len(work))
        if not work and self.running:
            # Only unfinished prefills remain and they starve each other of slots:
            # give one's slots back so the others can finish (a lone request always fits).
            self._retract(max(self.running, key=lambda r: r.admit_order))
            return self.schedule()
        if not work:
            return None
        self.stats.num_steps += 1
        return self._build_batch(work)

    def _reserve_decode_slots(self) -> list[Request]:
        """Running requests that decode this step; retracts until each has a slot."""
        while True:
            decodes = [r for r in self.running if r.num_pending_tokens == 1]
            if self._available_slots() >= len(decodes) or not self.running:
                return decodes
            self._retract(max(self.running, key=lambda r: r.admit_order))

    def _schedule_prefill(self, num_decode_tokens: int) -> list[_Work]:
        budget = self.config.chunked_prefill_size
        planned = num_decode_tokens
        work: list[_Work] = []
        for req in self.running:
            free = self._available_slots() - planned
            if req.num_pending_tokens > 1 and budget > 0 and free > 0:
                n = min(req.num_pending_tokens, budget, free)
                work.append(_Work(req, req.num_computed_tokens, n))
                budget, planned = budget - n, planned + n
        if not self.waiting or budget <= 0:
            return work
        inflight = [r for r in self.running if r.num_pending_tokens > 1]
        for req in self._admission_order():
            if budget <= 0 or not self._can_admit(self._available_slots() - planned, planned):
                break
            if self._shares_uncached_prefix(req, inflight):
                continue  # admitted once the shared part is cached (after this pass)
            self.waiting.remove(req)
            self._admit(req)  # locks its cached prefix: recount what is free after it
            free = self._available_slots() - planned
            n = min(req.num_pending_tokens, budget, free)
            if n <= 0:  # its cached prefix was all that was left to evict
                self._retract(req)
                break
            work.append(_Work(req, req.num_computed_tokens, n))
            budget, planned = budget - n, planned + n
            inflight.append(req)
        return work

    def _admission_order(self) -> list[Request]:
        """FCFS, or longest cached prefix first ("lpm") with requests that waited more
        than ``lpm_max_wait_steps`` steps first of all (FCFS among themselves).

        lpm looks every queued request up in the tree, so past
        ``lpm_max_queue_len`` queued requests it falls back to FCFS."""
        queue = list(self.waiting)
        config = self.config
        if config.schedule_policy == "fcfs" or len(queue) > config.lpm_max_queue_len:
            return queue
        now = self.stats.num_steps

        def key(item: tuple[int, Request]) -> tuple[bool, int, int]:
            arrival, req = item
            starving = now - req.queued_at_step > config.lpm_max_wait_steps
            return (not starving, 0 if starving else -self.cache.match_len(req.all_ids), arrival)

        return [req for _, req in sorted(enumerate(queue), key=key)]

    def _shares_uncached_prefix(self, req: Request, inflight: list[Request]) -> bool:
        """Whether ``req`` shares a long prefix, not yet cached, with a prefill in
        progress: then it waits a pass and reuses it instead of computing it again."""
        if not self.cache.shares_prefixes or not inflight:
            return False
        ids = req.all_ids
        cached = self.cache.match_len(ids)
        for other in inflight:
            other_ids = other.all_ids
            if _common_prefix_len(ids, other_ids) - cached >= _SHARED_PREFIX_MIN_TOKENS:
                return True
        return False

    def _available_slots(self) -> int:
        """Free slots plus those the prefix cache can evict on demand."""
        return self.allocator.num_free + self.cache.evictable_size

    def _allocate(self, num_tokens: int) -> torch.Tensor:
        shortfall = num_tokens - self.allocator.num_free
        if shortfall > 0:
            self.cache.evict(shortfall)
        slots = self.allocator.allocate(num_tokens)
        assert slots is not None  # schedule() only plans work that fits
        return slots

    def _can_admit(self, free_slots: int, num_busy: int) -> bool:
        if self.req_to_token.num_free_rows == 0:
            return False
        if len(self.running) >= self.config.max_running_requests:
            return False
        if not self.running and num_busy == 0:
            return free_slots > 0  # an idle engine always makes progress
        # Keep some decode room for everyone already running, so that admitting
        # one more request does not immediately force a retraction.
        reserve = self.config.retract_decode_steps * (len(self.running) + 1)
        return free_slots > reserve

    def _admit(self, req: Request) -> None:
        row = self.req_to_token.allocate_row()
        assert row is not None  # _can_admit checked
        req.row = row
        match = self.cache.match_prefix(req.all_ids[: self._reusable_prefix_len(req)])
        self.cache.lock(match.last_node)
        req.prefix_node = match.last_node
        self.req_to_token.write(row, 0, match.slots)
        req.num_computed_tokens = match.num_tokens
        if req.num_retractions == 0:
            req.num_cached_tokens = match.num_tokens
            self.stats.num_cached_tokens += match.num_tokens
        req.status = RequestStatus.RUNNING
        req.admit_order = self._admit_counter
        self._admit_counter += 1
        self.running.append(req)

    @staticmethod
    def _reusable_prefix_len(req: Request) -> int:
        """How much of a request may come from the cache: all but the last token (a
        pass must produce logits to sample from), and nothing from the first prompt
        position whose logprob is wanted on (those logits must be computed)."""
        limit = req.num_total_tokens - 1
        wanted = req.logprob
        if wanted.enabled and wanted.start_len < len(req.prompt_ids):
            limit = min(limit, max(wanted.start_len, 1) - 1)
        return limit

    def _retract(self, req: Request) -> None:
        """Returns a running request to the queue front; its KV is recomputed later."""
        self._release_kv(req)
        req.status = RequestStatus.WAITING
        req.num_retractions += 1
        self.stats.num_retractions += 1
        self.running.remove(req)
        req.queued_at_step = self.stats.num_steps
        self.waiting.appendleft(req)

    # ---- batch building --------------------------------------------------------------

    def _build_batch(self, work: list[_Work]) -> ScheduledBatch:
        extend_lens = torch.tensor([w.num_tokens for w in work], dtype=torch.int64)
        prefix_lens = torch.tensor([w.start for w in work], dtype=torch.int64)
        rows = torch.tensor([w.req.row for w in work], dtype=torch.int64)
        slots = self._allocate(int(extend_lens.sum()))
        positions = _positions(prefix_lens, extend_lens)
        self.req_to_token.table[torch.repeat_interleave(rows, extend_lens), positions] = slots
        input_ids: list[int] = []
        for w in work:
            input_ids += _token_slice(w.req, w.start, w.start + w.num_tokens)
        ends = torch.cumsum(extend_lens, 0) - 1
        sampled = [w for w in work if w.samples]
        sample_indices = ends[[i for i, w in enumerate(work) if w.samples]]
        lp_indices, lp_targets, lp_owners, lp_top_k = _prompt_logprob_plan(work, ends)
        grammar_rows, bitmask = self._grammar_bitmask([w.req for w in sampled])
        forward = ForwardBatch(
            input_ids=torch.tensor(input_ids, dtype=torch.int64),
            positions=positions,
            attn=AttentionInputs(rows, prefix_lens, extend_lens, slots),
            sample_indices=sample_indices,
            sampling_rows=tuple(_sampling_row(w.req) for w in sampled),
            return_logprobs=any(w.req.logprob.enabled for w in sampled),
            prompt_logprob_indices=torch.tensor(lp_indices, dtype=torch.int64),
            prompt_logprob_targets=torch.tensor(lp_targets, dtype=torch.int64),
            prompt_top_k=lp_top_k,
            grammar_bitmask=bitmask,
            grammar_rows=grammar_rows,
        )
        return ScheduledBatch(forward, tuple(work), tuple(w.req for w in sampled), lp_owners)

    def _grammar_bitmask(
        self, sampled: list[Request]
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(G,) sampling rows with a grammar and their (G, W) allowed-token bitmask."""
        rows = [i for i, req in enumerate(sampled) if req.grammar is not None]
        if not rows:
            return None, None
        assert self.vocab is not None
        start = time.perf_counter()
        bitmask = torch.empty(len(rows), self.vocab.bitmask_width, dtype=torch.int32)
        for k, i in enumerate(rows):
            sampled[i].grammar.fill_bitmask(bitmask, k)  # type: ignore[union-attr]
        self.stats.mask_fill_seconds.append(time.perf_counter() - start)
        return torch.tensor(rows, dtype=torch.int64), bitmask

    # ---- results -----------------------------------------------------------------------

    def process_output(self, batch: ScheduledBatch, output: ModelOutput) -> list[StreamChunk]:
        """Applies a pass's results; returns a chunk for each request with something new
        to report (streaming ones after every token, the others when they finish)."""
        for w in batch.work:
            if not w.req.finished:
                w.req.num_computed_tokens = w.start + w.num_tokens
        for (req, pos), entry in zip(batch.prompt_logprob_owners, output.prompt_logprobs):
            req.prompt_logprobs[pos] = entry
        updated = []
        for i, (req, token) in enumerate(zip(batch.sampled, output.next_token_ids)):
            if req.finished:  # aborted while the pass ran
                continue
            if req.logprob.enabled:
                req.output_logprobs.append(output.logprobs[i])
            self._append_sampled(req, token)
            updated.append(req)
        self.stats.num_generated_tokens += len(updated)
        for w in batch.work:
            if w.num_tokens > 1 and not w.req.finished:
                self._cache_computed_prefix(w.req)
        return _chunks(updated)

    def _cache_computed_prefix(self, req: Request) -> None:
        """Shares a prefill's tokens as soon as they are computed (not only when the
        request ends), so requests queued behind it with the same prefix reuse them."""
        assert req.row is not None and req.prefix_node is not None
        n = req.num_computed_tokens
        match = self.cache.cache_unfinished(
            req.all_ids[:n], self.req_to_token.table[req.row, :n], req.prefix_node
        )
        self.req_to_token.write(req.row, 0, match.slots)
        req.prefix_node = match.last_node

    def fail_batch(self, batch: ScheduledBatch, message: str) -> list[StreamChunk]:
        """Aborts every request of a pass that raised, freeing their KV and this pass's slots."""
        failed = []
        for w in batch.work:
            if not w.req.finished:
                w.req.num_computed_tokens = w.start + w.num_tokens  # it owns those slots now
                self._finish(w.req, FinishReason("abort", message=message))
                failed.append(w.req)
        return _chunks(failed)

    def _append_sampled(self, req: Request, token: int) -> None:
        """A sampled token; for a constrained request also the grammar's next move:
        finish when it is complete, or append the text it forces (jump-forward)."""
        grammar = req.grammar
        if grammar is None:
            self._append_token(req, token)
            return
        # -1: the fused sampler found no allowed token; otherwise the mask forbade it.
        # Either is a bug, not the model's doing: fail this request only.
        if token < 0 or not grammar.accept_token(token):
            message = f"sampled token {token} violates the request's grammar"
            self._finish(req, FinishReason("abort", message=message))
            return
        self._append_token(req, token)
        if not req.finished and req.jump_forward:
            self._jump_forward(req, replaceable=True)
        if not req.finished and grammar.is_terminal():
            self._finish(req, FinishReason("stop"))

    def _jump_forward(self, req: Request, replaceable: bool) -> None:
        """Appends the tokens of the text the grammar forces; the next pass computes them
        all at once (an extend, or within the prefill) and samples after the last.

        ``replaceable``: the last token is a just-sampled one with no KV yet, so
        jump-forward may replace it with its re-tokenisation together with the forced
        text (see constrained.jump_forward); a prompt token never is.
        """
        assert req.grammar is not None and self.jump is not None
        room = req.params.max_new_tokens - len(req.output_ids) - 1  # keep one to sample
        jump = self.jump.advance(req.grammar, req.all_ids[-1], replaceable, max_tokens=room)
        if jump is None:
            return
        if jump.replaces_last:
            req.output_ids.pop()
        req.output_ids.extend(jump.tokens)
        grown = len(jump.tokens) - jump.replaces_last
        req.num_jump_forward_tokens += grown
        self.stats.num_jump_forward_tokens += grown
        result = req.detokenizer.feed(jump.text_tokens)
        req.text += result.text
        if result.stopped:  # a stop string inside the forced text
            self._finish(req, FinishReason("stop", matched=result.matched_stop), flush=False)

    def _append_token(self, req: Request, token: int) -> None:
        if not req.output_ids:
            req.first_token_at = time.perf_counter()
        req.output_ids.append(token)
        params = req.params
        if token in req.stop_token_ids and len(req.output_ids) > params.min_new_tokens:
            if params.no_stop_trim:
                req.text += req.detokenizer.feed([token]).text
            self._finish(req, FinishReason("stop", matched=token))
            return
        result = req.detokenizer.feed([token])
        req.text += result.text
        if result.stopped:  # nothing after the stop string is ever shown
            self._finish(req, FinishReason("stop", matched=result.matched_stop), flush=False)
        elif len(req.output_ids) >= params.max_new_tokens:
            self._finish(req, FinishReason("length", length=params.max_new_tokens))

    def _finish(self, req: Request, reason: FinishReason, flush: bool = True) -> None:
        """Ends a request; ``flush`` releases text the detokenizer held back (a
        partial character or a possible stop-string prefix)."""
        if flush:
            req.text += req.detokenizer.finish()
        if req.status is RequestStatus.RUNNING:
            self._release_kv(req)
            self.running.remove(req)
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
        self.stats.num_finished += 1

    def _release_kv(self, req: Request) -> None:
        """Hands the request's KV to the prefix cache (which frees what it does not keep)."""
        assert req.row is not None and req.prefix_node is not None
        n = req.num_computed_tokens
        slots = self.req_to_token.table[req.row, :n]
        self.cache.cache_finished(req.all_ids[:n], slots, req.prefix_node)
        self.req_to_token.free_row(req.row)
        req.row = None
        req.prefix_node = None
        req.num_computed_tokens = 0

    def flush_cache(self) -> None:
        """Empties the prefix cache. Raises InvalidRequestError while requests are queued."""
        if self.has_work:
            raise InvalidRequestError(
                f"cannot flush the cache while {len(self.running)} requests run and "
                f"{len(self.waiting)} wait"
            )
        self.cache.reset()


def _chunks(updated: list[Request]) -> list[StreamChunk]:
    """Snapshots of the updates a caller hears about: every one of a streaming
    request, the last (finished) one of any other."""
    return [req.snapshot() for req in updated if req.stream or req.finished]


def _common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _positions(prefix_lens: torch.Tensor, extend_lens: torch.Tensor) -> torch.Tensor:
    """(T,) absolute position of every new token: prefix_len + offset within its request."""
    starts = torch.cumsum(extend_lens, 0) - extend_lens
    offsets = torch.arange(int(extend_lens.sum())) - torch.repeat_interleave(starts, extend_lens)
    return torch.repeat_interleave(prefix_lens, extend_lens) + offsets


def _token_slice(req: Request, start: int, end: int) -> list[int]:
    num_prompt = len(req.prompt_ids)
    if start >= num_prompt:
        return req.output_ids[start - num_prompt : end - num_prompt]
    return req.prompt_ids[start:end] + req.output_ids[: max(0, end - num_prompt)]


def _sampling_row(req: Request) -> SamplingRow:
    return SamplingRow(
        params=req.params,
        output_ids=req.output_ids,
        stop_token_ids=req.stop_token_ids,
        prompt_ids=req.prompt_ids,
        top_logprobs_num=req.logprob.top_k,
    )


def _prompt_logprob_plan(
    work: list[_Work], ends: torch.Tensor
) -> tuple[list[int], list[int], tuple[tuple[Request, int], ...], int]:
    """Which flat tokens' logits give wanted prompt logprobs.

    The logits at position p predict the token at p + 1; a request wants
    predictions for prompt positions q in [max(start_len, 1), num_prompt).
    """
    indices, targets, owners, top_k = [], [], [], 0
    for w, end in zip(work, ends.tolist()):
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
    return indices, targets, tuple(owners), top_k
