"""The offline engine: SGLang-compatible ``generate`` over a background loop.

    caller threads                          engine loop thread
    --------------                          ------------------
    generate()/async_generate()             while running:
      tokenize + validate (raises here)       apply queued commands (add, abort)
      -> commands queue  ------------------>  step(): schedule -> run -> process
      <- per-call output queue  <-----------  publish snapshots of updated requests

Everything a caller can get wrong is checked in the caller's thread, before
anything is queued, so bad input raises a ``ValueError`` subclass and never
reaches the loop.

While another engine lives in the process, the loop thread retires after
``IDLE_EXIT_S`` without work, and the next command starts a fresh one. GNU OpenMP
(torch's CPU threads) keeps a team of workers for every thread that ever ran a
parallel op; once a process holds more workers than cores, libgomp stops
spin-waiting between ops and every op pays a wake-up. An idle engine's team alone
took another engine's float32 decode from 25 to 14 tok/s on 2 cores; a retired
thread's team ends with it. A lone engine keeps its thread: a fresh thread and team
add a few ms to the next request (a 1-token reply after 2.5 s idle: 48-60 ms vs 46).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import statistics
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from radixlm.runtime.assembly import Runtime, build_runtime
from radixlm.runtime.config import EngineConfig
from radixlm.runtime.cpu import configure_cpu
from radixlm.runtime.cpu_paths import CpuPaths
from radixlm.runtime.errors import EngineStoppedError, InvalidRequestError
from radixlm.runtime.model_runner import ModelRunner
from radixlm.runtime.request import Request, RequestOutput
from radixlm.runtime.scheduler import Scheduler

__all__ = ["Engine", "EngineStats"]

logger = logging.getLogger(__name__)

Sink = Callable[[int, RequestOutput], None]

IDLE_EXIT_S = 2.0  # seconds without work after which the loop thread retires
_LIVE_ENGINES: weakref.WeakSet[Engine] = weakref.WeakSet()  # started, not shut down


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
    mask_fill_median_s: float | None  # per pass with constrained rows, over recent passes
    kv_capacity: int
    kv_free: int
    kv_cached: int
    cpu_paths: CpuPaths | None  # the forward path of each pass kind on the CPU

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
        self._commands: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._sinks: dict[str, tuple[int, Sink]] = {}
        self._rid_counter = itertools.count()
        self._stopping = threading.Event()
        self._loop_error: BaseException | None = None
        self._loop_lock = threading.Lock()  # guards _thread against a retiring loop
        self._thread: threading.Thread | None = None  # None: retired while idle
        self._scheduler: Scheduler
        self._runner: ModelRunner  # both set by the loop thread before it reports ready
        self._rt = self._start_loop()
        _LIVE_ENGINES.add(self)
        self.tokenizer = self._rt.tokenizer

    def _start_loop(self) -> Runtime:
        """Builds the runtime *inside* the loop thread and waits until it is ready.

        All torch work happens on the loop thread: a second thread running torch
        ops creates a second OpenMP team, and on a 2-core machine the two teams'
        workers throttle each other (a decode step measured ~1.7x slower).
        """
        built: queue.SimpleQueue[Runtime | BaseException] = queue.SimpleQueue()
        with self._loop_lock:
            self._thread = _start_thread(self._first_loop, built)
        result = built.get()
        if isinstance(result, BaseException):
            raise result
        return result

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
        call = self._prepare_call(
            prompt,
            sampling_params,
            input_ids,
            return_logprob,
            logprob_start_len,
            top_logprobs_num,
            stream,
        )
        results: queue.SimpleQueue[tuple[int, RequestOutput]] = queue.SimpleQueue()
        self._submit(call, lambda i, out: results.put((i, out)))
        chunks = self._drain_sync(results, call)
        return chunks if stream else _collect(chunks, call)

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
        loop = asyncio.get_running_loop()
        call = await loop.run_in_executor(
            None,
            self._prepare_call,
            prompt,
            sampling_params,
            input_ids,
            return_logprob,
            logprob_start_len,
            top_logprobs_num,
            stream,
        )
        results: asyncio.Queue[tuple[int, RequestOutput]] = asyncio.Queue()
        self._submit(call, lambda i, out: loop.call_soon_threadsafe(results.put_nowait, (i, out)))
        chunks = self._drain_async(results, call)
        if stream:
            return chunks
        return _collect([c async for c in chunks], call)

    def abort(self, rid: str) -> None:
        """Stops request ``rid`` (the ``meta_info["id"]`` of its chunks) and frees its KV."""
        self._post(lambda: self._abort(rid))

    def get_stats(self) -> EngineStats:
        s, alloc = self._scheduler, self._rt.allocator
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
            mask_fill_median_s=_median(tuple(s.stats.mask_fill_seconds)),  # tuple(): one C call
            kv_capacity=alloc.capacity,
            kv_free=alloc.num_free,
            kv_cached=s.cache.evictable_size,
            cpu_paths=self._rt.cpu_paths,
        )

    def flush_cache(self) -> None:
        """Empties the radix cache (e.g. after changing weights).

        Raises:
            InvalidRequestError: requests are running or waiting.
            EngineStoppedError: the engine was shut down, or its loop died.
        """
        if self._stopping.is_set():
            raise EngineStoppedError("the engine was shut down")
        done: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()

        def flush() -> None:
            try:
                self._scheduler.flush_cache()
                done.put(None)
            except InvalidRequestError as exc:
                done.put(exc)

        self._post(flush)
        error = self._wait_on(done)
        if error is not None:
            raise error

    def shutdown(self) -> None:
        """Stops the loop; requests still running finish with an abort."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        _LIVE_ENGINES.discard(self)
        with self._loop_lock:
            thread = self._thread
            self._commands.put(lambda: None)  # wake the loop
        if thread is not None:
            thread.join(timeout=30)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ---- submission (caller's thread) ---------------------------------------------------

    def _prepare_call(
        self,
        prompt,
        sampling_params,
        input_ids,
        return_logprob,
        logprob_start_len,
        top_logprobs_num,
        stream,
    ) -> _Call:
        if self._stopping.is_set():
            raise EngineStoppedError("the engine was shut down")
        build = self._rt.request_builder
        prompts, single = build.normalize_prompts(prompt, input_ids)
        params = build.normalize_params(sampling_params, len(prompts))
        logprob = build.logprob_spec(return_logprob, logprob_start_len, top_logprobs_num)
        requests = [
            build.build(f"req-{next(self._rid_counter)}", ids, sample, logprob, stream)
            for ids, p in zip(prompts, params)
            for sample in build.expand_samples(p)
        ]
        # A single prompt with one sample returns a dict; anything else a list.
        return _Call(tuple(requests), returns_list=not single or len(requests) > 1)

    def _submit(self, call: _Call, sink: Sink) -> None:
        def add() -> None:
            for index, req in enumerate(call.requests):
                self._sinks[req.rid] = (index, sink)
                self._scheduler.add_request(req)

        self._post(add)

    def _post(self, command: Callable[[], None]) -> None:
        """Queues a command for the loop, starting a loop thread if the last one retired."""
        with self._loop_lock:
            self._commands.put(command)
            if self._thread is None and not self._stopping.is_set():
                self._thread = _start_thread(self._resumed_loop)

    def _drain_sync(self, results: queue.SimpleQueue, call: _Call) -> Iterator[dict]:
        pending = {r.rid for r in call.requests}
        try:
            while pending:
                index, out = self._wait_on(results)
                if out.finished:
                    pending.discard(out.rid)
                yield _chunk(out, index, call)
        finally:  # the caller stopped listening (break, exception, Ctrl-C): stop the work
            for rid in pending:
                self.abort(rid)

    def _wait_on(self, results: queue.SimpleQueue) -> Any:
        """The next item the loop puts in ``results``; raises if the loop died first."""
        while True:
            try:
                return results.get(timeout=1.0)
            except queue.Empty:
                # None only for a shut-down engine: a loop with queued work never retires.
                thread = self._thread
                if (thread is None and self._stopping.is_set()) or (
                    thread is not None and not thread.is_alive()
                ):
                    raise EngineStoppedError("the engine loop stopped") from self._loop_error

    async def _drain_async(self, results: asyncio.Queue, call: _Call) -> AsyncIterator[dict]:
        pending = {r.rid for r in call.requests}
        try:
            while pending:
                index, out = await results.get()
                if out.finished:
                    pending.discard(out.rid)
                yield _chunk(out, index, call)
        finally:  # cancelled or abandoned: stop the work
            for rid in pending:
                self.abort(rid)

    # ---- the loop (engine thread) -------------------------------------------------------

    def _first_loop(self, built: queue.SimpleQueue) -> None:
        configure_cpu(self.config.resolved_num_threads)
        try:
            runtime = build_runtime(self.config)
        except BaseException as exc:  # handed to the constructor, which raises it
            built.put(exc)
            return
        self._scheduler = runtime.scheduler
        self._runner = runtime.runner
        built.put(runtime)
        self._loop()

    def _resumed_loop(self) -> None:
        configure_cpu(self.config.resolved_num_threads)  # thread counts are per thread
        self._loop()

    def _loop(self) -> None:
        """Steps until the engine stops; returns early once idle for ``IDLE_EXIT_S``
        while other engines live."""
        try:
            while not self._stopping.is_set():
                if not self._apply_commands(block=not self._scheduler.has_work):
                    return
                self.step()
        except BaseException as exc:  # a bug: fail every request loudly, never hang callers
            logger.exception("engine loop crashed")
            self._loop_error = exc
            raise
        finally:
            if self._stopping.is_set() or self._loop_error is not None:
                self._publish(self._scheduler.abort_all("the engine stopped"))

    def _apply_commands(self, block: bool) -> bool:
        """Runs the queued commands, first waiting for one if ``block``.

        Returns False when it waited ``IDLE_EXIT_S`` for nothing while other engines
        live, and retired this thread (the next ``_post`` starts another).
        """
        try:
            command = (
                self._commands.get(timeout=IDLE_EXIT_S) if block else self._commands.get_nowait()
            )
        except queue.Empty:
            if not block or len(_LIVE_ENGINES) < 2:
                return True
            with self._loop_lock:
                if self._commands.empty():
                    self._thread = None
                    return False
            command = self._commands.get_nowait()  # posted just now; only this thread takes
        command()
        while True:
            try:
                self._commands.get_nowait()()
            except queue.Empty:
                return True

    def step(self) -> bool:
        """One scheduling step: schedule -> run the model -> apply results -> publish."""
        batch = self._scheduler.schedule()
        if batch is None:
            return False
        try:
            output = self._runner.run(batch.forward)
        except Exception as exc:  # fail this batch's requests, keep serving the rest
            logger.exception("model pass failed")
            self._publish(self._scheduler.fail_batch(batch, f"model pass failed: {exc!r}"))
            return True
        self._publish(self._scheduler.process_output(batch, output))
        return True

    def _publish(self, updated: list[Request]) -> None:
        for req in updated:
            if req.stream or req.finished:
                index, sink = self._sinks[req.rid]
                sink(index, req.snapshot())
            if req.finished:
                del self._sinks[req.rid]

    def _abort(self, rid: str) -> None:
        req = self._scheduler.abort(rid)
        if req is not None:
            self._publish([req])


@dataclass(frozen=True)
class _Call:
    """The requests of one generate call: prompts in order, each prompt's n samples together."""

    requests: tuple[Request, ...]
    returns_list: bool


def _start_thread(target: Callable[..., None], *args: object) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, name="radixlm-engine", daemon=True)
    thread.start()
    return thread


def _median(values: tuple[float, ...]) -> float | None:
    return statistics.median(values) if values else None


def _chunk(out: RequestOutput, index: int, call: _Call) -> dict:
    chunk = out.to_dict()
    if call.returns_list:
        chunk["index"] = index
    return chunk


def _collect(chunks: Iterator[dict] | list[dict], call: _Call) -> dict | list[dict]:
    """Final results in submission order (one per request)."""
    final: list[dict | None] = [None] * len(call.requests)
    for c in chunks:
        if c["meta_info"]["finish_reason"] is not None:
            final[c.pop("index", 0)] = c
    return final if call.returns_list else final[0]  # type: ignore[return-value]
