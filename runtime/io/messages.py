"""The engine's typed boundary: what callers send in and what comes back out.

    caller (Engine.generate dicts, a DSL backend, the HTTP server)
      --GenerateRequest-->  RequestBuilder (caller's context: tokenize, validate)
      --TokenizedRequest--> engine loop (AddRequests)  --> Scheduler
      <--OutputDelta------  what changed in a request since its last update (the loop
                            publishes only that; the caller's OutputAssembler keeps
                            the rest and hands out StreamChunk: what the update added,
                            and the GenerateOutput so far when asked for)

``GenerateRequest``, ``OutputDelta``, ``GenerateOutput`` and ``StreamChunk`` are plain frozen data
(str, int, float, tuples, ``SamplingParams``; a chunk pickles as its whole output), so a
server process can send them over a pipe to an engine process. ``TokenizedRequest`` and the loop
messages hold live objects (a detokenizer, a grammar matcher, a result sink) and
stay inside the engine's process.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from radixlm.runtime.constrained.base import GrammarMatcher
from radixlm.runtime.io.detokenizer import IncrementalDetokenizer
from radixlm.runtime.io.sampling_params import SamplingParams

__all__ = [
    "AddRequests",
    "Abort",
    "FinishReason",
    "FlushCache",
    "GenerateOutput",
    "GenerateRequest",
    "LogprobSpec",
    "LoopMessage",
    "OutputDelta",
    "ReadStats",
    "RequestTimes",
    "StreamChunk",
    "StreamShape",
    "TokenLogprob",
    "TokenizedRequest",
    "Wake",
]

# (logprob, token id, top alternatives as (logprob, token id))
TokenLogprob = tuple[float, int, list[tuple[float, int]]]


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


@dataclass(frozen=True)
class GenerateRequest:
    """One prompt to complete; exactly one of ``text`` and ``input_ids`` is set.

    ``sampling_params.n > 1`` asks for n samples of this prompt (n outputs).
    ``logprob_start_len`` None reports no prompt logprobs (SGLang's -1);
    ``top_logprobs_num`` None or 0 reports no alternatives.
    ``request_id``: the caller's id for it (an HTTP ``X-Request-Id``; 1-128 visible ASCII
    characters). Its samples' ids start with it, then ``-`` and the engine's random part,
    so they stay unique (two calls may carry the same request id) and unguessable.
    ``log_metrics`` False (SGLang's): it counts in none of the engine's counters and
    histograms (a health probe).
    """

    text: str | None = None
    input_ids: tuple[int, ...] | None = None
    sampling_params: SamplingParams = SamplingParams()
    return_logprob: bool = False
    logprob_start_len: int | None = None
    top_logprobs_num: int | None = None
    stream: bool = False
    request_id: str | None = None
    log_metrics: bool = True


@dataclass(frozen=True)
class TokenizedRequest:
    """A validated request, ready for the scheduler: one sample of one prompt.

    index: its place in its call (prompts in order, each prompt's samples together).
    stop_token_ids: every id that ends it (the params' own plus EOS unless ignored).
    detokenizer, grammar: its per-request actors (grammar None: unconstrained).
    jump_forward: append the text its grammar forces without decoding it.
    grammar_warnings: what a lenient JSON-schema read dropped from its constraint.
    log_metrics: False keeps it out of the engine's counters (``GenerateRequest``).
    """

    rid: str
    index: int
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    stop_token_ids: frozenset[int]
    detokenizer: IncrementalDetokenizer
    logprob: LogprobSpec = LogprobSpec()
    stream: bool = False
    grammar: GrammarMatcher | None = None
    jump_forward: bool = False
    grammar_warnings: tuple[str, ...] = ()
    log_metrics: bool = True
    created_at: float = field(default_factory=time.perf_counter)  # its e2e latency starts here


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
class RequestTimes:
    """When a request passed each stage, in ``time.perf_counter()`` seconds (None: it
    never got there), as the engine loop recorded them::

        created_at      tokenized and queued (after its constraint compiled)
        admitted_at     first admitted: its queue time ends, its prefill starts
        first_token_at  its first sampled token: the pass that computed the last prompt
                        token sampled it, so its prefill ended here too
        finished_at     finished (stop, length or abort)

    Plain floats: a server builds trace spans from them after the fact, so the loop
    never calls a tracing library.
    """

    created_at: float
    admitted_at: float | None
    first_token_at: float | None
    finished_at: float | None


@dataclass(frozen=True)
class GenerateOutput:
    """A request's result so far (final once ``finish_reason`` is set).

    index: the output's place in its call (prompts in order, each prompt's n
        samples together).
    prompt_logprobs: prompt position -> entry, for the wanted positions computed.
    output_logprobs: one entry per output token (when logprobs were asked for).
    grammar_warnings: the schema keywords a ``json_schema_lenient`` request generated
        without, one line each (in ``meta_info`` only when there are any).
    times: when it was queued, admitted, sampled its first token and finished (on the
        finished output; None before).
    """

    rid: str
    index: int
    text: str
    output_ids: tuple[int, ...]
    finish_reason: FinishReason | None
    prompt_tokens: int
    cached_tokens: int
    e2e_latency: float
    ttft: float | None
    logprob: LogprobSpec
    prompt_ids: tuple[int, ...]
    prompt_logprobs: tuple[tuple[int, TokenLogprob], ...]
    output_logprobs: tuple[TokenLogprob, ...]
    grammar_warnings: tuple[str, ...] = ()
    times: RequestTimes | None = None
    spec_verify_ct: int = 0
    spec_accepted_tokens: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def to_dict(self) -> dict[str, Any]:
        """SGLang's result shape: text, output_ids, meta_info."""
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
        if self.grammar_warnings:
            meta["grammar_warnings"] = list(self.grammar_warnings)
        if self.spec_verify_ct:  # SGLang's name; and what those verify steps accepted
            meta["spec_verify_ct"] = self.spec_verify_ct
            meta["spec_accepted_tokens"] = self.spec_accepted_tokens
        return {"text": self.text, "output_ids": list(self.output_ids), "meta_info": meta}

    def _logprob_meta(self) -> dict[str, Any]:
        start = min(self.logprob.start_len, len(self.prompt_ids))
        positions = range(start, len(self.prompt_ids))
        computed = dict(self.prompt_logprobs)
        # Position 0 has no context to be predicted from: logprob None (as SGLang).
        prompt = [computed.get(p, (None, self.prompt_ids[p], [])) for p in positions]
        out = {
            "input_token_logprobs": [(lp, tok, None) for lp, tok, _ in prompt],
            "output_token_logprobs": [(lp, tok, None) for lp, tok, _ in self.output_logprobs],
            # SGLang's: a stream of incremental chunks says how many there are in all
            "output_token_logprobs_length": len(self.output_logprobs),
        }
        if self.logprob.top_k:
            out["input_top_logprobs"] = [_top(t) if lp is not None else None for lp, _, t in prompt]
            out["output_top_logprobs"] = [_top(t) for _, _, t in self.output_logprobs]
        return out


# What a stream's snapshot builds: the whole output so far, or only what one chunk added
# (its text, ids and output logprobs; the rest as the whole output's)
OutputPart = Literal["whole", "added"]
# What each streamed dict holds: the output so far ("whole": GenerateOutput.to_dict), or
# SGLang's server events (StreamChunk.event_dict) with the text and ids so far or new
StreamShape = Literal["whole", "cumulative", "incremental"]


@dataclass(frozen=True)
class StreamChunk:
    """One update of a request, as a stream's consumer reads it: what it added first.

    What changed since the request's previous chunk, at a cost flat in the stream's length:
        delta                the text appended
        new_ids              the output ids a consumer holding the previous chunk's ids
                             appends (jump-forward may re-tokenise the last sampled token;
                             the replaced tail was already sent and is left out)
        new_output_logprobs  the output logprob entries appended (logprobs asked for)
        num_output_ids       the request's output ids so far, in all
        num_output_logprobs  its output logprob entries so far, in all
    ``output``, the request's whole output as of this chunk, is built when first read
    (a cost of the output's length): a streaming consumer reads it on the finished chunk.
    """

    rid: str
    index: int
    delta: str
    new_ids: tuple[int, ...]
    new_output_logprobs: tuple[TokenLogprob, ...]
    num_output_ids: int
    num_output_logprobs: int
    finish_reason: FinishReason | None
    logprob: LogprobSpec
    # Builds the output as of this chunk: whole, or with only what this chunk added
    snapshot: Callable[[OutputPart], GenerateOutput] = field(repr=False, compare=False)

    @classmethod
    def of_output(
        cls,
        output: GenerateOutput,
        delta: str,
        new_ids: tuple[int, ...] = (),
        new_output_logprobs: tuple[TokenLogprob, ...] = (),
    ) -> StreamChunk:
        """The chunk of a producer that holds whole outputs (a DSL backend, a pickle):
        ``delta`` (``new_ids``, ``new_output_logprobs``) added, ``output`` as of it."""

        def snapshot(part: OutputPart) -> GenerateOutput:
            if part == "whole":
                return output
            return dataclasses.replace(
                output, text=delta, output_ids=new_ids, output_logprobs=new_output_logprobs
            )

        return cls(
            output.rid,
            output.index,
            delta,
            tuple(new_ids),
            tuple(new_output_logprobs),
            len(output.output_ids),
            len(output.output_logprobs),
            output.finish_reason,
            output.logprob,
            snapshot,
        )

    def __reduce__(self) -> tuple:
        """Pickled whole (the snapshot is a closure over the caller's assembler)."""
        args = (self.output, self.delta, self.new_ids, self.new_output_logprobs)
        return (StreamChunk.of_output, args)

    @functools.cached_property
    def output(self) -> GenerateOutput:
        """The request's output as of this chunk (built once, on first read)."""
        return self.snapshot("whole")

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def to_dict(self) -> dict[str, Any]:
        """``GenerateOutput.to_dict`` of ``output`` plus radixlm's ``delta``."""
        return {**self.output.to_dict(), "delta": self.delta}

    def event_dict(self, incremental: bool) -> dict[str, Any]:
        """SGLang's streamed ``/generate`` event: the output logprobs new since the previous
        chunk (``output_token_logprobs_length`` counts them all: SGLang's client merges
        them), and with ``incremental`` (SGLang's ``incremental_streaming_output``) only the
        new text and ids, else the text and ids so far; plus radixlm's ``delta``.

        Incremental, its cost is flat in the stream's length (the prompt's logprobs, which
        every event repeats as SGLang's do, aside)."""
        added = self.snapshot("added")
        event = added.to_dict()
        meta = event["meta_info"]
        meta["completion_tokens"] = self.num_output_ids
        if "output_token_logprobs_length" in meta:
            meta["output_token_logprobs_length"] = self.num_output_logprobs
        if incremental:
            event["output_ids"] = list(self.new_ids)
        else:
            event["text"] = self.output.text
            event["output_ids"] = list(self.output.output_ids)
        event["delta"] = self.delta
        return event


def _top(pairs: list[tuple[float, int]]) -> list[tuple[float, int, None]]:
    return [(lp, tok, None) for lp, tok in pairs]


@dataclass(frozen=True)
class OutputDelta:
    """What changed in one request since the loop last published it: all that crosses
    from the loop thread to the caller per update, so an update costs what it adds,
    never the prompt or the output so far again.

    text: the text appended (text only ever grows).
    num_kept_ids: output ids before this index stay; those after it are replaced by
        ``new_ids`` (jump-forward may re-tokenise the last sampled token).
    output_logprobs: entries appended (one per sampled token).
    prompt_logprobs: prompt positions computed since the last update.
    cached_tokens, e2e_latency, ttft, finish_reason: their current values.
    times: the request's stage times, on the finished delta only.
    spec_verify_ct, spec_accepted_tokens: speculative decoding so far: the steps that
        verified proposals, and the proposals they accepted.
    """

    rid: str
    text: str
    num_kept_ids: int
    new_ids: tuple[int, ...]
    output_logprobs: tuple[TokenLogprob, ...]
    prompt_logprobs: tuple[tuple[int, TokenLogprob], ...]
    cached_tokens: int
    e2e_latency: float
    ttft: float | None
    finish_reason: FinishReason | None
    times: RequestTimes | None = None
    spec_verify_ct: int = 0
    spec_accepted_tokens: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


# ---- messages to the engine loop (in-process) ---------------------------------------------

DeltaSink = Callable[[OutputDelta], None]


@dataclass(frozen=True)
class AddRequests:
    """Queue these requests; every delta of theirs goes to ``sink`` (from the loop thread)."""

    requests: tuple[TokenizedRequest, ...]
    sink: DeltaSink


@dataclass(frozen=True)
class Abort:
    """Stop request ``rid`` wherever it is and free its KV (unknown or done: nothing)."""

    rid: str


@dataclass(frozen=True)
class FlushCache:
    """Empty the radix cache; ``reply`` gets None, or the error when requests are queued."""

    reply: Callable[[BaseException | None], None]


@dataclass(frozen=True)
class Wake:
    """Nothing to do: wakes a loop that waits for work (to see that it should stop)."""


@dataclass(frozen=True)
class ReadStats:
    """``reply`` gets ``read(runtime)``, called on the loop thread (which owns what it reads)."""

    read: Callable[[Any], Any]
    reply: Callable[[Any], None]


LoopMessage = AddRequests | Abort | FlushCache | Wake | ReadStats
