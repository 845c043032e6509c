"""A real server on 127.0.0.1 (uvicorn in a background thread of the test process)
over one engine shared by the package's test modules; each module starts its own
server (its own ServerConfig) around it."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.servers import RunningServer, free_port, running_server

__all__ = [
    "RunningServer", "error_of", "free_port", "running_server", "sse_events", "wait_idle",
]  # fmt: skip


@pytest.fixture(scope="package")
def http_engine(engine):
    """The engine behind every server of this package: the session's float32 engine
    (the reference the tests compare with), left idle after each test."""
    return engine


@pytest.fixture(scope="module")
def server(http_engine):
    """A server with the default ServerConfig, one per test module (a module that
    needs other options defines its own ``server``)."""
    with running_server(http_engine) as running:
        yield running


@pytest.fixture(scope="module")
def http(server):
    """A client of the module's ``server``."""
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        yield client


def error_of(response: httpx.Response, status: int = 400) -> dict:
    """The OpenAI-shaped error of a response that must have ``status``."""
    assert response.status_code == status, response.text[:2000]
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


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
