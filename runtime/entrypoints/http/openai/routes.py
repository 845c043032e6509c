"""The OpenAI-compatible routes: ``/v1/chat/completions``, ``/v1/completions``,
``/v1/models``.

    body --parse--> pydantic request --(template, bound, tokenize)--> ConvertedCall
         --admission ticket--> engine.async_generate_requests / async_stream_requests
         --> ResponseFormatter --> JSON, or SSE events ending in ``data: [DONE]``

A streamed request waits for its first chunk before answering, so every error
the engine raises on submission (a bad grammar, an oversized prompt) is still a
4xx with a JSON body; an error after that is an ``error`` event, then ``[DONE]``.
A large body's call is built in a worker thread (``build_off_loop``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import Response

from radixlm.runtime.entrypoints.call_streams import observed
from radixlm.runtime.entrypoints.http.openai.convert import (
    ConvertedCall,
    chat_call,
    completion_call,
)
from radixlm.runtime.entrypoints.http.openai.format import ResponseFormatter, finish_reason, usage
from radixlm.runtime.entrypoints.http.openai.prompts import OFF_LOOP_BODY_BYTES
from radixlm.runtime.entrypoints.http.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
)
from radixlm.runtime.entrypoints.http.openai.reasoning_output import ReasoningPlan, reasoning_plan
from radixlm.runtime.entrypoints.http.server.admission import Ticket
from radixlm.runtime.entrypoints.http.server.body import ItemCap, parse_body
from radixlm.runtime.entrypoints.http.server.errors import api_error_from
from radixlm.runtime.entrypoints.http.server.json_body import json_response
from radixlm.runtime.entrypoints.http.server.request_context import note_model, record_of
from radixlm.runtime.entrypoints.http.server.sse import SSE_DONE, sse_event
from radixlm.runtime.entrypoints.http.server.state import ServerState, in_worker
from radixlm.runtime.entrypoints.http.server.streaming import (
    ClientGone,
    EventStreamResponse,
    client_gone_response,
    until_disconnected,
)
from radixlm.runtime.executor.cpu_threads import release_free_memory
from radixlm.runtime.io.messages import GenerateOutput, StreamChunk
from radixlm.runtime.reasoning import ReasoningSplitter
from radixlm.runtime.tools.parser import ToolCallStream, tool_finish_reason

__all__ = ["build_off_loop", "item_caps", "router", "serve_call"]

T = TypeVar("T")

router = APIRouter()


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    state: ServerState = request.app.state.server
    return {
        "object": "list",
        "data": [
            {
                "id": name,
                "object": "model",
                "created": 0,
                "owned_by": "radixlm",
                "root": str(state.model_path),
            }
            for name in state.model_ids
        ],
    }


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    state: ServerState = request.app.state.server
    body = await parse_body(request, ChatCompletionRequest, item_caps(state, "messages"))
    state.check_model(body.model)
    note_model(request, body.model)
    call = await build_off_loop(request, chat_call, body, state.prompts, state.engine.config.limits)
    fmt = ResponseFormatter("chat", body.model, state.tokens)
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    prompt = [m.text() for m in body.messages]
    reasoning = reasoning_plan(
        state.engine.reasoning,
        call.requests[0].input_ids,
        body.separate_reasoning,
        body.include_reasoning,
    )

    def respond(outputs: list[GenerateOutput]) -> dict:
        state.log_request("chat", prompt, [o.text for o in outputs])
        choices = [_chat_choice(fmt, out, call, reasoning) for out in outputs]
        totals = usage(outputs, call.n, reasoning)
        return fmt.envelope("chat.completion", choices, {"usage": totals})

    def events(chunks: AsyncIterator[StreamChunk]) -> AsyncIterator[bytes]:
        return _chat_events(chunks, fmt, call, include_usage, state, prompt, reasoning)

    return await serve_call(request, state, call, respond, events)


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    state: ServerState = request.app.state.server
    body = await parse_body(request, CompletionRequest)
    state.check_model(body.model)
    note_model(request, body.model)
    call = await build_off_loop(request, completion_call, body, state.prompts)
    fmt = ResponseFormatter("completion", body.model, state.tokens)
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    echo = call.prompt_texts if body.echo else None

    def respond(outputs: list[GenerateOutput]) -> dict:
        state.log_request("completion", call.prompt_texts, [o.text for o in outputs])
        choices = [
            fmt.completion_choice(out, None if echo is None else echo[out.index // call.n])
            for out in outputs
        ]
        return fmt.envelope("text_completion", choices, {"usage": usage(outputs, call.n)})

    def events(chunks: AsyncIterator[StreamChunk]) -> AsyncIterator[bytes]:
        return _completion_events(chunks, fmt, call, include_usage, echo, state)

    return await serve_call(request, state, call, respond, events)


def item_caps(state: ServerState, conversation: str) -> dict[str, ItemCap]:
    """The caps on a body's ``conversation`` list (chat's messages, Responses' input)
    and its tools."""
    config = state.config
    return {
        conversation: ItemCap(config.max_messages, "max_messages"),
        "tools": ItemCap(config.max_tools, "max_tools"),
    }


async def build_off_loop(request: Request, build: Callable[..., T], *args: Any) -> T:
    """``build(*args)``: a call's prompt (rendered, bounded, tokenized) and parameters,
    in a worker thread when the request's body is large (rendering and tokenizing
    megabytes would stall every other request), with the memory it freed, refused or
    not, handed back to the OS after."""
    if len(await request.body()) <= OFF_LOOP_BODY_BYTES:
        return build(*args)
    try:
        return await in_worker(build, *args)
    finally:
        await in_worker(release_free_memory)


async def serve_call(request: Request, state: ServerState, call: ConvertedCall, respond, events):
    """Admits the call, runs it, answers with ``respond(outputs)`` or a stream of
    ``events(chunks)``; the ticket is held until the response is complete. The engine's
    requests carry the HTTP request's id, and their outputs go to its record (traces)."""
    record = record_of(request)
    requests = call.requests
    if record is not None:
        rid = record.engine_request_id
        requests = tuple(dataclasses.replace(r, request_id=rid) for r in requests)
    ticket = state.admission.acquire(call.num_samples, call.n)
    try:
        if call.stream:
            chunks = state.engine.async_stream_requests(requests)
            first = await until_disconnected(request, _first_chunk(chunks))
            chunks = _prepend(first, chunks)
            if record is not None:
                chunks = observed(chunks, record.add_output)
            stream = EventStreamResponse(events(chunks), ticket.release)
            ticket = None  # the stream releases it
            return stream
        work = state.engine.async_generate_requests(requests)
        outputs = await until_disconnected(request, work)
        if record is not None:
            record.outputs.extend(outputs)
        return await json_response(lambda: respond(outputs))
    except ClientGone:
        return client_gone_response()
    except ValueError as e:
        raise api_error_from(e, dict(call.param_names)) from e
    finally:
        if isinstance(ticket, Ticket):
            ticket.release()


