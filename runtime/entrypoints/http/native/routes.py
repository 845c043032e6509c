"""SGLang's native routes: ``/generate``, ``/abort_request``, ``/flush_cache``,
``/server_info`` (also ``/get_server_info``), ``/model_info`` (also ``/get_model_info``),
``/get_load``, ``/health``, ``/health_generate``; ``/tokenize``, ``/detokenize`` (vLLM's
shapes), which the DSL's ``RuntimeEndpoint`` tokenizes programs with; and ``/metrics``
(Prometheus).

SGLang's router (``sglang-router``) registers a worker from ``/server_info`` (its
``served_model_name`` becomes the model id the router lists) and ``/model_info``,
health-checks ``/health``, fans ``/flush_cache`` out to every worker, and under its
``power_of_two`` policy polls ``/get_load``: one entry per data-parallel rank (one here),
whose ``num_tokens`` (the KV slots running requests hold plus the waiting requests'
tokens) is the load it compares.

``/get_model_info`` also carries what a DSL client needs to render role blocks
exactly as in process: the chat template's role blocks (``ChatTemplate.to_dict``)
and the BOS token's text.

``/generate`` takes the arguments of ``Engine.generate`` as a JSON body and
answers with its dicts (``text``, ``output_ids``, ``meta_info``); streamed, each
event holds the text so far (SGLang's shape; only the new text with
``--incremental-streaming-output``) plus radixlm's ``delta``, and the output logprobs of
its new tokens only (SGLang's; ``StreamChunk.event_dict``).
``return_text_in_logprobs`` fills the third element of every logprob triple
(``[logprob, token_id, text]``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict

from radixlm.runtime.entrypoints.http.compat.fields import (
    GENERATE,
    AcceptsForeignFields,
    screen_sampling_params,
)
from radixlm.runtime.entrypoints.http.server.body import parse_body
from radixlm.runtime.entrypoints.http.server.errors import (
    INVALID,
    NOT_FOUND,
    APIError,
    api_error_from,
)
from radixlm.runtime.entrypoints.http.server.json_body import json_response
from radixlm.runtime.entrypoints.http.server.metrics import CONTENT_TYPE, render
from radixlm.runtime.entrypoints.http.server.request_context import record_of
from radixlm.runtime.entrypoints.http.server.sse import SSE_DONE, sse_event
from radixlm.runtime.entrypoints.http.server.state import ServerState, in_worker
from radixlm.runtime.entrypoints.http.server.streaming import (
    ClientGone,
    EventStreamResponse,
    client_gone_response,
    until_disconnected,
)
from radixlm.runtime.entrypoints.http.server.token_text import TokenTexts
from radixlm.runtime.errors import InvalidRequestError
from radixlm.runtime.io.messages import StreamShape
from radixlm.runtime.reasoning import reasoning_format, split_reasoning

__all__ = ["router"]

router = APIRouter()

# A whole reply this long is split in a worker thread, where splitting costs more than
# the hand-off (benchmarks/README.md, "Hostile input").
_SPLIT_ON_LOOP_CHARS = 64 * 1024

_LOGPROB_KEYS = ("input_token_logprobs", "output_token_logprobs")
_TOP_KEYS = ("input_top_logprobs", "output_top_logprobs")


class GenerateBody(AcceptsForeignFields):
    """``Engine.generate``'s arguments, strict about types (``"stream": "yes"`` and
    ``"input_ids": ["1"]`` are 400s, as on the OpenAI routes); the engine validates
    the values and the sampling parameters. The rest of SGLang's ``GenerateReqInput``
    (``model``, ``rid``, ...) is accepted as ``compat.fields.GENERATE`` says."""

    foreign_fields = GENERATE

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    return_logprob: bool = False
    logprob_start_len: int | None = None
    top_logprobs_num: int | None = None
    return_text_in_logprobs: bool = False
    stream: bool = False
    no_logs: bool = False  # SGLang's: not logged even with --log-requests

    def num_samples(self) -> int:
        prompts = self.text if self.text is not None else self.input_ids
        num_prompts = len(prompts) if isinstance(prompts, list) and _is_batch(prompts) else 1
        return num_prompts * self.samples_per_prompt()

    def samples_per_prompt(self) -> int:
        """The largest ``n`` of the sampling params (1 when none says; a bad ``n`` is
        the engine's to refuse)."""
        params = self.sampling_params or {}
        ns = [p.get("n", 1) for p in params] if isinstance(params, list) else [params.get("n", 1)]
        per_prompt = max((n for n in ns if type(n) is int), default=1)
        return max(per_prompt, 1)


class TokenizeBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    text: str
    add_special_tokens: bool = True


class DetokenizeBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    tokens: list[int]
    skip_special_tokens: bool = False


class AbortBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    rid: str


class SeparateReasoningBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    text: str
    reasoning_parser: str | None = None  # None: the server's own


def _is_batch(prompts: list) -> bool:
    return bool(prompts) and not isinstance(prompts[0], int)


@router.post("/generate")
async def generate(request: Request) -> Response:
    state: ServerState = request.app.state.server
    body = await parse_body(request, GenerateBody)
    record = record_of(request)
    sampling_params = screen_sampling_params(body.sampling_params)
    ticket = state.admission.acquire(body.num_samples(), body.samples_per_prompt())
    texts = state.tokens if body.return_text_in_logprobs else None
    try:
        result = state.engine.async_generate(
            prompt=body.text,
            sampling_params=sampling_params,
            input_ids=body.input_ids,
            return_logprob=body.return_logprob,
            logprob_start_len=body.logprob_start_len,
            top_logprobs_num=body.top_logprobs_num,
            stream=body.stream,
            # the request's X-Request-Id; its outputs go to its trace
            request_id=None if record is None else record.engine_request_id,
            on_output=None if record is None else record.add_output,
            stream_shape=_STREAM_SHAPES[state.config.incremental_streaming_output],
        )
        if body.stream:
            chunks = await until_disconnected(request, result)
            first = await until_disconnected(request, _first(chunks))
            events = _generate_events(first, chunks, texts, state, body)
            stream, ticket = EventStreamResponse(events, ticket.release), None
            return stream
        out = await until_disconnected(request, result)
        if not body.no_logs:
            state.log_request("generate", body.text or body.input_ids, out)
        return await json_response(lambda: _with_texts(out, texts))
    except ClientGone:
        return client_gone_response()
    except ValueError as e:
        raise api_error_from(e) from e
    finally:
        if ticket is not None:
            ticket.release()


# SGLang's incremental_streaming_output: each event's text and ids new, else so far
_STREAM_SHAPES: dict[bool, StreamShape] = {True: "incremental", False: "cumulative"}


async def _first(chunks: AsyncIterator[dict]) -> dict:
    try:
        return await chunks.__anext__()
    except BaseException:
        await chunks.aclose()  # type: ignore[attr-defined]
        raise


async def _generate_events(
    first: dict,
    chunks: AsyncIterator[dict],
    texts: TokenTexts | None,
    state: ServerState,
    body: GenerateBody,
) -> AsyncIterator[bytes]:
    try:
        yield await _event(first, texts)
        async for chunk in chunks:
            yield await _event(chunk, texts)
        if not body.no_logs:
            state.log_request("generate", body.text or body.input_ids, "(streamed)")
    except Exception as e:  # after the first event: the error is an event
        yield sse_event(api_error_from(e).body())
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]
    yield SSE_DONE


