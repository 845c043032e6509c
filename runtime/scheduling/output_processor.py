"""Applies a pass's ``ModelOutput`` to its requests: computed tokens, prompt and
output logprobs, sampled tokens, stop rules, grammar moves (accept, terminal,
jump-forward), detokenization and finishing; then the ``OutputDelta``s callers hear.

Ownership: mutates a request's output state (``output_ids``, ``text``, logprobs,
``status`` / ``finish_reason`` on finishing, ``num_computed_tokens`` after a
pass). A finishing request that still holds KV goes to the ``retire`` callback
the ``Scheduler`` passes in, which releases its KV and takes it off the running
list: the processor touches neither the KV budget nor the queues.

Stop rules of one sampled token, in order::

    stop id (after min_new_tokens) -> stop string (detokenizer) -> max_new_tokens
"""

from __future__ import annotations

import time
from collections.abc import Callable

from radixlm.runtime.constrained import JumpForward
from radixlm.runtime.executor.forward_batch import ModelOutput
from radixlm.runtime.io.detokenizer import DetokenizeResult
from radixlm.runtime.io.messages import FinishReason, OutputDelta
from radixlm.runtime.scheduling.batch_builder import ScheduledBatch, WorkItem
from radixlm.runtime.scheduling.request import Request, RequestStatus
from radixlm.runtime.scheduling.stats import SchedulerStats
from radixlm.runtime.speculative.controller import Speculator

__all__ = ["OutputProcessor", "deltas"]


