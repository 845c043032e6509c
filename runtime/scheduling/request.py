"""A request's state while the runtime serves it, and what it reports back.

Ownership: the scheduler makes a ``Request`` from the ``TokenizedRequest`` the
engine queues; the scheduler side (``Scheduler``: queues and status; ``KVBudget``:
row, prefix node, computed / cached counts; ``OutputProcessor``: output, text,
logprobs, finishing) is the only code, on the engine loop thread, that mutates
it. Callers only ever hear what changed (``OutputDelta``, from ``publish``).

Token bookkeeping::

    all_ids = prompt_ids + output_ids
    [ 0 .......... num_computed_tokens ) KV in the pool (slots in req_to_token[row])
    [ num_computed_tokens .. len(all_ids) ) still to compute; when the last of
      these is computed, the pass samples the next output token.

A pass counts as computed when it is scheduled. With overlap scheduling a pass may be
scheduled while the previous one is still in flight: the request then has
``num_unseen`` sampled tokens the host has not read yet (they count as tokens, their
ids are not in ``output_ids``), and a decode scheduled on such a token carries it on
the device; the ``num_ahead`` positions so computed are the newest computed ones, and
a request that finishes meanwhile gives them back (``num_settled_tokens``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

from radixlm.runtime.constrained.base import GrammarMatcher
from radixlm.runtime.io.detokenizer import IncrementalDetokenizer
from radixlm.runtime.io.messages import (
    FinishReason,
    LogprobSpec,
    OutputDelta,
    RequestTimes,
    TokenizedRequest,
)
from radixlm.runtime.io.sampling_params import SamplingParams
from radixlm.runtime.mem_cache.radix_cache import TreeNode
from radixlm.runtime.sampling.sampler import SamplingRow
from radixlm.runtime.speculative.controller import SpecState

__all__ = ["Request", "RequestStatus"]


class RequestStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Request:
    rid: str
    index: int  # GenerateOutput.index of its outputs
    prompt_ids: list[int]
    params: SamplingParams
    stop_token_ids: frozenset[int]
    detokenizer: IncrementalDetokenizer
    logprob: LogprobSpec = field(default_factory=LogprobSpec)
    stream: bool = False
    grammar: GrammarMatcher | None = None  # its state is "output_ids so far"
    jump_forward: bool = False
    grammar_warnings: tuple[str, ...] = ()  # what a lenient schema read dropped
    log_metrics: bool = True  # False: counted in no stats (a health probe)
    spec: SpecState | None = None  # speculation's index and counts (None: it does not)
    output_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    row: int | None = None  # req_to_token row while it holds KV
    prefix_node: TreeNode | None = None  # locked radix node ending its cached prefix
    num_computed_tokens: int = 0
    num_unseen: int = 0  # tokens sampled by passes in flight (overlap), not in output_ids
    num_ahead: int = 0  # computed positions of in-flight passes scheduled on unseen tokens
    sample_index: int = -1  # its row among the sampled ids of the last pass it sampled in
    num_cached_tokens: int = 0
    num_retractions: int = 0
    num_jump_forward_tokens: int = 0
    num_spec_verify: int = 0  # steps that verified proposals of its
    num_spec_accepted: int = 0  # proposals those steps accepted
    admit_order: int = -1
    queued_at_step: int = 0
    finish_reason: FinishReason | None = None
    text: str = ""
    # position -> (logprob, token id, top (logprob, id) pairs); filled by position so
    # recomputation after a retraction overwrites instead of duplicating.
    prompt_logprobs: dict[int, tuple[float, int, list[tuple[float, int]]]] = field(
        default_factory=dict
    )
    output_logprobs: list[tuple[float, int, list[tuple[float, int]]]] = field(default_factory=list)
    created_at: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    last_token_at: float | None = None  # when its latest output token was appended
    admitted_at: float | None = None  # when it was first admitted (its queue time ends)
    finished_at: float | None = None
    # How much of text / output_ids / output_logprobs / prompt_logprobs the caller
    # has been sent (``publish`` moves them).
    num_published_chars: int = 0
    num_published_ids: int = 0
    num_published_output_logprobs: int = 0
    num_published_prompt_logprobs: int = 0
    # its SamplingRow by num_unseen: the row reads the live output_ids, so it only
    # changes with that count (built once, not for every pass)
    _sampling_rows: dict[int, SamplingRow] = field(default_factory=dict, repr=False)

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_total_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_pending_tokens(self) -> int:
        """Tokens still to run through the model before the next sample."""
        return self.num_total_tokens + self.num_unseen - self.num_computed_tokens

    @property
    def num_settled_tokens(self) -> int:
        """Computed positions whose tokens the host knew when their pass was scheduled
        (what a request keeps, or caches, when it finishes or shares its prefix)."""
        return min(self.num_computed_tokens - self.num_ahead, self.num_total_tokens)

    @property
    def finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    @classmethod
    def from_tokenized(cls, t: TokenizedRequest) -> Request:
        return cls(
            t.rid,
            t.index,
            list(t.prompt_ids),
            t.params,
            t.stop_token_ids,
            t.detokenizer,
            t.logprob,
            t.stream,
            grammar=t.grammar,
            jump_forward=t.jump_forward,
            grammar_warnings=t.grammar_warnings,
            log_metrics=t.log_metrics,
            created_at=t.created_at,
        )

    def sampling_row(self) -> SamplingRow:
        """How its next token is sampled (what the sampler and a draft model read)."""
        row = self._sampling_rows.get(self.num_unseen)
        if row is None:
            row = SamplingRow(
                params=self.params,
                output_ids=self.output_ids,
                stop_token_ids=self.stop_token_ids,
                prompt_ids=self.prompt_ids,
                top_logprobs_num=self.logprob.top_k,
                num_unseen=self.num_unseen,
            )
            self._sampling_rows[self.num_unseen] = row
        return row

    def append_output_ids(self, token_ids: Sequence[int]) -> None:
        """Appends output ids (sampled, accepted proposals, forced text), keeping the
        speculation index in step."""
        self.output_ids.extend(token_ids)
        if self.spec is not None and self.spec.index is not None:
            self.spec.index.extend(token_ids)

    def drop_last_output_id(self) -> None:
        """Removes the last output id (jump-forward re-tokenises it); the next delta
        then replaces it."""
        self.output_ids.pop()
        self.num_published_ids = min(self.num_published_ids, len(self.output_ids))
        if self.spec is not None and self.spec.index is not None:
            self.spec.index.truncate(self.num_total_tokens)

    def publish(self) -> OutputDelta:
        """What changed since the last call (the scheduler side calls this once per
        published update; it moves the published cursors)."""
        text = self.text[self.num_published_chars :]
        kept = self.num_published_ids
        new_ids = tuple(self.output_ids[kept:])
        output_logprobs = tuple(self.output_logprobs[self.num_published_output_logprobs :])
        prompt_logprobs: tuple = ()
        if len(self.prompt_logprobs) > self.num_published_prompt_logprobs:
            items = list(self.prompt_logprobs.items())  # position order: filled in order
            prompt_logprobs = tuple(items[self.num_published_prompt_logprobs :])
        self.num_published_chars = len(self.text)
        self.num_published_ids = len(self.output_ids)
        self.num_published_output_logprobs = len(self.output_logprobs)
        self.num_published_prompt_logprobs = len(self.prompt_logprobs)
        return OutputDelta(
            rid=self.rid,
            text=text,
            num_kept_ids=kept,
            new_ids=new_ids,
            output_logprobs=output_logprobs,
            prompt_logprobs=prompt_logprobs,
            cached_tokens=self.num_cached_tokens,
            e2e_latency=time.perf_counter() - self.created_at,
            ttft=(self.first_token_at - self.created_at) if self.first_token_at else None,
            finish_reason=self.finish_reason if self.finished else None,
            times=self._times() if self.finished else None,
            spec_verify_ct=self.num_spec_verify,
            spec_accepted_tokens=self.num_spec_accepted,
        )

    def _times(self) -> RequestTimes:
        return RequestTimes(
            self.created_at, self.admitted_at, self.first_token_at, self.finished_at
        )