async def _event(chunk: dict, texts: TokenTexts | None) -> bytes:
    """One SSE event (``StreamChunk.event_dict``: the new logprobs, the text and ids so far
    or new); one with logprobs is encoded in a worker thread."""
    if "output_token_logprobs" in chunk["meta_info"]:
        return await in_worker(lambda: sse_event(_with_texts(chunk, texts)))
    return sse_event(chunk)


def _with_texts(result: dict | list[dict], texts: TokenTexts | None) -> Any:
    """SGLang's ``return_text_in_logprobs``: each ``(logprob, id, None)`` gets its text."""
    if texts is None:
        return result
    if isinstance(result, list):
        return [_with_texts(r, texts) for r in result]
    meta = dict(result["meta_info"])
    for key in _LOGPROB_KEYS:
        if key in meta:
            meta[key] = [_triple(e, texts) for e in meta[key]]
    for key in _TOP_KEYS:
        if key in meta:
            meta[key] = [None if t is None else [_triple(e, texts) for e in t] for t in meta[key]]
    return {**result, "meta_info": meta}


def _triple(entry: Any, texts: TokenTexts) -> list:
    logprob, token_id, _ = entry
    return [logprob, token_id, texts.text(token_id)]


@router.post("/abort_request")
async def abort_request(request: Request) -> Response:
    state: ServerState = request.app.state.server
    body = await parse_body(request, AbortBody)
    if not state.engine.abort(body.rid):
        raise APIError(
            NOT_FOUND, f"no request {body.rid!r} is queued or running", "rid", "request_not_found"
        )
    return Response(status_code=200)


