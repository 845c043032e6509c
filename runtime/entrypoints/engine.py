"""The offline engine: SGLang-compatible ``generate`` over a background loop.

    caller threads                            engine loop thread
    --------------                            ------------------
    generate()/async_generate() (dicts)       while running:
      -> GenerateRequest per prompt             apply queued LoopMessages
    generate_requests()/stream_requests()         (AddRequests, Abort, FlushCache, Wake)
      tokenize + validate (raises here)         step(): schedule -> run -> process
      -> AddRequests(TokenizedRequest...) --->  publish each StreamChunk to its sink
      <- per-call chunk queue  <-------------   (the scheduler made it: an immutable
                                                 snapshot; the engine only routes it)

Everything a caller can get wrong is checked in the caller's thread, before
anything is queued, so bad input raises a ``ValueError`` subclass and never
reaches the loop.

The loop thread itself (its lifecycle, message handling, ``step``) is
``engine_loop.EngineLoop``.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import statistics
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from radixlm.runtime.config import EngineConfig
from radixlm.runtime.entrypoints.assembly import Placement
from radixlm.runtime.entrypoints.engine_loop import WAKE_CHECK_S, EngineLoop
from radixlm.runtime.errors import EngineStoppedError, InvalidRequestError
from radixlm.runtime.executor.cpu_paths import CpuPaths
from radixlm.runtime.executor.model_runner import PassCounts
from radixlm.runtime.histogram import HistogramSnapshot
from radixlm.runtime.io.messages import (
    Abort,
    AddRequests,
    FlushCache,
    GenerateOutput,
    GenerateRequest,
    StreamChunk,
    TokenizedRequest,
)
from radixlm.runtime.scheduling.stats import LatencyHistograms

__all__ = ["Engine", "EngineStats"]


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the engine's counters.

    KV pool: ``kv_capacity == kv_free + kv_cached + kv_used``, where ``kv_cached``
    slots hold prefixes only the radix cache keeps (evictable) and ``kv_used``
    slots belong to running requests (their own tokens and the cached prefixes
    they lock).
    """

    num_running: int
    num_waiting: int
    num_steps: int
    num_retractions: int
    num_prompt_tokens: int
    num_cached_tokens: int
    num_generated_tokens: int
    num_evicted_tokens: int
    num_jump_forward_tokens: int
    num_finished: int
    num_aborted: int  # finished with an abort (caller, failure, shutdown)
    mask_fill_median_s: float | None  # per pass with constrained rows, over recent passes
    latency: LatencyHistograms  # TTFT, inter-token, end-to-end and queue time, seconds
    grammar_compile_s: HistogramSnapshot  # each constraint compile (cache misses only)
    kv_capacity: int
    kv_free: int
    kv_cached: int
    cpu_paths: CpuPaths | None  # the forward path of each pass kind on the CPU
    placement: Placement  # the device, attention backend and CUDA graph sizes
    passes: PassCounts  # the passes each forward path ran

    @property
    def kv_used(self) -> int:
        return self.kv_capacity - self.kv_free - self.kv_cached

    @property
    def cache_hit_rate(self) -> float:
        """Share of submitted prompt tokens served from the prefix cache."""
        return self.num_cached_tokens / self.num_prompt_tokens if self.num_prompt_tokens else 0.0


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
        # The ids of the requests queued or running: what ``abort`` can find. Caller
        # threads add and remove their own (set.add/discard are atomic under the GIL).
        self._live_rids: set[str] = set()
        self._loop = EngineLoop(self.config)  # builds the runtime on its thread
        self._rt = self._loop.runtime
        self.tokenizer = self._rt.tokenizer

    # ---- public API --------------------------------------------------------------------

    @property
    def context_length(self) -> int:
        return self._rt.context_len

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
        call = self._prepare_sglang_call(
            prompt,
            sampling_params,
            input_ids,
            return_logprob,
            logprob_start_len,
            top_logprobs_num,
            stream,
        )
        chunks = self._stream_sync(call)
        if stream:
            return _chunk_dicts(chunks, call)
        return _result_dicts(_finals(chunks, call), call)

    def generate_requests(self, requests: Sequence[GenerateRequest]) -> list[GenerateOutput]:
        """The typed ``generate``: the final output of every request's samples, in
        order (prompts in order, each prompt's ``n`` samples together).

        Raises:
            InvalidRequestError (a ValueError): a bad request; nothing was queued.
        """
        call = self._prepare_call(list(requests), single=False)
        return _finals(self._stream_sync(call), call)

    def stream_requests(self, requests: Sequence[GenerateRequest]) -> Iterator[StreamChunk]:
        """The typed streaming ``generate``: chunks of every request as they come
        (``chunk.output.index`` says whose); the last chunk of each is finished.
        Closing the iterator early aborts the requests still running.

        Raises:
            InvalidRequestError (a ValueError): a bad request; nothing was queued.
        """
        return self._stream_sync(self._prepare_call(list(requests), single=False))

    async def async_generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict | list[dict] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        return_logprob: bool = False,
        logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None,
        stream: bool = False,
    ) -> dict | list[dict] | AsyncIterator[dict]:
        """``generate`` for asyncio: awaits the result, or returns an async iterator.

        Tokenising and compiling a constraint run in a worker thread, so a slow
        schema compile never blocks the event loop."""
        call = await asyncio.get_running_loop().run_in_executor(
            None,
            self._prepare_sglang_call,
            prompt,
            sampling_params,
            input_ids,
            return_logprob,
            logprob_start_len,
            top_logprobs_num,
            stream,
        )
        chunks = self._stream_async(call)
        if stream:
            return _async_chunk_dicts(chunks, call)
        outputs = _finals([c async for c in chunks], call)
        # Dicts of many logprobs take a while to build: not on the caller's event loop.
        return await asyncio.get_running_loop().run_in_executor(None, _result_dicts, outputs, call)

    async def async_generate_requests(
        self, requests: Sequence[GenerateRequest]
    ) -> list[GenerateOutput]:
        """``generate_requests`` for asyncio (tokenizing runs in a worker thread)."""
        call = await asyncio.get_running_loop().run_in_executor(
            None, self._prepare_call, list(requests), False
        )
        return _finals([c async for c in self._stream_async(call)], call)

    async def async_stream_requests(
        self, requests: Sequence[GenerateRequest]
    ) -> AsyncIterator[StreamChunk]:
        """``stream_requests`` for asyncio; cancelling the iteration aborts the requests."""
        call = await asyncio.get_running_loop().run_in_executor(
            None, self._prepare_call, list(requests), False
        )
        chunks = self._stream_async(call)
        try:
            async for chunk in chunks:
                yield chunk
        finally:  # cancelled or abandoned: the inner drain aborts what still runs
            await chunks.aclose()

    def abort(self, rid: str) -> bool:
        """Stops request ``rid`` (the ``meta_info["id"]`` of its chunks) and frees its KV.

        Returns whether ``rid`` was queued or running (False: unknown or already done).
        """
        if rid not in self._live_rids:
            return False
        self._loop.post(Abort(rid))
        return True

    def get_stats(self) -> EngineStats:
        s, alloc = self._rt.scheduler, self._rt.allocator
        return EngineStats(
            num_running=len(s.running),
            num_waiting=len(s.waiting),
            num_steps=s.stats.num_steps,
            num_retractions=s.stats.num_retractions,
            num_prompt_tokens=s.stats.num_prompt_tokens,
            num_cached_tokens=s.stats.num_cached_tokens,
            num_generated_tokens=s.stats.num_generated_tokens,
            num_evicted_tokens=s.cache.num_evicted_tokens,
            num_jump_forward_tokens=s.stats.num_jump_forward_tokens,
            num_finished=s.stats.num_finished,
            num_aborted=s.stats.num_aborted,
            mask_fill_median_s=_median(tuple(s.stats.mask_fill_seconds)),  # tuple(): one C call
            latency=s.stats.latencies(),
            grammar_compile_s=self._rt.request_builder.grammars.stats.seconds.snapshot(),
            kv_capacity=alloc.capacity,
            kv_free=alloc.num_free,
            kv_cached=s.cache.evictable_size,
            cpu_paths=self._rt.cpu_paths,
            placement=self._rt.placement,
            passes=self._rt.runner.pass_counts(),
        )

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

    # ---- submission (caller's thread) ---------------------------------------------------

    def _prepare_sglang_call(self, *sglang_args: Any) -> _Call:
        """``generate``'s arguments (in its order) as a prepared call."""
        return self._prepare_call(*self._rt.request_builder.from_sglang_args(*sglang_args))

    def _prepare_call(self, requests: list[GenerateRequest], single: bool) -> _Call:
        """Builds every request's samples (raising on the first bad one, before
        anything is queued)."""
        if self._loop.stopping:
            raise EngineStoppedError("the engine was shut down")
        if not requests:
            raise InvalidRequestError("no requests to generate")
        build, built = self._rt.request_builder, []
        for request in requests:
            built += build.build(request, self._new_rid, first_index=len(built))
        build.check_call(built)
        # A single prompt with one sample returns a dict; anything else a list.
        return _Call(tuple(built), returns_list=not single or len(built) > 1)

    @staticmethod
    def _new_rid() -> str:
        """Unguessable (122 random bits): a client cannot abort another's request."""
        return uuid.uuid4().hex

    def _stream_sync(self, call: _Call) -> Iterator[StreamChunk]:
        """Queues the call now; yields its chunks as the loop publishes them."""
        results: queue.SimpleQueue[StreamChunk] = queue.SimpleQueue()
        self._live_rids.update(r.rid for r in call.requests)
        self._loop.post(AddRequests(call.requests, results.put))
        return self._drain_sync(results, call)

    def _drain_sync(self, results: queue.SimpleQueue, call: _Call) -> Iterator[StreamChunk]:
        pending = {r.rid for r in call.requests}
        try:
            while pending:
                chunk = self._loop.wait_on(results)
                if chunk.finished:
                    self._settle(chunk.output.rid, pending)
                yield chunk
        finally:  # the caller stopped listening (break, exception, Ctrl-C): stop the work
            self._abandon(pending)

    def _stream_async(self, call: _Call) -> AsyncIterator[StreamChunk]:
        """Queues the call now; yields its chunks as the loop publishes them."""
        loop = asyncio.get_running_loop()
        results: asyncio.Queue[StreamChunk] = asyncio.Queue()
        self._live_rids.update(r.rid for r in call.requests)
        self._loop.post(
            AddRequests(call.requests, lambda c: loop.call_soon_threadsafe(results.put_nowait, c))
        )
        return self._drain_async(results, call)

    async def _drain_async(self, results: asyncio.Queue, call: _Call) -> AsyncIterator[StreamChunk]:
        pending = {r.rid for r in call.requests}
        try:
            while pending:
                try:
                    chunk = await asyncio.wait_for(results.get(), timeout=WAKE_CHECK_S)
                except TimeoutError:
                    self._loop.check_alive()  # the sync path's check: never wait on a dead loop
                    continue
                if chunk.finished:
                    self._settle(chunk.output.rid, pending)
                yield chunk
        finally:  # cancelled or abandoned: stop the work
            self._abandon(pending)

    def _settle(self, rid: str, pending: set[str]) -> None:
        """Request ``rid`` finished: no longer pending, nor abortable."""
        pending.discard(rid)
        self._live_rids.discard(rid)

    def _abandon(self, pending: set[str]) -> None:
        """The caller stopped listening: abort what still runs."""
        for rid in pending:
            self.abort(rid)
        self._live_rids.difference_update(pending)