async def _first_chunk(chunks: AsyncIterator[StreamChunk]) -> StreamChunk:
    try:
        return await chunks.__anext__()
    except BaseException:
        await chunks.aclose()  # type: ignore[attr-defined]
        raise


async def _prepend(first: StreamChunk, rest: AsyncIterator[StreamChunk]):
    try:
        yield first
        async for chunk in rest:
            yield chunk
    finally:
        await rest.aclose()  # type: ignore[attr-defined]


def _chat_choice(
    fmt: ResponseFormatter, out: GenerateOutput, call: ConvertedCall, plan: ReasoningPlan | None
) -> dict:
    """The choice of one output; with a reasoning plan, the reasoning split out first
    (``reasoning_content``), so tool calls and content are read from the answer alone."""
    if plan is None:
        return fmt.chat_choice(out, call.tool_parser)
    answer, reasoning = plan.split(out)
    choice = fmt.chat_choice(answer, call.tool_parser)
    choice["message"]["reasoning_content"] = reasoning
    return choice


async def _chat_events(
    chunks,
    fmt: ResponseFormatter,
    call: ConvertedCall,
    include_usage: bool,
    state: ServerState,
    prompt: Any,
    plan: ReasoningPlan | None = None,
) -> AsyncIterator[bytes]:
    """Per choice: a role delta first, content (or, with tools, ``tool_calls``) deltas
    with their tokens' logprobs (with a reasoning plan, ``reasoning_content`` deltas
    before them), then an empty delta carrying ``finish_reason``; the usage chunk;
    ``[DONE]``."""
    extra = {"usage": None} if include_usage else {}
    finals: dict[int, GenerateOutput] = {}
    parser = call.tool_parser
    calls: dict[int, ToolCallStream] = {}
    splitters: dict[int, ReasoningSplitter] = {}
    started: set[int] = set()

    def chunk(choice: dict) -> bytes:
        return sse_event(fmt.envelope("chat.completion.chunk", [choice], extra))

    try:
        async for c in chunks:
            index = c.index
            if index not in started:
                started.add(index)
                if parser is not None:
                    calls[index] = ToolCallStream(parser)
                if plan is not None:
                    splitters[index] = plan.splitter()
                role = {"role": "assistant", "content": ""}
                yield chunk(fmt.chat_chunk_choice(index, role, None, None))
            new = _new_logprobs(c)
            reason = finish_reason(c.finish_reason)
            text, thought = c.delta, None
            if plan is not None:
                parts = splitters[index].feed(c.delta, c.finished)
                text, thought = parts.content, plan.shown(parts)
            if parser is not None:
                delta = calls[index].feed(text, c.finished).to_openai()
                reason = tool_finish_reason(calls[index].parsed, reason)
            else:
                delta = {"content": text} if text else {}
            if thought:
                delta = {"reasoning_content": thought, **delta}
            if delta or new:
                yield chunk(fmt.chat_chunk_choice(index, delta or {"content": ""}, new, None))
            if c.finished:
                finals[index] = c.output
                yield chunk(fmt.chat_chunk_choice(index, {}, None, reason))
        outputs = [finals[i] for i in sorted(finals)]
        state.log_request("chat", prompt, [o.text for o in outputs])
        if include_usage:
            totals = usage(outputs, call.n, plan)
            yield sse_event(fmt.envelope("chat.completion.chunk", [], {"usage": totals}))
    except Exception as e:  # after the first chunk: tell the client in the stream
        yield sse_event(api_error_from(e, dict(call.param_names)).body())
    yield SSE_DONE


