"""One request, one path: every thread and process a constrained chat completion
touches is one of the contexts `docs/architecture.md` draws ("The contexts a request
meets"), and the request crosses from the event loop to the engine loop once."""

from __future__ import annotations

import json
import os
import sys
import threading
import uuid

import httpx
import pytest

from radixlm.runtime.constrained import compile_worker
from radixlm.runtime.constrained.compile_worker import CompileWorkers
from radixlm.runtime.constrained.compiler import GrammarCompiler, PendingGrammar
from radixlm.runtime.entrypoints.engine_loop import THREAD_NAME as ENGINE_THREAD
from radixlm.runtime.entrypoints.engine_loop import EngineLoop
from radixlm.runtime.entrypoints.http.openai import routes as openai_routes
from radixlm.runtime.entrypoints.http.openai.prompts import OFF_LOOP_BODY_BYTES
from radixlm.runtime.io.output_assembler import OutputAssembler
from radixlm.runtime.io.request_builder import RequestBuilder
from radixlm.runtime.scheduling import mask_worker
from radixlm.runtime.scheduling.scheduler import Scheduler
from tests.runtime.entrypoints.http.conftest import sse_events

# The points a request passes: (owner, attribute) -> the context that must run it.
_STEPS = {
    (openai_routes, "chat_call"): "event loop",
    (RequestBuilder, "check"): "event loop",
    (GrammarCompiler, "start"): "event loop",
    (PendingGrammar, "result"): "event loop",
    (RequestBuilder, "build"): "event loop",
    (OutputAssembler, "apply"): "event loop",
    (CompileWorkers, "submit"): "event loop",
    (CompileWorkers, "_pump"): "compile driver thread",
    (Scheduler, "add_request"): "engine loop",
    (Scheduler, "schedule"): "engine loop",
    (Scheduler, "process_output"): "engine loop",
    (mask_worker, "_fill"): "mask fill thread",
}
EXECUTOR = "executor thread"  # asyncio's default executor: names "asyncio_0", ...
COMPILE = "compile worker process"
COMPILES = ("compile driver thread", COMPILE)


def _context(thread: str, event_loop: str) -> str:
    """The context a thread name stands for (the names the runtime gives its threads)."""
    if thread == event_loop:
        return "event loop"
    if thread == ENGINE_THREAD:
        return "engine loop"
    if thread.startswith(mask_worker.THREAD_NAME + "-"):
        return "mask fill thread"
    if thread.startswith("asyncio_"):
        return EXECUTOR
    if thread == compile_worker.DRIVER_THREAD:
        return "compile driver thread"
    return f"unexpected thread {thread!r}"


@pytest.fixture
def recorded(monkeypatch):
    """Every (step, thread name, process id) the request passes, and every message
    posted to the engine loop."""
    seen: list[tuple[str, str, int]] = []
    posts: list[str] = []

    def record(step: str) -> None:
        seen.append((step, threading.current_thread().name, os.getpid()))

    for owner, name in _STEPS:
        original = getattr(owner, name)

        def traced(*args, _original=original, _name=name, **kwargs):
            record(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(owner, name, traced)
    # whatever a route hands to a worker thread (every module that imports in_worker)
    for module in list(sys.modules.values()):
        if module is None or not module.__name__.startswith("radixlm.runtime.entrypoints.http"):
            continue
        in_worker = getattr(module, "in_worker", None)
        if in_worker is None or module.__name__.endswith(".state"):
            continue

        def traced_in_worker(fn, *args, _in_worker=in_worker):
            def run(*inner):
                record("in_worker")
                return fn(*inner)

            return _in_worker(run, *args)

        monkeypatch.setattr(module, "in_worker", traced_in_worker)
    take = compile_worker._Worker.take

    def traced_take(worker, job, now):
        seen.append(("compile", COMPILE, worker.pid))  # the job runs in that process
        return take(worker, job, now)

    monkeypatch.setattr(compile_worker._Worker, "take", traced_take)
    post = EngineLoop.post

    def traced_post(self, message):
        posts.append(type(message).__name__)
        return post(self, message)

    monkeypatch.setattr(EngineLoop, "post", traced_post)
    return seen, posts


def _body(stream: bool) -> tuple[str, dict]:
    key = f"k{uuid.uuid4().hex[:8]}"  # a schema no test compiled before: a compile runs
    number = {"type": "integer", "minimum": 0, "maximum": 99}  # short: it ends in time
    schema = {"type": "object", "properties": {key: number}, "required": [key]}
    return key, {
        "model": "default",
        "messages": [{"role": "user", "content": "Give a number."}],
        "max_tokens": 48,
        "temperature": 0,
        "stream": stream,
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
    }


def _post(server, body: dict, stream: bool, pad: int) -> str:
    """The completion's text; ``pad`` spaces after the JSON make the body that large."""
    content = json.dumps(body).encode() + b" " * pad
    headers = {"content-type": "application/json"}
    url = f"{server.base_url}/v1/chat/completions"
    if not stream:
        r = httpx.post(url, content=content, headers=headers, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"]
    with httpx.stream("POST", url, content=content, headers=headers, timeout=60) as r:
        r.read()
        assert r.status_code == 200
        events = [json.loads(e) for e in sse_events(r) if e != "[DONE]"]
    return "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])


@pytest.mark.parametrize(
    "stream, pad, moved, contexts",
    [
        # small and streamed: the event loop, the engine loop, the mask fill, a compile
        # (its driver thread and a worker process)
        (True, 0, {}, {"event loop", "engine loop", "mask fill thread", *COMPILES}),
        # large and whole: the call is built (the body read into a prompt) and the
        # response encoded in an executor thread
        (
            False,
            OFF_LOOP_BODY_BYTES,
            {"chat_call": EXECUTOR, "in_worker": EXECUTOR},
            {"event loop", EXECUTOR, "engine loop", "mask fill thread", *COMPILES},
        ),
    ],
    ids=["small-streamed", "large-whole"],
)
def test_a_constrained_chat_completion_meets_the_contexts_drawn(
    server, recorded, stream, pad, moved, contexts
):
    seen, posts = recorded
    key, body = _body(stream)
    text = _post(server, body, stream, pad)
    assert set(json.loads(text)) == {key}  # it is the constrained output
    [event_loop] = {thread for step, thread, _ in seen if step == "check"}
    met = {COMPILE if thread == COMPILE else _context(thread, event_loop) for _, thread, _ in seen}
    assert met == contexts
    steps = {name: where for (_, name), where in _STEPS.items()} | moved
    for name, where in steps.items():  # each step in its own context, and only there
        assert {_context(t, event_loop) for step, t, _ in seen if step == name} == {where}, name
    # one process for every thread; the compile in another, a child of it
    pids = {pid for step, _, pid in seen if step != "compile"}
    assert pids == {os.getpid()}
    compiles = {pid for step, _, pid in seen if step == "compile"}
    assert len(compiles) == 1 and os.getpid() not in compiles
    assert compiles <= set(server.state.engine._rt.request_builder.grammars.workers.pids())
    # one hand-off of the request to the engine loop (its compile never goes there)
    assert posts.count("AddRequests") == 1