@dataclass(frozen=True)
class _Call:
    """The requests of one generate call: prompts in order, each prompt's n samples together."""

    requests: tuple[TokenizedRequest, ...]
    returns_list: bool


def _median(values: tuple[float, ...]) -> float | None:
    return statistics.median(values) if values else None


def _chunk_dict(chunk: StreamChunk, call: _Call) -> dict:
    out = chunk.to_dict()
    if call.returns_list:
        out["index"] = chunk.output.index
    return out


def _chunk_dicts(chunks: Iterator[StreamChunk], call: _Call) -> Iterator[dict]:
    with contextlib.closing(chunks):  # closing this closes the drain, which aborts
        for chunk in chunks:
            yield _chunk_dict(chunk, call)


async def _async_chunk_dicts(
    chunks: AsyncIterator[StreamChunk], call: _Call
) -> AsyncIterator[dict]:
    """A chunk carrying logprobs (each chunk repeats all so far) becomes its dict in
    a worker thread, off the caller's event loop."""
    loop = asyncio.get_running_loop()
    try:
        async for chunk in chunks:
            if chunk.output.logprob.enabled:
                yield await loop.run_in_executor(None, _chunk_dict, chunk, call)
            else:
                yield _chunk_dict(chunk, call)
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]


def _finals(chunks: Iterable[StreamChunk], call: _Call) -> list[GenerateOutput]:
    """Every request's final output, in submission order."""
    final: list[GenerateOutput | None] = [None] * len(call.requests)
    for chunk in chunks:
        if chunk.finished:
            final[chunk.output.index] = chunk.output
    return final  # type: ignore[return-value]


def _result_dicts(outputs: list[GenerateOutput], call: _Call) -> dict | list[dict]:
    """SGLang's shapes: a dict for a single prompt with one sample, else a list."""
    dicts = [out.to_dict() for out in outputs]
    return dicts if call.returns_list else dicts[0]