@router.api_route("/flush_cache", methods=["GET", "POST"])
async def flush_cache(request: Request) -> Response:
    state: ServerState = request.app.state.server
    try:
        await in_worker(state.engine.flush_cache)
    except ValueError as e:
        raise api_error_from(e) from e
    return PlainTextResponse("Cache flushed.\n")


@router.get("/server_info")
@router.get("/get_server_info")
async def server_info(request: Request) -> dict[str, Any]:
    """The options (the API key left out) and the engine's live counters."""
    state: ServerState = request.app.state.server
    stats = state.engine.get_stats()
    internal = {**dataclasses.asdict(stats), "kv_used": stats.kv_used}
    server = dataclasses.asdict(state.config)
    server["api_key"] = "<set>" if state.config.api_keys else None
    return {
        "model_path": str(state.model_path),
        "served_model_name": state.model_name,  # SGLang's: the router's model id
        "served_model_names": list(state.model_ids),
        "dp_size": 1,  # one engine per server; replicas sit behind the router
        "max_total_tokens": stats.kv_capacity,  # the KV pool's capacity in tokens
        "kv_cache_dtype": stats.placement.kv_format,
        "kv_bytes_per_token": stats.placement.kv_bytes_per_token,
        "context_length": state.engine.context_length,
        "server": server,
        "tool_call_format": state.prompts.tool_calling.format.name,  # given or detected
        "engine": _engine_options(state),
        "num_admitted_generations": state.admission.in_use,
        "internal_states": [internal],
    }


def _engine_options(state: ServerState) -> dict[str, Any]:
    config = state.engine.config
    out = {}
    for part in dataclasses.fields(config):
        value = getattr(config, part.name)
        out.update(
            dataclasses.asdict(value) if dataclasses.is_dataclass(value) else {part.name: value}
        )
    return out


@router.get("/model_info")
@router.get("/get_model_info")
async def model_info(request: Request) -> dict[str, Any]:
    state: ServerState = request.app.state.server
    return {
        "model_path": str(state.model_path),
        "tokenizer_path": str(state.model_path),
        "model_name": state.model_name,
        "served_model_name": state.model_name,
        "is_generation": True,
        **_hf_config_facts(state.model_path),
        "context_length": state.engine.context_length,
        "chat_template": state.chat_template.to_dict(),
        "bos_token": state.engine.tokenizer.bos_token,
    }


