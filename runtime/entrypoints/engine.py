"""The offline engine: SGLang-compatible ``generate`` over a background loop.

    caller (a thread or an event loop)          engine loop thread
    ----------------------------------          ------------------
    generate() / async_generate() (dicts)       while running:
    generate_requests() / stream_requests()       apply queued LoopMessages
      and their async_ forms: one core,           (AddRequests, Abort, FlushCache,
      CallPreparer + CallStreams                   ReadStats, Wake)
      check + tokenize (raises here)
      a constraint not cached: submitted to
        the compile workers (their own driver
        thread); wait for it (blocking /
        awaited)
      AddRequests(TokenizedRequest...) ------->   step(): schedule -> run -> process
      <- per-call delta queue  <--------------    publish each OutputDelta to its sink
      OutputAssembler: deltas -> StreamChunks     (call_streams.py)

Everything a caller can get wrong is checked in the caller's context, before
anything is queued, so bad input raises a ``ValueError`` subclass and never
reaches the loop. A request crosses from its caller to the loop once, and meets a
third and fourth context only when its constraint is not cached (the compile driver
thread and a compile worker process).

The loop thread itself (its lifecycle, message handling, ``step``) is
``engine_loop.EngineLoop``; what the loop owns (the scheduler's counters) is read
through it (``get_stats``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import queue
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from radixlm.runtime.config import EngineConfig
from radixlm.runtime.entrypoints.call_prep import CallPreparer
from radixlm.runtime.entrypoints.call_streams import Call, CallStreams, observed
from radixlm.runtime.entrypoints.engine_loop import EngineLoop
from radixlm.runtime.entrypoints.stats import EngineStats, read_stats
from radixlm.runtime.errors import EngineStoppedError
from radixlm.runtime.io.context_room import ContextRoom
from radixlm.runtime.io.messages import (
    FlushCache,
    GenerateOutput,
    GenerateRequest,
    ReadStats,
    StreamChunk,
    StreamShape,
)
from radixlm.runtime.io.sglang_args import requests_of
from radixlm.runtime.reasoning import ReasoningMarkers

__all__ = ["Engine", "EngineStats"]


class Engine:
    """Loads a model and serves ``generate`` calls from any thread or event loop.

    Args are the flat options of ``EngineConfig`` (``model_path``, ``dtype``,
    ``max_total_tokens``, ``chunked_prefill_size``, ``num_threads``, ...); see
    ``radixlm generate --help`` for all of them.

    Raises:
        ModelNotFoundError: the default model is not pulled / the path is missing.
        ConfigError: an unknown option or a bad value.
    """

    def __init__(self, **kwargs: Any) -> None:
        self.config = EngineConfig.from_kwargs(**kwargs)
        self._loop = EngineLoop(self.config)  # builds the runtime on its thread
        self._calls = CallStreams(self._loop)
        self._rt = self._loop.runtime
        self._prep = CallPreparer(self._rt.request_builder, self._loop)
        self.tokenizer = self._rt.tokenizer

    # ---- public API --------------------------------------------------------------------

    @property
    def context_length(self) -> int:
        return self._rt.context_len

    @property
    def context_room(self) -> ContextRoom:
        """What one request may hold, prompt plus output: the context and the KV pool
        (the rule every request is checked by)."""
        return self._rt.request_builder.room

    @property
    def failure(self) -> BaseException | None:
        """What stopped the engine when it was not shut down: its loop crashed, or a
        tensor-parallel rank died (``RankFailedError``); None while it runs."""
        return self._loop.error

    def wait_for_compile_worker(self, timeout: float) -> bool:
        """Waits up to ``timeout`` seconds for the grammar compile worker the engine
        started with to be ready; whether it is. Its start (seconds of imports) takes a
        core; a server waits for it before taking requests, so the first passes do not
        share the CPU with it."""
        return self._rt.request_builder.grammars.wait_warm(timeout)

    @property
    def reasoning(self) -> ReasoningMarkers | None:
        """The reasoning parser's markers (None: the engine has no reasoning parser)."""
        return self._rt.reasoning

    @property
    def model_path(self) -> Path:
        """The model served: its directory, or the GGUF file its weights come from."""
        return self._rt.source.path

    @property
    def model_name(self) -> str:
        """The model's name for clients: the hub id the user typed, else the last part
        of ``model_path``."""
        return self._rt.source.name

    def generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict | list[dict] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        return_logprob: bool = False,
        logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None,
        stream: bool = False,
    ) -> dict | list[dict] | Iterator[dict]:
        """Generates completions, SGLang-style.

        A single prompt returns one result dict (a list of ``n`` dicts when
        ``sampling_params["n"] > 1``); a list of prompts returns a list. With
        ``stream=True`` it returns an iterator of chunks; each chunk carries the
        cumulative ``text``/``output_ids`` so far, the new ``delta`` text, and
        ``index`` (position in the batch) for batches.

        Raises:
            InvalidRequestError (a ValueError): bad prompt or parameters; nothing
                of the call was queued.
        """
        call = self._prep.sglang_call(
            prompt,
            sampling_params,
            input_ids,
            return_logprob,
            logprob_start_len,
            top_logprobs_num,
            stream,
        )
        chunks = self._calls.stream(call)
        if stream:
            return _chunk_dicts(chunks, call)
        return _result_dicts(_finals(chunks, call), call)

    def generate_requests(self, requests: Sequence[GenerateRequest]) -> list[GenerateOutput]:
        """The typed ``generate``: the final output of every request's samples, in
        order (prompts in order, each prompt's ``n`` samples together).

        Raises:
            InvalidRequestError (a ValueError): a bad request; nothing was queued.
        """
        call = self._prep.call(list(requests), single=False)
        return _finals(self._calls.stream(call), call)

    def stream_requests(self, requests: Sequence[GenerateRequest]) -> Iterator[StreamChunk]:
        """The typed streaming ``generate``: chunks of every request as they come
        (``chunk.index`` says whose); the last chunk of each is finished.
        Closing the iterator early aborts the requests still running.

        Raises:
            InvalidRequestError (a ValueError): a bad request; nothing was queued.
        """
        return self._calls.stream(self._prep.call(list(requests), single=False))

    async def async_generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict | list[dict] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        return_logprob: bool = False,
        logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None,
        stream: bool = False,
        request_id: str | None = None,
        on_output: Callable[[GenerateOutput], None] | None = None,
        stream_shape: StreamShape = "whole",
    ) -> dict | list[dict] | AsyncIterator[dict]:
        """``generate`` for asyncio: awaits the result, or returns an async iterator.

        Tokenizing runs on the caller's event loop; a constraint's compile (in a
        worker process) is awaited, so a slow schema never blocks the event loop.
        ``request_id``: the caller's id (``GenerateRequest.request_id``: the results' ids
        start with it); ``on_output`` gets each finished output, typed, before its dict
        is made (a server's trace). ``stream_shape``: what each streamed dict holds:
        "whole" (the output so far, ``generate``'s shape), or SGLang's server events
        (``StreamChunk.event_dict``: "cumulative" text and ids, or "incremental")."""
        requests, single = requests_of(
            prompt, sampling_params, input_ids, return_logprob, logprob_start_len,
            top_logprobs_num, stream, self._rt.request_builder.vocab_size,
        )  # fmt: skip
        if request_id is not None:
            requests = [dataclasses.replace(r, request_id=request_id) for r in requests]
        call = await self._prep.call_async(requests, single)
        chunks = self._calls.stream_async(call)
        if on_output is not None:
            chunks = observed(chunks, on_output)
        if stream:
            return _async_chunk_dicts(chunks, call, stream_shape)
        outputs = _finals([c async for c in chunks], call)
        # Dicts of many logprobs take a while to build: not on the caller's event loop.
        return await asyncio.get_running_loop().run_in_executor(None, _result_dicts, outputs, call)

    async def async_generate_requests(
        self, requests: Sequence[GenerateRequest]
    ) -> list[GenerateOutput]:
        """``generate_requests`` for asyncio (a compile is awaited, not waited)."""
        call = await self._prep.call_async(list(requests), single=False)
        return _finals([c async for c in self._calls.stream_async(call)], call)

    async def async_stream_requests(
        self, requests: Sequence[GenerateRequest]
    ) -> AsyncIterator[StreamChunk]:
        """``stream_requests`` for asyncio; cancelling the iteration aborts the requests."""
        call = await self._prep.call_async(list(requests), single=False)
        chunks = self._calls.stream_async(call)
        try:
            async for chunk in chunks:
                yield chunk
        finally:  # cancelled or abandoned: the inner drain aborts what still runs
            await chunks.aclose()

    def abort(self, rid: str) -> bool:
        """Stops request ``rid`` (the ``meta_info["id"]`` of its chunks) and frees its KV.

        Returns whether ``rid`` was queued or running (False: unknown or already done).
        """
        return self._calls.abort(rid)

    def get_stats(self) -> EngineStats:
        """The engine's counters, read on its loop thread (between two steps).

        Raises:
            EngineStoppedError: the loop died (after a shutdown they are read directly).
        """
        if self._loop.stopping:  # no loop runs: nothing changes them any more
            return read_stats(self._rt)
        done: queue.SimpleQueue[EngineStats] = queue.SimpleQueue()
        self._loop.post(ReadStats(read_stats, done.put))
        return self._loop.wait_on(done)

    def flush_cache(self) -> None:
        """Empties the radix cache (e.g. after changing weights).

        Raises:
            InvalidRequestError: requests are running or waiting.
            EngineStoppedError: the engine was shut down, or its loop died.
        """
        if self._loop.stopping:
            raise EngineStoppedError("the engine was shut down")
        done: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()
        self._loop.post(FlushCache(done.put))
        error = self._loop.wait_on(done)
        if error is not None:
            raise error

    def shutdown(self) -> None:
        """Stops the loop; requests still running finish with an abort."""
        self._loop.shutdown()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _chunk_dict(chunk: StreamChunk, call: Call, shape: StreamShape = "whole") -> dict:
    out = chunk.to_dict() if shape == "whole" else chunk.event_dict(shape == "incremental")
    if call.returns_list:
        out["index"] = chunk.index
    return out


