"""One request, one path: a streamed, constrained chat completion runs in at most three
contexts (the server's event loop, the engine loop thread, a compile worker process),
crossing from the event loop to the engine once, plus the compile's own message."""

from __future__ import annotations

import json
import os
import threading
import uuid

import httpx
import pytest

from radixlm.runtime.constrained.compile_worker import CompileWorkers
from radixlm.runtime.constrained.compiler import GrammarCompiler, PendingGrammar
from radixlm.runtime.entrypoints.engine_loop import EngineLoop
from radixlm.runtime.entrypoints.http.openai import routes as openai_routes
from radixlm.runtime.io.request_builder import RequestBuilder
from radixlm.runtime.scheduling.scheduler import Scheduler
from tests.runtime.entrypoints.http.conftest import sse_events

# Where each step of the request runs: (owner, method) -> the context it must run in.
_STEPS = {
    (openai_routes, "chat_call"): "event loop",
    (RequestBuilder, "check"): "event loop",
    (GrammarCompiler, "start"): "event loop",
    (PendingGrammar, "result"): "event loop",
    (RequestBuilder, "build"): "event loop",
    (CompileWorkers, "submit"): "engine loop",
    (CompileWorkers, "pump"): "engine loop",
    (Scheduler, "add_request"): "engine loop",
    (Scheduler, "process_output"): "engine loop",
}


@pytest.fixture
def recorded(monkeypatch):
    """Each step's threads, and every message posted to the engine loop."""
    seen: dict[str, set[str]] = {}
    posts: list[str] = []
    for (owner, name), _ in _STEPS.items():
        original = getattr(owner, name)

        def traced(*args, _original=original, _name=name, **kwargs):
            seen.setdefault(_name, set()).add(threading.current_thread().name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(owner, name, traced)
    post = EngineLoop.post

    def traced_post(self, message):
        posts.append(type(message).__name__)
        return post(self, message)

    monkeypatch.setattr(EngineLoop, "post", traced_post)
    return seen, posts


def test_a_streamed_constrained_chat_completion_takes_three_contexts(server, recorded):
    seen, posts = recorded
    # a schema no test compiled before: the compile worker is part of the path
    key = f"k{uuid.uuid4().hex[:8]}"
    number = {"type": "integer", "minimum": 0, "maximum": 99}  # short: it ends within max_tokens
    schema = {"type": "object", "properties": {key: number}, "required": [key]}
    body = {
        "model": "default",
        "messages": [{"role": "user", "content": "Give a number."}],
        "max_tokens": 48,
        "temperature": 0,
        "stream": True,
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
    }
    with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json=body, timeout=60) as r:
        r.read()
        assert r.status_code == 200
        events = sse_events(r)
    text = "".join(
        json.loads(e)["choices"][0]["delta"].get("content") or ""
        for e in events
        if e != "[DONE]" and json.loads(e)["choices"]
    )
    assert set(json.loads(text)) == {key}  # it is the constrained output
    contexts = {"event loop": set(), "engine loop": set()}
    for (_, name), where in _STEPS.items():
        assert name in seen, f"{name} never ran"
        contexts[where] |= seen[name]
    # one thread each: the event loop never hands a step to an executor thread
    assert len(contexts["event loop"]) == 1 and len(contexts["engine loop"]) == 1
    assert contexts["engine loop"] == {"radixlm-engine"}
    assert contexts["event loop"] != contexts["engine loop"]
    # one hand-off of the request, one of its compile (the worker is a process)
    assert posts.count("AddRequests") == 1 and posts.count("CompileGrammar") == 1
    workers = server.state.engine._rt.request_builder.grammars.workers.pids()
    assert workers and all(pid != os.getpid() for pid in workers)