class OutputProcessor:
    """Turns model results into request state.

    Args:
        stats: the scheduler's counters (generated, finished, aborted, jump-forward
            tokens) and its TTFT, inter-token and end-to-end latency histograms.
        jump: the jump-forward planner (None: no request may carry a grammar).
        retire: called once when a running request finishes, before it is marked
            finished: frees its KV and takes it off the running list.
    """

    def __init__(
        self,
        stats: SchedulerStats,
        jump: JumpForward | None,
        retire: Callable[[Request], None],
        truncate: Callable[[Request, int], None] | None = None,
        speculator: Speculator | None = None,
    ) -> None:
        self._stats = stats
        self._jump = jump
        self._retire = retire
        self._truncate = truncate
        self._speculator = speculator

    def apply(self, batch: ScheduledBatch, output: ModelOutput) -> list[Request]:
        """Applies a pass's results; returns the requests that got a new token."""
        for (req, pos), entry in zip(batch.prompt_logprob_owners, output.prompt_logprobs):
            req.prompt_logprobs[pos] = entry
        updated, num_generated = [], 0
        now = time.perf_counter()  # when the pass's tokens arrived, all of them
        verifying = {id(w.req): w for w in batch.work if w.proposal is not None}
        for i, (req, token) in enumerate(zip(batch.sampled, output.next_token_ids)):
            if req.finished:  # aborted while the pass ran
                continue
            updated.append(req)
            if req.params.max_new_tokens == 0:  # scored the prompt only: no output token
                self.finish(req, FinishReason("length", length=0))
                continue
            verify = verifying.get(id(req)) if verifying else None
            if verify is None and req.grammar is None:  # one plain token: the common case
                if req.logprob.enabled:
                    req.output_logprobs.append(output.logprobs[i])
                self._append_token(req, token, now)
                num_generated += req.log_metrics
                continue
            tokens, entries = [token], [output.logprobs[i]] if req.logprob.enabled else []
            if verify is not None:
                accepted = output.accepted_ids[i]
                self._verified(verify, len(accepted))
                tokens = [*accepted, token]
                if req.logprob.enabled:
                    entries = [*output.accepted_logprobs[i], *entries]
            num_generated += self._append_all(req, tokens, entries, verify, now) * req.log_metrics
        self._stats.num_generated_tokens += num_generated
        return updated

    def _verified(self, w: WorkItem, num_accepted: int) -> None:
        """A decode row verified its proposal: the KV of the rejected proposals goes."""
        assert self._truncate is not None and w.proposal is not None
        self._truncate(w.req, w.start + 1 + num_accepted)
        if self._speculator is not None:
            self._speculator.record(w.req, w.proposal, num_accepted)

    def _append_all(
        self, req: Request, tokens: list[int], entries: list, verify: WorkItem | None, now: float
    ) -> int:
        """Appends a row's tokens of this pass in order (one, or a verify row's
        accepted proposals and the token after them) until the request finishes or
        jump-forward appends forced text; returns how many were appended."""
        for j, token in enumerate(tokens):
            if entries:
                req.output_logprobs.append(entries[j])
            jumped = self._append_sampled(req, token, now)
            if req.finished:
                return j + 1
            if jumped and verify is not None:
                # the rest was verified against the output before the jump: dropped,
                # with the KV from this token on (jump-forward may have replaced it)
                self._truncate(req, verify.start + 1 + j)  # type: ignore[misc]
                return j + 1
        return len(tokens)

    def fail(self, batch: ScheduledBatch, message: str) -> list[Request]:
        """Aborts every unfinished request of a pass that raised; returns them."""
        failed = []
        for w in batch.work:
            if not w.req.finished:  # (it owns the pass's slots: they count as computed)
                self.finish(w.req, FinishReason("abort", message=message))
                failed.append(w.req)
        return failed

    def finish(self, req: Request, reason: FinishReason, flush: bool = True) -> None:
        """Ends a request; ``flush`` releases text the detokenizer held back (a
        partial character or a possible stop-string prefix)."""
        if flush:
            req.text += req.detokenizer.finish()
        if req.status is RequestStatus.RUNNING:
            self._retire(req)
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
        req.finished_at = time.perf_counter()
        if req.log_metrics:
            self._stats.num_finished += 1
            self._stats.num_aborted += reason.type == "abort"
            self._stats.e2e.observe(req.finished_at - req.created_at)

    def jump_forward(self, req: Request, replaceable: bool) -> bool:
        """Appends the tokens of the text the grammar forces; the next pass computes them
        all at once (an extend, or within the prefill) and samples after the last.

        ``replaceable``: the last token is a just-sampled one with no KV yet, so
        jump-forward may replace it with its re-tokenisation together with the forced
        text (see constrained.jump_forward); a prompt token never is.
        """
        assert req.grammar is not None and self._jump is not None
        room = req.params.max_new_tokens - len(req.output_ids) - 1  # keep one to sample
        jump = self._jump.advance(req.grammar, req.all_ids[-1], replaceable, max_tokens=room)
        if jump is None:
            return False
        if jump.replaces_last:
            req.drop_last_output_id()
        req.append_output_ids(jump.tokens)
        grown = len(jump.tokens) - jump.replaces_last
        req.num_jump_forward_tokens += grown
        self._stats.num_jump_forward_tokens += grown * req.log_metrics
        result = req.detokenizer.feed(jump.text_tokens)
        req.text += result.text
        if result.stopped:  # a stop string inside the forced text
            self.finish(req, _stop_reason(result), flush=False)
        return True

    def _append_sampled(self, req: Request, token: int, now: float) -> bool:
        """A sampled token; for a constrained request also the grammar's next move:
        finish when it is complete, or append the text it forces (jump-forward).
        Returns whether jump-forward appended text."""
        grammar = req.grammar
        if grammar is None:
            self._append_token(req, token, now)
            return False
        # -1: the fused sampler found no allowed token; otherwise the mask forbade it.
        # Either is a bug, not the model's doing: fail this request only.
        if token < 0 or not grammar.accept_token(token):
            message = f"sampled token {token} violates the request's grammar"
            self.finish(req, FinishReason("abort", message=message))
            return False
        self._append_token(req, token, now)
        jumped = False
        if not req.finished and req.jump_forward:
            jumped = self.jump_forward(req, replaceable=True)
        if not req.finished and grammar.is_terminal():
            self.finish(req, FinishReason("stop"))
        return jumped

    def _append_token(self, req: Request, token: int, now: float) -> None:
        if req.first_token_at is None:
            req.first_token_at = now
            if req.log_metrics:
                self._stats.ttft.observe(now - req.created_at)
        elif req.last_token_at is not None and req.log_metrics:
            self._stats.inter_token.observe(now - req.last_token_at)
        req.last_token_at = now
        req.append_output_ids((token,))
        params = req.params
        if token in req.stop_token_ids and len(req.output_ids) > params.min_new_tokens:
            if params.no_stop_trim:
                req.text += req.detokenizer.feed([token]).text
            self.finish(req, FinishReason("stop", matched=token))
            return
        result = req.detokenizer.feed([token])
        req.text += result.text
        if result.stopped:  # nothing after the stop string is ever shown
            self.finish(req, _stop_reason(result), flush=False)
        elif len(req.output_ids) >= params.max_new_tokens:
            self.finish(req, FinishReason("length", length=params.max_new_tokens))


def _stop_reason(result: DetokenizeResult) -> FinishReason:
    """A stop string or regex matched; or a stop regex failed (an abort saying why)."""
    if result.error is not None:
        return FinishReason("abort", message=result.error)
    return FinishReason("stop", matched=result.matched_stop)


def deltas(updated: list[Request]) -> list[OutputDelta]:
    """What a caller hears about: every update of a streaming request, the last
    (finished) one of any other, each as what changed since its previous one."""
    return [req.publish() for req in updated if req.stream or req.finished]
