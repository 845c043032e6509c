"""A scripted backend for the interpreter's unit tests: no model, exact outputs.

Each gen answers with the next of ``replies`` (cut by the request's stop strings, stop
regexes and max_new_tokens, one "token" per character); each select scores a choice by
``choice_scores`` (choice -> per-token logprobs), so a test can craft which choice
each method picks. Every request the interpreter sent is recorded.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from radixlm.backends.scoring import score_choices_by_tokens
from radixlm.choices import ChoiceScores
from radixlm.runtime.io.chat_template import FALLBACK, ChatTemplate
from radixlm.runtime.io.messages import (
    FinishReason,
    GenerateOutput,
    GenerateRequest,
    LogprobSpec,
    StreamChunk,
)


@dataclass
class FakeBackend:
    replies: list[str] = field(default_factory=list)
    choice_scores: dict[str, list[float]] = field(default_factory=dict)
    chat_template: ChatTemplate = FALLBACK
    is_multimodal: bool = False
    requests: list[GenerateRequest] = field(default_factory=list)
    cached_prefixes: list[tuple[int, ...]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    # characters are tokens: id = code point
    def tokenize(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, token_ids: Sequence[int]) -> str:
        return "".join(chr(t) for t in token_ids)

    def generate(self, requests: Sequence[GenerateRequest]) -> list[GenerateOutput]:
        outputs = []
        for request in requests:
            with self.lock:
                self.requests.append(request)
            n = request.sampling_params.n
            outputs += [self._answer(request, i) for i in range(n)]
        return outputs

    def stream(self, request: GenerateRequest) -> Iterator[StreamChunk]:
        final = self.generate([request])[0]
        for end in range(1, len(final.text) + 1):
            time.sleep(0.005)  # as a model would take, so that a reader sees pieces
            done = end == len(final.text)
            out = _output(request, final.text[:end], final.finish_reason if done else None)
            yield StreamChunk.of_output(out, final.text[end - 1 : end])

    def score_choices(self, text: str, choices: Sequence[str], unconditional: bool) -> ChoiceScores:
        return score_choices_by_tokens(self, text, choices, unconditional)

    def cache_prefix(self, token_ids: Sequence[int]) -> None:
        self.cached_prefixes.append(tuple(token_ids))

    def flush_cache(self) -> bool:
        return True

    def get_server_info(self) -> dict[str, Any]:
        return {"model_path": "fake"}

    def shutdown(self) -> None:
        return None

    def _answer(self, request: GenerateRequest, sample: int) -> GenerateOutput:
        params = request.sampling_params
        if params.max_new_tokens == 0:  # select scoring: prompt logprobs only
            return self._score(request)
        with self.lock:
            text = self.replies.pop(0) if self.replies else "ok"
        reason = FinishReason("length", length=params.max_new_tokens)
        for stop in params.stop:
            if stop in text:
                text, reason = text[: text.index(stop)], FinishReason("stop", matched=stop)
        for pattern in params.stop_regex:  # as the engine: cut at the first match
            if (match := re.search(pattern, text)) is not None:
                text, reason = text[: match.start()], FinishReason("stop", matched=pattern)
        if len(text) > params.max_new_tokens:
            text = text[: params.max_new_tokens]
        elif reason.type == "length":
            reason = FinishReason("stop", matched=None)
        return _output(request, text, reason)

    def _score(self, request: GenerateRequest) -> GenerateOutput:
        ids = request.input_ids or ()
        start = request.logprob_start_len or 0
        text = self.decode(ids)
        scores: list[float] = [-1.0] * (len(ids) - start)
        for choice, values in self.choice_scores.items():
            if text.endswith(choice) and len(values) == len(scores):
                scores = values
        logprobs = tuple((start + i, (lp, ids[start + i], [])) for i, lp in enumerate(scores))
        out = _output(request, "", FinishReason("length", length=0))
        return GenerateOutput(
            **{**out.__dict__, "prompt_logprobs": logprobs, "logprob": LogprobSpec(True, start)}
        )


def _output(request: GenerateRequest, text: str, reason: FinishReason | None) -> GenerateOutput:
    ids = tuple(request.input_ids or ())
    return GenerateOutput(
        rid="fake",
        index=0,
        text=text,
        output_ids=tuple(ord(c) for c in text),
        finish_reason=reason,
        prompt_tokens=len(ids),
        cached_tokens=0,
        e2e_latency=0.0,
        ttft=None,
        logprob=LogprobSpec(),
        prompt_ids=ids,
        prompt_logprobs=(),
        output_logprobs=(),
    )
