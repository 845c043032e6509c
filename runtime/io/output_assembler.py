"""The caller's side of a stream: ``OutputDelta``s in, ``StreamChunk``s out.

The loop thread sends each request only what changed (``OutputDelta``); the caller's
assembler keeps the rest, from the request as it was queued (its index, prompt ids,
logprob options) plus every delta so far. A chunk costs what its delta adds: its
``output`` (the whole output so far, SGLang's cumulative shape) is built only when read.
Nothing a chunk refers to is changed afterwards (its lists are appended to past the
lengths it saw, or replaced), so a chunk read late still shows the output as of it.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial

from radixlm.runtime.io.messages import (
    GenerateOutput,
    OutputDelta,
    OutputPart,
    StreamChunk,
    TokenizedRequest,
    TokenLogprob,
)

__all__ = ["OutputAssembler"]


class _Output:
    """One request's output so far, in append-only lists."""

    __slots__ = ("request", "pieces", "ids", "output_logprobs", "prompt_logprobs", "_text")

    def __init__(self, request: TokenizedRequest) -> None:
        self.request = request
        self.pieces: list[str] = []
        self.ids: list[int] = []
        self.output_logprobs: list[TokenLogprob] = []
        self.prompt_logprobs: list[tuple[int, TokenLogprob]] = []
        self._text = (0, "")  # the text of the first n pieces, joined last

    def apply(self, delta: OutputDelta) -> StreamChunk:
        num_sent = len(self.ids)
        if delta.num_kept_ids < num_sent:  # a new list: earlier chunks keep the old one
            self.ids = self.ids[: delta.num_kept_ids]
        self.ids += delta.new_ids
        if delta.text:
            self.pieces.append(delta.text)
        self.output_logprobs += delta.output_logprobs
        self.prompt_logprobs += delta.prompt_logprobs
        req = self.request
        return StreamChunk(
            req.rid,
            req.index,
            delta.text,
            delta.new_ids[max(0, num_sent - delta.num_kept_ids) :],
            delta.output_logprobs,
            len(self.ids),
            len(self.output_logprobs),
            delta.finish_reason,
            req.logprob,
            partial(
                self._snapshot,
                delta,
                len(self.pieces),
                self.ids,
                len(self.ids),
                len(self.output_logprobs),
                len(self.prompt_logprobs),
            ),
        )

    def _snapshot(
        self,
        delta: OutputDelta,
        num_pieces: int,
        ids: list[int],
        num_ids: int,
        num_logprobs: int,
        num_prompt_logprobs: int,
        part: OutputPart,
    ) -> GenerateOutput:
        """The output as of ``delta``: whole, or with only what ``delta`` added."""
        req = self.request
        if part == "whole":
            text = self._text_of(num_pieces)
            output_ids = tuple(ids[:num_ids])
            output_logprobs = tuple(self.output_logprobs[:num_logprobs])
        else:
            text, output_ids, output_logprobs = delta.text, delta.new_ids, delta.output_logprobs
        return GenerateOutput(
            rid=req.rid,
            index=req.index,
            text=text,
            output_ids=output_ids,
            finish_reason=delta.finish_reason,
            prompt_tokens=len(req.prompt_ids),
            cached_tokens=delta.cached_tokens,
            e2e_latency=delta.e2e_latency,
            ttft=delta.ttft,
            logprob=req.logprob,
            prompt_ids=req.prompt_ids,
            prompt_logprobs=(
                tuple(self.prompt_logprobs[:num_prompt_logprobs]) if req.logprob.enabled else ()
            ),
            output_logprobs=output_logprobs,
            grammar_warnings=req.grammar_warnings,
            times=delta.times,
            spec_verify_ct=delta.spec_verify_ct,
            spec_accepted_tokens=delta.spec_accepted_tokens,
        )

    def _text_of(self, num_pieces: int) -> str:
        """The first ``num_pieces`` pieces joined, extending the last join when it can."""
        joined, text = self._text
        if num_pieces < joined:
            return "".join(self.pieces[:num_pieces])
        text += "".join(self.pieces[joined:num_pieces])
        self._text = (num_pieces, text)
        return text


class OutputAssembler:
    """The outputs of one call's requests, kept up to date from their deltas.

    Not thread-safe: one caller context applies every delta of its call.
    """

    def __init__(self, requests: Iterable[TokenizedRequest]) -> None:
        self._outputs = {r.rid: _Output(r) for r in requests}

    def apply(self, delta: OutputDelta) -> StreamChunk:
        """The chunk of this update: what it added, and the output so far on demand.

        Raises KeyError for a delta of a request not in this call."""
        return self._outputs[delta.rid].apply(delta)
