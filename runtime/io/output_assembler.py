"""The caller's side of a stream: ``OutputDelta``s in, ``StreamChunk``s out.

The loop thread sends each request only what changed (``OutputDelta``); what a
caller is shown (the output so far, SGLang's cumulative shape) is kept here, in
the caller's context, from the request as it was queued (its index, prompt ids,
logprob options) plus every delta so far. The loop so never copies a prompt or
an output-so-far per update.
"""

from __future__ import annotations

from collections.abc import Iterable

from radixlm.runtime.io.messages import (
    GenerateOutput,
    OutputDelta,
    StreamChunk,
    TokenizedRequest,
    TokenLogprob,
)

__all__ = ["OutputAssembler"]


class _Output:
    """One request's output so far."""

    __slots__ = ("request", "text", "ids", "output_logprobs", "prompt_logprobs")

    def __init__(self, request: TokenizedRequest) -> None:
        self.request = request
        self.text = ""
        self.ids: list[int] = []
        self.output_logprobs: list[TokenLogprob] = []
        self.prompt_logprobs: dict[int, TokenLogprob] = {}

    def apply(self, delta: OutputDelta) -> GenerateOutput:
        self.text += delta.text
        del self.ids[delta.num_kept_ids :]
        self.ids += delta.new_ids
        self.output_logprobs += delta.output_logprobs
        self.prompt_logprobs.update(delta.prompt_logprobs)
        req = self.request
        return GenerateOutput(
            rid=req.rid,
            index=req.index,
            text=self.text,
            output_ids=tuple(self.ids),
            finish_reason=delta.finish_reason,
            prompt_tokens=len(req.prompt_ids),
            cached_tokens=delta.cached_tokens,
            e2e_latency=delta.e2e_latency,
            ttft=delta.ttft,
            logprob=req.logprob,
            prompt_ids=req.prompt_ids,
            prompt_logprobs=tuple(self.prompt_logprobs.items()) if req.logprob.enabled else (),
            output_logprobs=tuple(self.output_logprobs),
            grammar_warnings=req.grammar_warnings,
            times=delta.times,
            spec_verify_ct=delta.spec_verify_ct,
            spec_accepted_tokens=delta.spec_accepted_tokens,
        )


class OutputAssembler:
    """The outputs of one call's requests, kept up to date from their deltas.

    Not thread-safe: one caller context applies every delta of its call.
    """

    def __init__(self, requests: Iterable[TokenizedRequest]) -> None:
        self._outputs = {r.rid: _Output(r) for r in requests}

    def apply(self, delta: OutputDelta) -> StreamChunk:
        """The chunk of this update: the request's output so far and the new text.

        Raises KeyError for a delta of a request not in this call."""
        return StreamChunk(self._outputs[delta.rid].apply(delta), delta.text)
