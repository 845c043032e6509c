"""A stream's ``gen`` and ``select`` through the backend: the ``GenerateRequest`` a
gen becomes, and its result (or a select's decision) in the stream's text and
variables.

    Gen(params) --over run() defaults--> build_request(text so far) --> backend
        n > 1:  every sample's text in the variable (a list), the first in the text
        stream: each chunk replaces the gen's text so far (readers see it grow)
        else:   one output, appended

A ``select`` asks the backend to score its choices (``Backend.score_choices``) and
its ``choices_method`` to decide (SGLang's keywords, ``choices.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import Any

from radixlm.backends.base import Backend
from radixlm.choices import ChoicesDecision, ChoicesSamplingMethod
from radixlm.conversation import Conversation
from radixlm.ir import DTYPE_REGEX, DTYPE_STOP, LOGPROB_OPTIONS, Gen, GenParams, Select
from radixlm.runtime.io.messages import GenerateOutput, GenerateRequest
from radixlm.runtime.io.sampling_params import SamplingParams
from radixlm.stream_store import StreamStore

__all__ = ["GenRunner", "build_request", "checked_decision", "gen_meta_info"]

# GenParams' fields that are SamplingParams' (the table's); the rest are request options.
_SAMPLING_NAMES = tuple(f.name for f in fields(GenParams) if f.name not in LOGPROB_OPTIONS)


class GenRunner:
    """Runs one stream's gens and selects (on its worker thread).

    Args:
        backend: where requests go.
        defaults: the ``run()`` sampling arguments every gen starts from.
        stream: whether gens stream into the text as they are generated.
        store: the stream's text and variables, read for the prompt and written.
        conversation: the stream's role blocks (an assistant gen stops at the turn's end).
    """

    def __init__(
        self,
        backend: Backend,
        defaults: GenParams,
        stream: bool,
        store: StreamStore,
        conversation: Conversation,
    ) -> None:
        self.backend = backend
        self.defaults = defaults
        self.stream = stream
        self.store = store
        self.conversation = conversation

    def gen(self, expr: Gen) -> None:
        """Generates into the text and, when named, variable ``expr.name``."""
        params = expr.params.over(self.defaults)
        request = build_request(
            params,
            expr.dtype,
            self.backend.tokenize(self.store.text),
            self.conversation.turn_stop_token_ids(),
        )
        start = len(self.store.text)
        if request.sampling_params.n > 1:
            outputs = self.backend.generate([request])
            self.store.append(outputs[0].text)
            value: Any = [out.text for out in outputs]
            meta: Any = [self._meta(out, params) for out in outputs]
        else:
            out = self._stream(expr.name, request) if self.stream else self._generate(request)
            value, meta = out.text, self._meta(out, params)
        if expr.name is not None:
            self.store.set_result(expr.name, start, value, meta)

    def select(self, expr: Select) -> None:
        """Appends the choice ``expr.choices_method`` picks; sets ``expr.name`` to it.

        Raises:
            ValueError: the method returned no decision among the choices.
        """
        method = expr.choices_method
        scores = self.backend.score_choices(
            self.store.text, expr.choices, bool(method.requires_unconditional_logprobs)
        )
        decision = checked_decision(method(**scores.method_arguments()), expr, method)
        start = len(self.store.text)
        self.store.append(decision.decision)
        if expr.name is not None:
            self.store.set_result(expr.name, start, decision.decision, decision.meta_info)

    def _generate(self, request: GenerateRequest) -> GenerateOutput:
        (out,) = self.backend.generate([request])
        self.store.append(out.text)
        return out

    def _stream(self, name: str | None, request: GenerateRequest) -> GenerateOutput:
        """A gen streamed into the text (and its variable) as it comes."""
        start, text, last = len(self.store.text), "", None
        chunks = self.backend.stream(request)
        try:
            for last in chunks:
                text += last.delta
                self.store.replace_tail(start, text, name)
        finally:
            chunks.close()  # type: ignore[attr-defined]
        assert last is not None
        return last.output

    def _meta(self, out: GenerateOutput, params: GenParams) -> dict[str, Any]:
        return gen_meta_info(out, params, self.backend.decode)


def build_request(
    params: GenParams,
    dtype: str | None,
    input_ids: Sequence[int],
    turn_stop_token_ids: Sequence[int] = (),
) -> GenerateRequest:
    """The request for a gen with ``params`` (``run()``'s defaults already under them).

    Args:
        params: the gen's sampling arguments.
        dtype: "int" | "float" | "bool" | "str" | None: constrains the text by
            ``DTYPE_REGEX`` (instead of ``params.regex``) and adds ``DTYPE_STOP``.
        input_ids: the prompt: the stream's text so far, tokenized.
        turn_stop_token_ids: end-of-turn tokens the gen also stops at (inside an
            assistant block).
    """
    stop_ids = tuple(params.stop_token_ids or ())
    stop_ids += tuple(t for t in turn_stop_token_ids if t not in stop_ids)
    regex = params.regex if dtype is None else DTYPE_REGEX[dtype]
    stop = tuple(params.stop or ())
    stop += tuple(t for t in DTYPE_STOP.get(dtype or "", ()) if t not in stop)
    sampling = SamplingParams(
        **{
            **_given(params, *_SAMPLING_NAMES),
            "stop": stop,
            "stop_regex": tuple(params.stop_regex or ()),  # the engine ends at the first match
            "stop_token_ids": stop_ids,
            "regex": regex,
        }
    )
    return GenerateRequest(
        input_ids=tuple(input_ids),
        sampling_params=sampling,
        return_logprob=bool(params.return_logprob),
        logprob_start_len=params.logprob_start_len,
        top_logprobs_num=params.top_logprobs_num,
    )


def gen_meta_info(
    out: GenerateOutput, params: GenParams, decode: Callable[[list[int]], str]
) -> dict[str, Any]:
    """A gen's meta info (``get_meta_info``): the output's, with each logprob entry's
    token text (``decode``) when the gen asked ``return_text_in_logprobs``."""
    meta = out.to_dict()["meta_info"]
    if params.return_logprob and params.return_text_in_logprobs:
        for key in ("input_token_logprobs", "output_token_logprobs"):
            meta[key] = [(lp, tok, decode([tok])) for lp, tok, _ in meta[key]]
    return meta


def checked_decision(decision: Any, expr: Select, method: ChoicesSamplingMethod) -> ChoicesDecision:
    """``decision`` if it picks one of the select's choices (a user-written method may not).

    Raises:
        ValueError: it does not.
    """
    if getattr(decision, "decision", None) not in expr.choices:
        raise ValueError(
            f"select {expr.name!r}: choices_method {type(method).__name__} returned "
            f"{decision!r}; expected a ChoicesDecision whose decision is one of "
            f"{list(expr.choices)}"
        )
    return decision


def _given(params: GenParams, *names: str) -> dict[str, Any]:
    """The fields among ``names`` that are set (the others keep SamplingParams' defaults)."""
    return {n: getattr(params, n) for n in names if getattr(params, n) is not None}
