"""``radixlm serve``: one engine and one uvicorn server in one process.

    main thread: uvicorn's event loop (HTTP, SSE; never waits on the engine)
    engine loop thread: scheduler + model (Engine's own; all torch work there)
    grammar mask fill threads: a pass's grammar masks, beside the forward pass
    grammar compile workers: child processes, driven by a thread of their own;
    a request meets them only when its constraint is not cached. Tokenizing and
    templates run on the event loop, large bodies and every JSON response body in an
    executor thread: docs/architecture.md, "The contexts a request meets".

Why a thread and not a process: see docs/server.md.

Shutdown on SIGTERM or SIGINT: uvicorn stops accepting connections, the engine
is shut down at the same time (every running request ends as an abort, every
waiting call raises ``EngineStoppedError``), so open streams end within about a
second instead of running to their ``max_tokens``; then the process exits 0.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn

from radixlm.runtime.entrypoints.engine import Engine
from radixlm.runtime.entrypoints.http.server.app import build_app
from radixlm.runtime.entrypoints.http.server.config import ServerConfig
from radixlm.runtime.entrypoints.http.server.connection import TimedH11Protocol
from radixlm.runtime.entrypoints.http.server.state import ServerState

__all__ = ["HTTPServer", "serve"]

logger = logging.getLogger("radixlm.http")
# Streams still open this long after a signal are closed by uvicorn.
GRACEFUL_SHUTDOWN_S = 10
# The most the server waits for the engine's grammar compile worker before it listens:
# its start takes seconds of a core, which passes beside it on 2 cores lose 2-3x of.
COMPILE_WORKER_WAIT_S = 60.0
_EXIT_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class HTTPServer(uvicorn.Server):
    """uvicorn's server whose exit signal also stops the engine (in a thread: the
    signal handler runs on the event loop, which must keep serving the streams'
    last events)."""

    def __init__(self, config: uvicorn.Config, engine: Engine) -> None:
        super().__init__(config)
        self._engine = engine

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """SIGTERM/SIGINT start the graceful exit. Unlike uvicorn's own, the signal is
        not raised again once the server stopped: a requested stop exits 0."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in _EXIT_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: Any) -> None:
        if not self.should_exit:
            logger.info("signal %d: stopping; in-flight requests are aborted", sig)
            threading.Thread(target=self._engine.shutdown, name="radixlm-shutdown").start()
        super().handle_exit(sig, frame)


def uvicorn_config(state: ServerState, log_level: str = "info") -> uvicorn.Config:
    """uvicorn's options for this server: its app, address, and connections with
    read deadlines (``connection.TimedH11Protocol``)."""
    app = build_app(state)
    protocol = functools.partial(
        TimedH11Protocol, header_timeout_s=state.config.header_read_timeout_s
    )
    return uvicorn.Config(
        app,
        host=state.config.host,
        port=state.config.port,
        http=protocol,  # type: ignore[arg-type]
        log_level=log_level,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        lifespan="off",
        access_log=False,  # the app writes its own, with each request's X-Request-Id
    )


def serve(config: ServerConfig, engine_kwargs: dict[str, Any]) -> int:
    """Builds the engine, serves until SIGTERM/SIGINT, returns the exit status: 0, or 1
    when the engine stopped on its own (its loop crashed, a tensor-parallel rank died):
    the server then stops too instead of answering 503s (a supervisor restarts it)."""
    _import_in_background("jsonschema")
    engine = Engine(**engine_kwargs)
    if not engine.wait_for_compile_worker(COMPILE_WORKER_WAIT_S):
        logger.warning(
            "the grammar compile worker is not ready after %g s; serving anyway (the "
            "first constrained request waits for it)",
            COMPILE_WORKER_WAIT_S,
        )
    state = None
    failed = threading.Event()
    try:
        state = ServerState.create(engine, config)
        server = HTTPServer(uvicorn_config(state), engine)
        watchdog = threading.Thread(
            target=_stop_on_engine_failure,
            args=(engine, server, failed),
            name="radixlm-engine-watch",
            daemon=True,
        )
        watchdog.start()
        server.run()
    finally:
        engine.shutdown()
        if state is not None:
            state.close()  # the traces still batched
    return 1 if failed.is_set() else 0


def _import_in_background(module: str) -> None:
    """Imports ``module`` on a thread while the engine loads: the first request that needs
    it (a JSON schema, tools; imported lazily, as most commands never do) does not wait
    for the import."""
    threading.Thread(
        target=importlib.import_module, args=(module,), name="radixlm-import", daemon=True
    ).start()


ENGINE_CHECK_S = 0.5  # how often the server looks for a failed engine


def _stop_on_engine_failure(engine: Engine, server: HTTPServer, failed: threading.Event) -> None:
    while not server.should_exit:
        if engine.failure is not None:
            logger.error("the engine stopped (%s); the server exits", engine.failure)
            failed.set()
            server.should_exit = True
            return
        time.sleep(ENGINE_CHECK_S)
