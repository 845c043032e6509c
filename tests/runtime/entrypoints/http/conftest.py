"""A real server on 127.0.0.1 (uvicorn in a background thread of the test process)
over one engine shared by the package's test modules; each module starts its own
server (its own ServerConfig) around it."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class RunningServer:
    base_url: str
    state: object  # ServerState
    server: object  # uvicorn.Server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(engine, **config_kwargs) -> Iterator[RunningServer]:
    import uvicorn

    from radixlm.runtime.entrypoints.http import ServerConfig, ServerState, build_app

    config = ServerConfig(port=free_port(), **config_kwargs)
    state = ServerState.create(engine, config)
    uv_config = uvicorn.Config(
        build_app(state), host=config.host, port=config.port, log_level="warning", lifespan="off"
    )
    server = uvicorn.Server(uv_config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield RunningServer(f"http://{config.host}:{config.port}", state, server)
    finally:
        server.should_exit = True
        thread.join(timeout=START_TIMEOUT_S)


@pytest.fixture(scope="package")
def http_engine(default_model_dir):
    """The engine behind every server of this package (float32, as the reference)."""
    from radixlm import Engine

    eng = Engine(model_path=str(default_model_dir), dtype="float32", max_total_tokens=16384)
    yield eng
    eng.shutdown()


def wait_idle(engine, timeout_s: float = 10.0) -> None:
    """Until nothing runs or waits and no KV slot is held by a request."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stats = engine.get_stats()
        if stats.num_running == 0 and stats.num_waiting == 0 and stats.kv_used == 0:
            return
        time.sleep(0.02)
    raise AssertionError(f"engine not idle: {engine.get_stats()}")


def wait_released(state, timeout_s: float = 5.0) -> None:
    """Until the server holds no admission (a stream releases its own just after its
    last byte is sent, so a client may see the end first)."""
    deadline = time.monotonic() + timeout_s
    while state.admission.in_use and time.monotonic() < deadline:
        time.sleep(0.01)
    assert state.admission.in_use == 0


def sse_events(response: httpx.Response) -> list[str]:
    """The ``data:`` payloads of an SSE response, in order (checking the framing)."""
    text = response.text
    assert text.endswith("\n\n")
    events = text[:-2].split("\n\n")
    for event in events:
        assert event.startswith("data: ") and "\n" not in event, event
    return [event[len("data: ") :] for event in events]
