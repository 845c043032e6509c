"""A prepared call's life on the loop, seen from its caller: queued once, its deltas
turned into chunks in the caller's context, aborted when the caller stops listening.

    caller (a thread or an event loop)          engine loop thread
    AddRequests(requests, sink) ----------->    schedule, run, publish
    per-call queue <------------------------    OutputDelta (what changed)
    OutputAssembler: delta -> StreamChunk
    the caller stops early: Abort(rid) ---->    frees its KV
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass

from radixlm.runtime.entrypoints.engine_loop import WAKE_CHECK_S, EngineLoop
from radixlm.runtime.io.messages import (
    Abort,
    AddRequests,
    GenerateOutput,
    OutputDelta,
    StreamChunk,
    TokenizedRequest,
)
from radixlm.runtime.io.output_assembler import OutputAssembler

__all__ = ["Call", "CallStreams", "observed"]


@dataclass(frozen=True)
class Call:
    """The requests of one generate call: prompts in order, each prompt's n samples
    together; ``returns_list``: the caller gets a list (else one result)."""

    requests: tuple[TokenizedRequest, ...]
    returns_list: bool


class CallStreams:
    """Streams calls through one engine loop; knows which requests still run (what
    ``abort`` can find)."""

    def __init__(self, loop: EngineLoop) -> None:
        self._loop = loop
        # The ids of the requests queued or running. Caller threads add and remove
        # their own (set.add/discard are atomic under the GIL).
        self._live_rids: set[str] = set()

    def stream(self, call: Call) -> Iterator[StreamChunk]:
        """Queues the call now; yields its chunks as the loop publishes them. Closing
        the iterator early aborts the requests still running."""
        results: queue.SimpleQueue[OutputDelta] = queue.SimpleQueue()
        self._live_rids.update(r.rid for r in call.requests)
        self._loop.post(AddRequests(call.requests, results.put))
        return self._drain(results, call)

    def stream_async(self, call: Call) -> AsyncIterator[StreamChunk]:
        """``stream`` for the caller's event loop; cancelling the iteration aborts."""
        loop = asyncio.get_running_loop()
        results: asyncio.Queue[OutputDelta] = asyncio.Queue()
        self._live_rids.update(r.rid for r in call.requests)
        self._loop.post(
            AddRequests(call.requests, lambda d: loop.call_soon_threadsafe(results.put_nowait, d))
        )
        return self._drain_async(results, call)

    def abort(self, rid: str) -> bool:
        """Stops request ``rid``; returns whether it was queued or running."""
        if rid not in self._live_rids:
            return False
        self._loop.post(Abort(rid))
        return True

    def _drain(self, results: queue.SimpleQueue[OutputDelta], call: Call) -> Iterator[StreamChunk]:
        pending = {r.rid for r in call.requests}
        outputs = OutputAssembler(call.requests)
        try:
            while pending:
                chunk = outputs.apply(self._loop.wait_on(results))
                if chunk.finished:
                    self._settle(chunk.rid, pending)
                yield chunk
        finally:  # the caller stopped listening (break, exception, Ctrl-C): stop the work
            self._abandon(pending)

    async def _drain_async(
        self, results: asyncio.Queue[OutputDelta], call: Call
    ) -> AsyncIterator[StreamChunk]:
        pending = {r.rid for r in call.requests}
        outputs = OutputAssembler(call.requests)
        try:
            while pending:
                try:
                    delta = await asyncio.wait_for(results.get(), timeout=WAKE_CHECK_S)
                except TimeoutError:
                    self._loop.check_alive()  # the sync path's check: never wait on a dead loop
                    continue
                chunk = outputs.apply(delta)
                if chunk.finished:
                    self._settle(chunk.rid, pending)
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


async def observed(
    chunks: AsyncIterator[StreamChunk], on_output: Callable[[GenerateOutput], None]
) -> AsyncIterator[StreamChunk]:
    """``chunks`` as they come, handing each finished output to ``on_output`` first (a
    server's trace of the call); closing this closes ``chunks``."""
    try:
        async for chunk in chunks:
            if chunk.finished:
                on_output(chunk.output)
            yield chunk
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]
