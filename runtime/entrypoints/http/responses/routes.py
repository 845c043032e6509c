"""OpenAI's Responses API: ``POST /v1/responses``, ``GET`` / ``DELETE /v1/responses/{id}``.

    body --parse--> ResponsesRequest (+ the stored conversation of previous_response_id)
         --(responses_call; a large body's in a worker)--> the chat route's ConvertedCall
         --serve_call (admission, engine, disconnects)--> ResponseBuilder
         --> the response JSON, or typed SSE events (``event: <type>`` + ``data:``)
    finished, with store (the default): body and conversation --> ResponseStore

Streamed, there is no ``[DONE]`` (OpenAI sends none on this route): the last event
is ``response.completed`` or ``response.incomplete``, or ``error`` after a failure.
A response is stored before its last event is sent, so a client that has read it
can continue from it at once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from radixlm.runtime.entrypoints.http.openai.reasoning_output import reasoning_plan
from radixlm.runtime.entrypoints.http.openai.routes import build_off_loop, item_caps, serve_call
from radixlm.runtime.entrypoints.http.responses.convert import (
    RESPONSES_PARAM_NAMES,
    ResponsesCall,
    renamed,
    responses_call,
)
from radixlm.runtime.entrypoints.http.responses.format import ResponseBuilder, ResponseEcho
from radixlm.runtime.entrypoints.http.responses.protocol import ResponsesRequest
from radixlm.runtime.entrypoints.http.responses.store import ResponseStore, StoredResponse
from radixlm.runtime.entrypoints.http.server.body import parse_body
from radixlm.runtime.entrypoints.http.server.errors import NOT_FOUND, APIError, api_error_from
from radixlm.runtime.entrypoints.http.server.guard import key_owner
from radixlm.runtime.entrypoints.http.server.json_body import json_bytes
from radixlm.runtime.entrypoints.http.server.request_context import note_model
from radixlm.runtime.entrypoints.http.server.sse import sse_event
from radixlm.runtime.entrypoints.http.server.state import ServerState
from radixlm.runtime.io.messages import GenerateOutput, StreamChunk

__all__ = ["router"]

router = APIRouter()


@router.post("/v1/responses")
async def create_response(request: Request) -> Response:
    state: ServerState = request.app.state.server
    store: ResponseStore = request.app.state.responses
    body = await parse_body(request, ResponsesRequest, item_caps(state, "input"))
    state.check_model(body.model)
    note_model(request, body.model)
    previous = None
    if body.previous_response_id is not None:
        previous = _stored(request, body.previous_response_id, "previous_response_id")
    history = None if previous is None else previous.conversation
    limits = state.engine.config.limits
    call = await build_off_loop(request, responses_call, body, history, state.prompts, limits)
    echo = _echo(body)
    parser = call.chat.tool_parser
    reasoning = reasoning_plan(state.engine.reasoning, call.chat.requests[0].input_ids)

    def finished(builder: ResponseBuilder, response: dict[str, Any]) -> bytes:
        """The response as JSON, kept in the store when the request asked so."""
        encoded = json_bytes(response)
        state.log_request("responses", call.conversation, builder.assistant_message())
        if body.store is not False:
            store.put(_entry(echo.id, encoded, call, builder, key_owner(request.scope)))
        return encoded

    def respond(outputs: list[GenerateOutput]) -> Any:
        builder = ResponseBuilder(echo, parser, reasoning)
        builder.feed(outputs[0].text, True)
        _, response = builder.finish(outputs[0])
        return orjson.Fragment(finished(builder, response))  # encoded once, stored as is

    def events(chunks: AsyncIterator[StreamChunk]) -> AsyncIterator[bytes]:
        return _events(chunks, ResponseBuilder(echo, parser, reasoning), finished)

    try:
        return await serve_call(request, state, call.chat, respond, events)
    except APIError as e:
        raise renamed(e) from e


@router.get("/v1/responses/{response_id}")
async def get_response(request: Request, response_id: str) -> Response:
    entry = _stored(request, response_id, "response_id")
    return Response(entry.body, media_type="application/json")


@router.delete("/v1/responses/{response_id}")
async def delete_response(request: Request, response_id: str) -> dict[str, Any]:
    store: ResponseStore = request.app.state.responses
    if not store.delete(response_id, key_owner(request.scope)):
        raise _not_found(response_id, "response_id")
    return {"id": response_id, "object": "response.deleted", "deleted": True}


async def _events(
    chunks: AsyncIterator[StreamChunk],
    builder: ResponseBuilder,
    finished: Callable[[ResponseBuilder, dict[str, Any]], bytes],
) -> AsyncIterator[bytes]:
    """The lifecycle events, each item's events as the text arrives, the closing ones."""
    try:
        for event in builder.start():
            yield _frame(event)
        final = None
        async for chunk in chunks:
            for event in builder.feed(chunk.delta, chunk.finished):
                yield _frame(event)
            if chunk.finished:
                final = chunk.output
        assert final is not None, "the engine's stream ended without its finished chunk"
        closing, response = builder.finish(final)
        finished(builder, response)
        for event in closing:
            yield _frame(event)
    except Exception as e:  # after the first chunk: tell the client in the stream
        yield _frame(builder.error(api_error_from(e, RESPONSES_PARAM_NAMES).body()))
    finally:  # a client gone mid-stream closes us here: abort the request now, not at GC
        await chunks.aclose()  # type: ignore[attr-defined]


def _frame(event: dict[str, Any]) -> bytes:
    """One SSE event named by its ``type``, as OpenAI frames this route's events."""
    return b"event: " + event["type"].encode() + b"\n" + sse_event(event)


def _entry(
    response_id: str,
    encoded: bytes,
    call: ResponsesCall,
    builder: ResponseBuilder,
    owner: str | None,
) -> StoredResponse:
    conversation = [*call.conversation, builder.assistant_message()]
    return StoredResponse(response_id, encoded, json_bytes(conversation), owner)


def _stored(request: Request, response_id: str, param: str) -> StoredResponse:
    """The response stored with the request's key (another key's is not found)."""
    store: ResponseStore = request.app.state.responses
    entry = store.get(response_id, key_owner(request.scope))
    if entry is None:
        raise _not_found(response_id, param)
    return entry


def _not_found(response_id: str, param: str) -> APIError:
    return APIError(
        NOT_FOUND,
        f"no stored response has the id {response_id!r} (responses are kept in memory, "
        "only with store: true, and the least recently used are dropped past the server's "
        "max_stored_responses / max_stored_response_bytes)",
        param,
        code="response_not_found",
    )


def _echo(body: ResponsesRequest) -> ResponseEcho:
    """The request's settings as every body of its response repeats them."""
    fmt = body.text.format if body.text is not None else None
    choice = body.tool_choice
    if choice is not None and not isinstance(choice, str):
        choice = choice.model_dump()
    settings = {
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "max_tool_calls": body.max_tool_calls,
        "metadata": body.metadata or {},
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id,
        "reasoning": {"effort": None, "summary": None},
        "service_tier": "default",
        "store": body.store is not False,
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "text": {
            "format": {"type": "text"}
            if fmt is None
            else fmt.model_dump(by_alias=True, exclude_none=True),
            "verbosity": "medium",
        },
        "tool_choice": "auto" if choice is None else choice,
        "tools": [tool.model_dump() for tool in body.tools or ()],
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "truncation": "disabled",
        "user": body.user,
        "background": False,
    }
    return ResponseEcho(body.model, settings)