@functools.lru_cache(maxsize=8)
def _hf_config_facts(model_path: Path) -> dict[str, Any]:
    """SGLang's ``model_type`` and ``architectures``, from a model directory's
    config.json (None for a GGUF file, whose config lives inside it)."""
    try:
        config = json.loads((model_path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    return {"model_type": config.get("model_type"), "architectures": config.get("architectures")}


@router.get("/get_load")
async def get_load(request: Request) -> list[dict[str, int]]:
    """SGLang's load report: one entry per data-parallel rank (this engine is rank 0).
    ``num_tokens``: KV slots held by running requests plus the waiting requests' tokens."""
    state: ServerState = request.app.state.server
    stats = state.engine.get_stats()
    return [
        {
            "dp_rank": 0,
            "num_reqs": stats.num_running + stats.num_waiting,
            "num_waiting_reqs": stats.num_waiting,
            "num_tokens": stats.kv_used + stats.num_waiting_tokens,
        }
    ]


@router.post("/tokenize")
async def tokenize(request: Request) -> dict[str, Any]:
    """The ids the engine feeds the model for ``text`` (vLLM's ``{"tokens", "count"}``)."""
    state: ServerState = request.app.state.server
    body = await parse_body(request, TokenizeBody)
    try:
        encoded = await in_worker(
            lambda: state.engine.tokenizer(body.text, add_special_tokens=body.add_special_tokens)
        )
    except (TypeError, ValueError) as e:  # e.g. a lone surrogate
        raise api_error_from(InvalidRequestError(f"text cannot be tokenized: {e}")) from e
    tokens = list(encoded["input_ids"])
    return {"tokens": tokens, "count": len(tokens), "max_model_len": state.engine.context_length}


@router.post("/detokenize")
async def detokenize(request: Request) -> dict[str, Any]:
    state: ServerState = request.app.state.server
    body = await parse_body(request, DetokenizeBody)
    vocab_size = len(state.engine.tokenizer)
    bad = [t for t in body.tokens if not 0 <= t < vocab_size]
    if bad:
        message = f"token ids {bad[:5]} are outside this vocabulary of {vocab_size}"
        raise api_error_from(InvalidRequestError(message))
    text = await in_worker(
        lambda: state.engine.tokenizer.decode(
            body.tokens, skip_special_tokens=body.skip_special_tokens
        )
    )
    return {"text": text}


@router.post("/separate_reasoning")
async def separate_reasoning(request: Request) -> dict[str, Any]:
    """SGLang's: ``text`` (a whole reply) split by a reasoning parser, the named one or
    the server's, as if the reply started where the family's template leaves it."""
    state: ServerState = request.app.state.server
    body = await parse_body(request, SeparateReasoningBody)
    if body.reasoning_parser is not None:
        try:
            fmt = reasoning_format(body.reasoning_parser)
        except ValueError as e:
            raise APIError(INVALID, str(e), "reasoning_parser") from e
    elif state.engine.reasoning is not None:
        fmt = state.engine.reasoning.format
    else:
        message = "this server has no reasoning parser: name one in reasoning_parser"
        raise APIError(INVALID, message, "reasoning_parser")
    if len(body.text) > _SPLIT_ON_LOOP_CHARS:  # linear, but not on the event loop at length
        parts = await in_worker(split_reasoning, body.text, fmt)
    else:
        parts = split_reasoning(body.text, fmt)
    return {"text": parts.content, "reasoning_text": parts.reasoning}


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """Prometheus' text format (see ``metrics.py`` for the names)."""
    state: ServerState = request.app.state.server
    body = await in_worker(render, state.metrics)
    return Response(body, media_type=CONTENT_TYPE)


@router.get("/health")
async def health() -> Response:
    return Response(status_code=200)


@router.get("/health_generate")
async def health_generate(request: Request) -> Response:
    """Readiness: 200 once the engine generated a probe's token within
    ``--health-generate-timeout-s``, else 503 (``health.py``)."""
    state: ServerState = request.app.state.server
    return Response(status_code=200 if await state.health.check() else 503)