async def _completion_events(
    chunks,
    fmt: ResponseFormatter,
    call: ConvertedCall,
    include_usage: bool,
    echo: tuple[str, ...] | None,
    state: ServerState,
) -> AsyncIterator[bytes]:
    """Per choice: text deltas (the echoed prompt first), the last with ``finish_reason``."""
    extra = {"usage": None} if include_usage else {}
    offsets: dict[int, int] = {}  # choice -> characters streamed
    finals: dict[int, GenerateOutput] = {}
    try:
        async for c in chunks:
            index, text = c.index, c.delta
            if index not in offsets:
                offsets[index] = 0
                if echo is not None:
                    text = echo[index // call.n] + text
            new = _new_logprobs(c)
            logprobs = None
            if new is not None:
                logprobs = fmt.completion_chunk_logprobs(new, offsets[index])
            offsets[index] += len(text)
            reason = finish_reason(c.finish_reason)
            if text or new or c.finished:
                choice = {
                    "index": index,
                    "text": text,
                    "logprobs": logprobs,
                    "finish_reason": reason,
                }
                yield sse_event(fmt.envelope("text_completion", [choice], extra))
            if c.finished:
                finals[index] = c.output
        outputs = [finals[i] for i in sorted(finals)]
        state.log_request("completion", call.prompt_texts, [o.text for o in outputs])
        if include_usage:
            yield sse_event(fmt.envelope("text_completion", [], {"usage": usage(outputs, call.n)}))
    except Exception as e:
        yield sse_event(api_error_from(e, dict(call.param_names)).body())
    yield SSE_DONE


def _new_logprobs(chunk: StreamChunk) -> list | None:
    """The chunk's new output tokens' logprobs (None: logprobs were not asked for)."""
    return list(chunk.new_output_logprobs) if chunk.logprob.enabled else None
