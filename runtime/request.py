"""A request's state while the runtime serves it, and what it reports back.

Ownership: the engine creates a ``Request``; from then on only the scheduler
(on the engine loop thread) mutates it. Callers only ever see immutable
``RequestOutput`` snapshots.

Token bookkeeping::

    all_ids = prompt_ids + output_ids
    [ 0 .......... num_computed_tokens ) KV in the pool (slots in req_to_token[row])
    [ num_computed_tokens .. len(all_ids) ) still to compute; when the last of
      these is computed, the pass samples the next output token.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from radixlm.runtime.constrained.base import GrammarMatcher
from radixlm.runtime.detokenizer import IncrementalDetokenizer
from radixlm.runtime.radix_cache import TreeNode
from radixlm.runtime.sampling_params import SamplingParams

__all__ = ["Request", "RequestStatus", "RequestOutput", "FinishReason", "LogprobSpec"]


class RequestStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(frozen=True)
class FinishReason:
    """Why generation stopped; ``to_dict`` gives SGLang's meta_info shape."""

    type: str  # "stop" | "length" | "abort"
    matched: int | str | None = None
    length: int | None = None
    message: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type}
        if self.type == "stop":
            out["matched"] = self.matched
        elif self.type == "length":
            out["length"] = self.length
        elif self.message:
            out["message"] = self.message
        return out


@dataclass(frozen=True)
class LogprobSpec:
    """What logprobs a request wants.

    start_len: first prompt position whose logprob is reported (>= prompt
        length means prompt logprobs are off).
    top_k: how many top alternatives per position (0 = none).
    """

    enabled: bool = False
    start_len: int = 0
    top_k: int = 0


@dataclass
class Request:
    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    stop_token_ids: frozenset[int]
    detokenizer: IncrementalDetokenizer
    logprob: LogprobSpec = field(default_factory=LogprobSpec)
    stream: bool = False
    grammar: GrammarMatcher | None = None  # its state is "output_ids so far"
    jump_forward: bool = False
    output_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    row: int | None = None  # req_to_token row while it holds KV
    prefix_node: TreeNode | None = None  # locked radix node ending its cached prefix
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    num_retractions: int = 0
    num_jump_forward_tokens: int = 0
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
    num_streamed_chars: int = 0

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_total_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_pending_tokens(self) -> int:
        """Tokens still to run through the model before the next sample."""
        return self.num_total_tokens - self.num_computed_tokens

    @property
    def finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def snapshot(self) -> RequestOutput:
        delta = self.text[self.num_streamed_chars :]
        self.num_streamed_chars = len(self.text)
        now = time.perf_counter()
        return RequestOutput(
            rid=self.rid,
            text=self.text,
            delta=delta,
            output_ids=list(self.output_ids),
            finished=self.finished,
            finish_reason=self.finish_reason,
            prompt_tokens=len(self.prompt_ids),
            cached_tokens=self.num_cached_tokens,
            e2e_latency=now - self.created_at,
            ttft=(self.first_token_at - self.created_at) if self.first_token_at else None,
            logprob=self.logprob,
            prompt_ids=self.prompt_ids,
            prompt_logprobs=dict(self.prompt_logprobs) if self.logprob.enabled else {},
            output_logprobs=list(self.output_logprobs),
        )


@dataclass(frozen=True)
class RequestOutput:
    """An immutable snapshot of a request's progress (one streamed chunk or the result)."""

    rid: str
    text: str
    delta: str
    output_ids: list[int]
    finished: bool
    finish_reason: FinishReason | None
    prompt_tokens: int
    cached_tokens: int
    e2e_latency: float
    ttft: float | None
    logprob: LogprobSpec
    prompt_ids: list[int]
    prompt_logprobs: dict[int, tuple[float, int, list[tuple[float, int]]]]
    output_logprobs: list[tuple[float, int, list[tuple[float, int]]]]

    def to_dict(self) -> dict[str, Any]:
        """SGLang's result shape: text, output_ids, meta_info (+ radixlm's ``delta``)."""
        meta: dict[str, Any] = {
            "id": self.rid,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": len(self.output_ids),
            "cached_tokens": self.cached_tokens,
            "finish_reason": self.finish_reason.to_dict() if self.finish_reason else None,
            "e2e_latency": self.e2e_latency,
            "ttft": self.ttft,
        }
        if self.logprob.enabled:
            meta.update(self._logprob_meta())
        return {
            "text": self.text,
            "output_ids": self.output_ids,
            "meta_info": meta,
            "delta": self.delta,
        }

    def _logprob_meta(self) -> dict[str, Any]:
        start = min(self.logprob.start_len, len(self.prompt_ids))
        positions = range(start, len(self.prompt_ids))
        # Position 0 has no context to be predicted from: logprob None (as SGLang).
        prompt = [self.prompt_logprobs.get(p, (None, self.prompt_ids[p], [])) for p in positions]
        out = {
            "input_token_logprobs": [(lp, tok, None) for lp, tok, _ in prompt],
            "output_token_logprobs": [(lp, tok, None) for lp, tok, _ in self.output_logprobs],
        }
        if self.logprob.top_k:
            out["input_top_logprobs"] = [_top(t) if lp is not None else None for lp, _, t in prompt]
            out["output_top_logprobs"] = [_top(t) for _, _, t in self.output_logprobs]
        return out


def _top(pairs: list[tuple[float, int]]) -> list[tuple[float, int, None]]:
    return [(lp, tok, None) for lp, tok in pairs]
