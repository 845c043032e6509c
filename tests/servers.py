"""A real radixlm HTTP server on 127.0.0.1 for tests: uvicorn in a background thread
of the test process, around an engine the caller owns (the server tests and the
DSL's HTTP backend tests share it)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

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

    from radixlm.runtime.entrypoints.http import ServerConfig, ServerState
    from radixlm.runtime.entrypoints.http.server.serve import uvicorn_config

    config = ServerConfig(port=free_port(), **config_kwargs)
    state = ServerState.create(engine, config)
    server = uvicorn.Server(uvicorn_config(state, log_level="warning"))
    # named, so that tests/conftest.py can tell a server a module left running
    thread = threading.Thread(target=server.run, name="radixlm-test-server", daemon=True)
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
