"""``OpenAI``: DSL programs on any OpenAI-compatible server, through the official
``openai`` client (``pip install radixlm[openai]``).

The OpenAI API speaks text, not token ids, so this backend's "tokens" are the
program text's characters (id = code point): ``tokenize`` and ``decode`` are
exact inverses and every request's ids read back as the text they stand for::

    interpreter --GenerateRequest (ids = characters)--> OpenAI --+-- chat model:
                                                                 |   messages -> /chat/completions
                <--GenerateOutput (ids = characters)--           +-- completion model:
                                                                     text -> /completions

Chat models (``is_chat_model=True``, the default): role blocks render as a ChatML
transcript (``<|im_start|>user\\n...<|im_end|>\\n``) which each gen's prompt is split
back into messages by; a gen must come right after ``assistant_begin`` (the chat
API cannot continue a partial assistant message). Completion models send the text
as it is, role blocks in the plain ``Role: `` transcript.

What the API can express is served: ``gen`` with max_tokens, stop, temperature,
top_p, n, frequency / presence penalties, ``json_schema`` (as
``response_format``), streaming, output logprobs; ``select`` on completion models,
by each choice's prompt logprobs (``echo`` + ``logprobs``, which the server must
return: radixlm and vLLM do, OpenAI's own models no longer). Everything else
(regex, EBNF, choices as a constraint, top_k, min_p, min_tokens, repetition
penalty, ignore_eos, stop token ids, prompt logprobs on a chat model, ``select``
on a chat model, images) raises ``UnsupportedInputError`` naming it.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

from radixlm.backends.base import UnsupportedInputError
from radixlm.choices import ChoiceScores, TokenScore
from radixlm.runtime.errors import InvalidRequestError
from radixlm.runtime.io.chat_template import FALLBACK, ROLES, ChatTemplate
from radixlm.runtime.io.messages import (
    FinishReason,
    GenerateOutput,
    GenerateRequest,
    StreamChunk,
)
from radixlm.runtime.io.sampling_params import SamplingParams
from radixlm.runtime.io.wire import logprob_spec

__all__ = ["CHATML", "OpenAI"]

CHATML = ChatTemplate(
    name="chatml",
    role_prefixes={role: f"<|im_start|>{role}\n" for role in ROLES},
    role_suffixes={role: "<|im_end|>\n" for role in ROLES},
    first_prefixes={role: f"<|im_start|>{role}\n" for role in ROLES},
    stop_token_ids=(),
)
_BLOCK = re.compile(r"<\|im_start\|>(system|user|assistant)\n(.*?)<\|im_end\|>\n", re.DOTALL)
_OPEN_ASSISTANT = "<|im_start|>assistant\n"
# Sampling parameters the API has no field for, with the value that means "unused".
_UNEXPRESSIBLE = {
    "regex": None,
    "ebnf": None,
    "choices": None,
    "top_k": -1,
    "min_p": 0.0,
    "min_new_tokens": 0,
    "repetition_penalty": 1.0,
    "ignore_eos": False,
    "stop_token_ids": (),
    "stop_regex": (),
    "json_max_string_length": None,
}


class OpenAI:
    """The OpenAI-API backend.

    Args:
        model: the model name the server serves (``"default"`` on radixlm).
        base_url: the server's API root (``http://host:port/v1``); None: OpenAI's.
        api_key: the bearer token (None: the client reads ``OPENAI_API_KEY``).
        is_chat_model: send messages to ``/chat/completions`` (True) or text to
            ``/completions`` (False).
        timeout: seconds any one call may take.
        client_options: passed on to ``openai.OpenAI`` (e.g. ``max_retries``).

    Raises:
        ImportError: the ``openai`` package is not installed.
    """

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        is_chat_model: bool = True,
        timeout: float = 600.0,
        **client_options: Any,
    ) -> None:
        try:
            import openai
        except ImportError as e:  # an optional extra
            raise ImportError(
                "the OpenAI backend needs the openai package: pip install 'radixlm[openai]'"
            ) from e
        self.model = model
        self.is_chat_model = is_chat_model
        self._client = openai.OpenAI(
            base_url=base_url, api_key=api_key, timeout=timeout, **client_options
        )
        self._chat_template = CHATML if is_chat_model else FALLBACK

    @property
    def chat_template(self) -> ChatTemplate:
        return self._chat_template

    @property
    def is_multimodal(self) -> bool:
        return False

    # characters are tokens: id = code point
    def tokenize(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, token_ids: Sequence[int]) -> str:
        return "".join(chr(t) for t in token_ids)

    def generate(self, requests: Sequence[GenerateRequest]) -> list[GenerateOutput]:
        outputs: list[GenerateOutput] = []
        for request in requests:
            outputs += self._complete(request, first_index=len(outputs))
        return outputs

    def stream(self, request: GenerateRequest) -> Iterator[StreamChunk]:
        """Chunks as the server streams them; closing the iterator closes the
        connection (a radixlm server then aborts the request)."""
        if request.sampling_params.n != 1:
            raise UnsupportedInputError("a streamed gen has one sample (n=1)")
        started = time.perf_counter()
        stream = self._create(request, stream=True)
        text, reason, ttft = "", None, None
        try:
            for event in stream:
                if not event.choices:
                    continue
                choice = event.choices[0]
                piece = (choice.delta.content or "") if self.is_chat_model else choice.text
                if piece and ttft is None:
                    ttft = time.perf_counter() - started
                text += piece or ""
                if choice.finish_reason is not None:
                    reason = _finish_reason(choice.finish_reason, request)
                output = self._output(request, 0, text, reason, started, ttft)
                yield StreamChunk.of_output(output, piece)
        finally:
            stream.close()

    def score_choices(self, text: str, choices: Sequence[str], unconditional: bool) -> ChoiceScores:
        """Each choice's tokens as the server tokenizes ``text + choice``: those
        reaching past ``text``, scored by the prompt logprobs ``echo`` returns."""
        if self.is_chat_model:
            raise UnsupportedInputError(
                "select needs prompt logprobs, which the chat completions API does not "
                "return; use OpenAI(..., is_chat_model=False) against a server whose "
                "/completions echoes them (radixlm, vLLM)"
            )
        conditional = tuple(self._echo_scores(text, c) for c in choices)
        free = tuple(self._echo_scores("", c) for c in choices) if unconditional else None
        return ChoiceScores(tuple(choices), conditional, free)

    def cache_prefix(self, token_ids: Sequence[int]) -> None:
        """Nothing to do: the API has no such call (servers cache prefixes themselves)."""

    def flush_cache(self) -> bool:
        return False  # the API has no such call

    def get_server_info(self) -> dict[str, Any]:
        return {
            "model_path": self.model,
            "base_url": str(self._client.base_url),
            "context_length": None,
            "chat_template": self._chat_template.name,
        }

    def shutdown(self) -> None:
        self._client.close()

    def __enter__(self) -> OpenAI:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ---- requests --------------------------------------------------------------------

    def _complete(self, request: GenerateRequest, first_index: int) -> list[GenerateOutput]:
        started = time.perf_counter()
        response = self._create(request, stream=False)
        outputs = []
        for i, choice in enumerate(response.choices):
            text = (choice.message.content or "") if self.is_chat_model else choice.text
            reason = _finish_reason(choice.finish_reason, request)
            out = self._output(request, first_index + i, text, reason, started, None)
            usage = response.usage
            outputs.append(_with_usage(out, usage))
        return outputs

    def _create(self, request: GenerateRequest, stream: bool) -> Any:
        """One API call for ``request`` (its ids read back as its text)."""
        params = request.sampling_params
        _check_expressible(request, self.is_chat_model)
        text = self.decode(request.input_ids or ()) if request.text is None else request.text
        options: dict[str, Any] = {
            "model": self.model,
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "n": params.n,
            "frequency_penalty": params.frequency_penalty,
            "presence_penalty": params.presence_penalty,
            "stream": stream,
        }
        if params.stop:
            options["stop"] = list(params.stop)
        if params.seed is not None:
            options["seed"] = params.seed
        if not self.is_chat_model:
            if params.json_schema is not None:
                raise UnsupportedInputError(
                    "json_schema needs response_format, which only the chat completions "
                    "API has: use a chat model (is_chat_model=True)"
                )
            if request.return_logprob:
                options["logprobs"] = max(request.top_logprobs_num or 0, 0)
            return self._client.completions.create(prompt=text, **options)
        if request.return_logprob:
            options["logprobs"] = True
            options["top_logprobs"] = request.top_logprobs_num or 0
        if params.json_schema is not None:
            options["response_format"] = _response_format(params)
        return self._client.chat.completions.create(messages=_messages(text), **options)

    def _output(
        self,
        request: GenerateRequest,
        index: int,
        text: str,
        reason: FinishReason | None,
        started: float,
        ttft: float | None,
    ) -> GenerateOutput:
        prompt_ids = tuple(request.input_ids or self.tokenize(request.text or ""))
        return GenerateOutput(
            rid=f"openai-{id(request):x}-{index}",
            index=index,
            text=text,
            output_ids=tuple(self.tokenize(text)),
            finish_reason=reason,
            prompt_tokens=len(prompt_ids),
            cached_tokens=0,
            e2e_latency=time.perf_counter() - started,
            ttft=ttft,
            logprob=logprob_spec(request),
            prompt_ids=prompt_ids,
            prompt_logprobs=(),
            output_logprobs=(),
        )

    def _echo_scores(self, text: str, choice: str) -> tuple[TokenScore, ...]:
        """(logprob, -1) of every server token of ``text + choice`` that reaches past
        ``text`` (ids are the server's own and not returned: -1); the prompt's first
        token has no logprob (None)."""
        response = self._client.completions.create(
            model=self.model, prompt=text + choice, max_tokens=0, echo=True, logprobs=0
        )
        logprobs = response.choices[0].logprobs
        if logprobs is None or not logprobs.text_offset:
            raise UnsupportedInputError(
                f"the server at {self._client.base_url} returned no prompt logprobs for "
                "echo=True: select cannot be scored there"
            )
        scored = []
        for token, offset, lp in zip(
            logprobs.tokens, logprobs.text_offset, logprobs.token_logprobs, strict=True
        ):
            if offset + len(token) > len(text):
                scored.append((lp, -1))
        return tuple(scored)


def _check_expressible(request: GenerateRequest, chat: bool) -> None:
    params = request.sampling_params
    for name, unused in _UNEXPRESSIBLE.items():
        if getattr(params, name) != unused:
            raise UnsupportedInputError(
                f"the OpenAI API has no {name!r}: the OpenAI backend cannot serve it"
            )
    if params.max_new_tokens == 0:
        raise UnsupportedInputError("the OpenAI backend generates at least one token")
    if chat and request.return_logprob and request.logprob_start_len is not None:
        raise UnsupportedInputError("the chat completions API returns no prompt logprobs")


def _messages(text: str) -> list[dict[str, str]]:
    """The ChatML transcript ``text``, ending with an open assistant block, as messages."""
    if not text.endswith(_OPEN_ASSISTANT):
        raise UnsupportedInputError(
            "a gen on a chat model must come right after assistant_begin (the chat API "
            "cannot continue text outside an empty assistant turn)"
        )
    body = text[: -len(_OPEN_ASSISTANT)]
    messages, end = [], 0
    for block in _BLOCK.finditer(body):
        if block.start() != end:
            break
        messages.append({"role": block.group(1), "content": block.group(2)})
        end = block.end()
    if end != len(body) or not messages:
        raise UnsupportedInputError(
            "a chat model's program must be role blocks only (system / user / assistant); "
            f"text outside them: {body[end:][:60]!r}"
        )
    return messages


def _response_format(params: SamplingParams) -> dict[str, Any]:
    schema = params.json_schema
    try:
        parsed = json.loads(schema) if isinstance(schema, str) else schema
    except json.JSONDecodeError as e:
        raise InvalidRequestError(f"json_schema is not JSON: {e}") from e
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": parsed}}


def _finish_reason(reason: str | None, request: GenerateRequest) -> FinishReason:
    if reason == "length":
        return FinishReason("length", length=request.sampling_params.max_new_tokens)
    if reason in (None, "stop", "tool_calls", "function_call"):
        return FinishReason("stop")
    return FinishReason("abort", message=f"the server ended it: {reason}")


def _with_usage(out: GenerateOutput, usage: Any) -> GenerateOutput:
    """The server's own prompt token count and cache hits, where it reports them."""
    if usage is None:
        return out
    details = getattr(usage, "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", None) or 0
    return replace(out, prompt_tokens=usage.prompt_tokens, cached_tokens=cached)