def _chunk_dicts(chunks: Iterator[StreamChunk], call: Call) -> Iterator[dict]:
    with contextlib.closing(chunks):  # closing this closes the drain, which aborts
        for chunk in chunks:
            yield _chunk_dict(chunk, call)


async def _async_chunk_dicts(
    chunks: AsyncIterator[StreamChunk], call: Call, shape: StreamShape
) -> AsyncIterator[dict]:
    """A whole chunk carrying logprobs (it repeats all so far) becomes its dict in a
    worker thread, off the caller's event loop."""
    loop = asyncio.get_running_loop()
    try:
        async for chunk in chunks:
            if chunk.logprob.enabled and shape == "whole":
                yield await loop.run_in_executor(None, _chunk_dict, chunk, call)
            else:
                yield _chunk_dict(chunk, call, shape)
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]


def _finals(chunks: Iterable[StreamChunk], call: Call) -> list[GenerateOutput]:
    """Every request's final output, in submission order."""
    final: list[GenerateOutput | None] = [None] * len(call.requests)
    for chunk in chunks:
        if chunk.finished:
            final[chunk.index] = chunk.output
    return final  # type: ignore[return-value]


def _result_dicts(outputs: list[GenerateOutput], call: Call) -> dict | list[dict]:
    """SGLang's shapes: a dict for a single prompt with one sample, else a list."""
    dicts = [out.to_dict() for out in outputs]
    return dicts if call.returns_list else dicts[0]
