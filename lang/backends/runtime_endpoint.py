"""``RuntimeEndpoint``: DSL programs on a radixlm server, over HTTP.

``sgl.set_default_backend(sgl.RuntimeEndpoint("http://127.0.0.1:30000"))`` runs
every program exactly as ``Runtime`` does in process: the interpreter's typed
requests go to the server's native API and its answers come back as the same
typed outputs::

    interpreter --GenerateRequest--> RuntimeEndpoint --POST /generate (JSON, SSE)--> server
                <--GenerateOutput--                  <--SGLang's result dicts---

Programs are tokenized by the server (``POST /tokenize``), so the ids a program
sends are the ids the server's model reads; the chat template's role blocks and
the BOS token come once from ``GET /get_model_info``. One ``httpx.Client`` (a
pool of keep-alive connections, safe to share between the interpreter's stream
threads) carries every call.

Errors: a 4xx answer raises ``InvalidRequestError`` (a ValueError) with the
server's message; a server that cannot be reached or answers 5xx raises
``EndpointError``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Sequence
from typing import Any

import httpx

from radixlm.backends.scoring import score_choices_by_tokens
from radixlm.choices import ChoiceScores
from radixlm.runtime.errors import InvalidRequestError, RadixLMError
from radixlm.runtime.io.chat_template import ChatTemplate, adds_special_tokens
from radixlm.runtime.io.messages import GenerateOutput, GenerateRequest, StreamChunk
from radixlm.runtime.io.sampling_params import SamplingParams
from radixlm.runtime.io.wire import generate_body, output_from_dict

__all__ = ["EndpointError", "RuntimeEndpoint"]


class EndpointError(RadixLMError):
    """The server could not be reached, or failed (5xx) on a request."""


class RuntimeEndpoint:
    """The HTTP backend.

    Args:
        base_url: the server, e.g. ``"http://127.0.0.1:30000"``.
        api_key: sent as ``Authorization: Bearer <key>`` (the server's ``--api-key``).
        timeout: seconds any one call may take (a long generation included).

    Raises:
        EndpointError: the server does not answer ``/get_model_info``.
    """

    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 600.0) -> None:
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(
            base_url=self.base_url, headers=headers, timeout=httpx.Timeout(timeout, connect=10.0)
        )
        info = self._call("GET", "/get_model_info")
        try:
            self._chat_template = ChatTemplate.from_dict(info["chat_template"])
        except (KeyError, TypeError, ValueError) as e:
            raise EndpointError(f"{self.base_url} sent no usable chat template: {e!r}") from e
        self._bos: str | None = info.get("bos_token")
        self._token_texts: dict[int, str] = {}

    @property
    def chat_template(self) -> ChatTemplate:
        return self._chat_template

    @property
    def is_multimodal(self) -> bool:
        return False  # radixlm's models are text-only

    def tokenize(self, text: str) -> list[int]:
        add_special = adds_special_tokens(text, self._bos)
        answer = self._call("POST", "/tokenize", {"text": text, "add_special_tokens": add_special})
        return [int(t) for t in answer["tokens"]]

    def decode(self, token_ids: Sequence[int]) -> str:
        ids = [int(t) for t in token_ids]
        if len(ids) == 1 and ids[0] in self._token_texts:
            return self._token_texts[ids[0]]
        answer = self._call("POST", "/detokenize", {"tokens": ids})
        if len(ids) == 1:
            self._token_texts[ids[0]] = answer["text"]
        return answer["text"]

    def generate(self, requests: Sequence[GenerateRequest]) -> list[GenerateOutput]:
        outputs: list[GenerateOutput] = []
        for group in _same_logprob_options(requests):
            results = self._call("POST", "/generate", generate_body(group))
            results = results if isinstance(results, list) else [results]
            samples = [r for r in group for _ in range(r.sampling_params.n)]
            if len(results) != len(samples):
                raise EndpointError(f"asked for {len(samples)} outputs, got {len(results)}")
            outputs += [
                output_from_dict(result, req, len(outputs) + i)
                for i, (result, req) in enumerate(zip(results, samples, strict=True))
            ]
        return outputs

    def stream(self, request: GenerateRequest) -> Iterator[StreamChunk]:
        """The request's chunks; closing the iterator closes the connection, which
        the server takes as an abort."""
        body = generate_body([request], stream=True)
        try:
            with self._client.stream("POST", "/generate", json=body) as response:
                if response.status_code != 200:
                    response.read()
                    _raise_for(response)
                logprobs: tuple = ()  # each event carries its new tokens' output logprobs
                for data in _sse_data(response.iter_lines()):
                    event = json.loads(data)
                    if "error" in event:
                        raise InvalidRequestError(event["error"].get("message", str(event)))
                    output = output_from_dict(event, request)
                    logprobs += output.output_logprobs
                    output = dataclasses.replace(output, output_logprobs=logprobs)
                    yield StreamChunk.of_output(output, event.get("delta", ""))
        except httpx.HTTPError as e:
            raise EndpointError(f"{self.base_url}/generate: {e!r}") from e

    def score_choices(self, text: str, choices: Sequence[str], unconditional: bool) -> ChoiceScores:
        return score_choices_by_tokens(self, text, choices, unconditional)

    def cache_prefix(self, token_ids: Sequence[int]) -> None:
        if token_ids:
            request = GenerateRequest(
                input_ids=tuple(token_ids), sampling_params=SamplingParams(max_new_tokens=0)
            )
            self._call("POST", "/generate", generate_body([request]))

    def flush_cache(self) -> bool:
        response = self._send("POST", "/flush_cache")
        return response.status_code == 200

    def get_server_info(self) -> dict[str, Any]:
        """``Runtime``'s keys (model_path, context_length, chat_template, stats), from
        the server's ``/server_info``, which is kept whole under ``server_info``."""
        info = self._call("GET", "/server_info")
        return {
            "model_path": info.get("model_path"),
            "context_length": info.get("context_length"),
            "chat_template": self._chat_template.name,
            "stats": (info.get("internal_states") or [{}])[0],
            "server_info": info,
        }

    def shutdown(self) -> None:
        self._client.close()

    def __enter__(self) -> RuntimeEndpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ---- HTTP ----------------------------------------------------------------------------

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        """The JSON answer of a call that must succeed."""
        response = self._send(method, path, body)
        _raise_for(response)
        return response.json()

    def _send(self, method: str, path: str, body: Any = None) -> httpx.Response:
        try:
            return self._client.request(method, path, json=body)
        except httpx.HTTPError as e:
            raise EndpointError(f"{self.base_url}{path}: {e!r}") from e


def _same_logprob_options(requests: Sequence[GenerateRequest]) -> list[list[GenerateRequest]]:
    """Runs of consecutive requests that one /generate body can carry."""
    groups: list[list[GenerateRequest]] = []
    for r in requests:
        key = (r.return_logprob, r.logprob_start_len, r.top_logprobs_num)
        last = groups[-1][0] if groups else None
        if last and (last.return_logprob, last.logprob_start_len, last.top_logprobs_num) == key:
            groups[-1].append(r)
        else:
            groups.append([r])
    return groups


def _raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = response.text
    where = f"{response.request.method} {response.request.url.path}"
    if response.status_code < 500:
        raise InvalidRequestError(f"{message} ({where}: {response.status_code})")
    raise EndpointError(f"{where} failed with {response.status_code}: {message}")


def _sse_data(lines: Iterator[str]) -> Iterator[str]:
    """The data of each server-sent event up to ``data: [DONE]``."""
    for line in lines:
        if line.startswith("data:"):
            data = line[5:].strip()
            if data == "[DONE]":
                return
            yield data
