"""``radixlm serve --dp N``: N engine servers behind SGLang's router, from one command.

    radixlm serve --dp 2 --host H --port 30000            this process: the launcher
      |-- radixlm serve --host 127.0.0.1 --port P0 --num-threads T      replica 0
      |-- radixlm serve --host 127.0.0.1 --port P1 --num-threads T      replica 1
      '-- sglang-router --worker-urls http://127.0.0.1:P0 http://127.0.0.1:P1
                        --host H --port 30000 --policy cache_aware

The launcher starts the replicas (each a plain ``radixlm serve`` with the user's server
and engine options, on a free loopback port), waits until every one answers
``/health``, then starts the router on the user's address and waits until it reports
every replica healthy. Routing, health checks, retries and the router's own metrics
are the router's (``sglang-router``, a Rust binary: ``pip install 'radixlm[router]'``);
the launcher only watches and stops processes:

- a replica that exits is logged; the router stops routing to it once its health
  checks fail (``router_health_check_interval_s``); with none left the launcher stops;
- the router exiting stops everything (exit status 1);
- SIGTERM or SIGINT is forwarded to every child, which stop as ``radixlm serve`` does;
  the launcher waits for them (a child still running after ``STOP_GRACE_S`` is killed)
  and exits 0.

CPU threads: each replica gets ``cpu_threads_per_process(N x its tensor-parallel
ranks)`` (``--num-threads`` overrides it), the one rule every multi-process layout uses.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import importlib.util
import json
import logging
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from radixlm.runtime.child_process import python_module_command
from radixlm.runtime.config import ConfigError, EngineConfig, cpu_threads_per_process
from radixlm.runtime.entrypoints.http.server.config import ServerConfig

__all__ = [
    "ROUTER_POLICIES",
    "Fleet",
    "FleetConfig",
    "RouterNotInstalledError",
    "config_flags",
    "free_ports",
    "serve_fleet",
]

logger = logging.getLogger("radixlm.fleet")

ROUTER_POLICIES = ("cache_aware", "round_robin", "random", "power_of_two")
ROUTER_LOG_LEVELS = ("debug", "info", "warn", "error")
ROUTER_EXTRA = "pip install 'radixlm[router]'"
STOP_GRACE_S = 20.0  # a server's own graceful exit takes up to 10 s (http/server/serve.py)
ROUTER_START_TIMEOUT_S = 60.0
_POLL_S = 0.25


class RouterNotInstalledError(ConfigError):
    """``--dp`` above 1 without the ``sglang-router`` package."""


@dataclass(frozen=True)
class FleetConfig:
    """How many engine replicas ``radixlm serve`` starts and how the router routes.

    dp_size: engine replicas (SGLang's ``--dp``), each a ``radixlm serve`` process with
        its own KV cache; 1 serves one engine without a router.
    router_policy: sglang-router's policy: ``cache_aware`` (the replica whose cache
        holds the longest prefix of the request, unless the load is unbalanced),
        ``round_robin``, ``random``, ``power_of_two`` (the less loaded of two replicas,
        by their ``/get_load``).
    router_health_check_interval_s: seconds between the router's ``/health`` checks of
        each replica; a replica failing 3 in a row is taken out of routing.
    router_prometheus_port: where the router exports its own metrics, on the server's
        host (None: a free port, logged at start).
    router_log_level: what the router logs ("info": also a line as each request starts
        and ends, beside the replicas' own access lines).
    replica_start_timeout_s: how long the replicas may take to load the model and
        answer ``/health``.
    """

    dp_size: int = 1
    router_policy: Literal["cache_aware", "round_robin", "random", "power_of_two"] = "cache_aware"
    router_health_check_interval_s: int = 10
    router_prometheus_port: int | None = None
    router_log_level: Literal["debug", "info", "warn", "error"] = "warn"
    replica_start_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        _check_int("dp_size", self.dp_size, 1)
        if self.router_policy not in ROUTER_POLICIES:
            raise ConfigError(
                f"router_policy must be one of {ROUTER_POLICIES}, got {self.router_policy!r}"
            )
        _check_int("router_health_check_interval_s", self.router_health_check_interval_s, 1)
        if self.router_log_level not in ROUTER_LOG_LEVELS:
            raise ConfigError(
                f"router_log_level must be one of {ROUTER_LOG_LEVELS}, "
                f"got {self.router_log_level!r}"
            )
        if self.router_prometheus_port is not None:
            _check_int("router_prometheus_port", self.router_prometheus_port, 1, 65535)
        timeout = self.replica_start_timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise ConfigError(f"replica_start_timeout_s must be > 0 seconds, got {timeout!r}")


def _check_int(name: str, value: object, minimum: int, maximum: int | None = None) -> None:
    too_big = maximum is not None and isinstance(value, int) and value > maximum
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or too_big:
        bounds = f"in [{minimum}, {maximum}]" if maximum is not None else f">= {minimum}"
        raise ConfigError(f"{name} must be an integer {bounds}, got {value!r}")


# ---- the children's command lines --------------------------------------------------------


def config_flags(values: Mapping[str, Any], fields: Iterable[dataclasses.Field]) -> list[str]:
    """The ``radixlm serve`` flags that set ``values`` (the inverse of the CLI's derived
    flags): one per field whose value is not its default; ``--x``/``--no-x`` for a bool."""
    flags = []
    for field in fields:
        value = values.get(field.name, field.default)
        if value is None or value == field.default:
            continue
        flag = "--" + field.name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, tuple):  # a repeated flag (--api-key)
            flags += [f"{flag}={item}" for item in value]
        else:
            flags.append(f"{flag}={value}")
    return flags


def replica_command(
    server: ServerConfig, engine_kwargs: Mapping[str, Any], port: int, num_threads: int
) -> list[str]:
    """``radixlm serve`` on 127.0.0.1:``port`` with the user's other options and
    ``num_threads`` unless the user set it."""
    replica = dataclasses.replace(server, host="127.0.0.1", port=port)
    engine = {**engine_kwargs, "num_threads": engine_kwargs.get("num_threads") or num_threads}
    return python_module_command(
        "radixlm.runtime.entrypoints.cli",
        "serve",
        *config_flags(dataclasses.asdict(replica), dataclasses.fields(ServerConfig)),
        *config_flags(engine, EngineConfig.flat_fields()),
    )


def router_command(
    fleet: FleetConfig, server: ServerConfig, worker_urls: Sequence[str], prometheus_port: int
) -> list[str]:
    """sglang-router in front of ``worker_urls`` on the user's address. With an API key
    the router presents it to the replicas; clients' own ``Authorization`` is forwarded.

    Raises:
        ConfigError: more than one API key (the router checks clients against one).
    """
    key = router_key(server)
    command = python_module_command(
        "sglang_router.launch_router",
        "--worker-urls",
        *worker_urls,
        "--host",
        server.host,
        "--port",
        str(server.port),
        "--policy",
        fleet.router_policy,
        "--health-check-interval-secs",
        str(fleet.router_health_check_interval_s),
        "--prometheus-host",
        server.host,
        "--prometheus-port",
        str(prometheus_port),
        "--log-level",
        fleet.router_log_level,
    )
    if key is not None:
        command += ["--api-key", key]
    return command


def router_key(server: ServerConfig) -> str | None:
    """The API key the router checks clients against and presents to the replicas.

    Raises:
        ConfigError: more than one key (the router knows one).
    """
    keys = server.api_keys
    if len(keys) > 1:
        raise ConfigError(
            f"--dp above 1 takes one API key ({len(keys)} given by --api-key / "
            "--api-key-file): sglang-router checks every client against a single key"
        )
    return keys[0] if keys else None


def threads_per_replica(fleet: FleetConfig, engine_kwargs: Mapping[str, Any]) -> int:
    """The one rule's share for each replica's processes (its tensor-parallel ranks).

    Raises:
        ConfigError: an engine option is unknown or has a bad value.
    """
    ranks = EngineConfig.from_kwargs(**engine_kwargs).parallel.ranks_per_node
    return cpu_threads_per_process(fleet.dp_size * ranks)


def check_router_installed() -> None:
    """Raises RouterNotInstalledError naming the extra that brings the router."""
    if importlib.util.find_spec("sglang_router") is None:
        raise RouterNotInstalledError(
            f"--dp above 1 puts SGLang's router in front of the replicas: {ROUTER_EXTRA}"
        )


def free_ports(n: int) -> list[int]:
    """``n`` distinct loopback ports nothing listens on now (the OS's picks, all held
    until every one is picked, then let go)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


# ---- the running processes ----------------------------------------------------------------


@dataclass
class Fleet:
    """The replicas and the router of one ``serve_fleet``, and what became of them."""

    replicas: list[subprocess.Popen]
    urls: list[str]
    router: subprocess.Popen | None = None
    gone: set[int] = dataclasses.field(default_factory=set)  # replica indexes seen exited

    def children(self) -> list[subprocess.Popen]:
        return [*self.replicas, *([self.router] if self.router else [])]

    def note_exited_replicas(self) -> None:
        """Logs each replica that exited since the last call."""
        for i, proc in enumerate(self.replicas):
            if i not in self.gone and proc.poll() is not None:
                self.gone.add(i)
                logger.warning(
                    "replica %d (%s, pid %d) exited with status %s; the router stops "
                    "routing to it once its health checks fail; %d replicas left",
                    i,
                    self.urls[i],
                    proc.pid,
                    proc.returncode,
                    len(self.replicas) - len(self.gone),
                )

    def stop(self) -> None:
        """SIGTERM to every child still running, then wait; kill what outlives the grace."""
        running = [p for p in self.children() if p.poll() is None]
        for proc in running:
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in running:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.warning("pid %d did not stop within %.0f s: killed", proc.pid, STOP_GRACE_S)
                proc.kill()
                proc.wait()


def serve_fleet(fleet: FleetConfig, server: ServerConfig, engine_kwargs: dict[str, Any]) -> int:
    """Runs the replicas and the router until SIGTERM/SIGINT (exit status 0), the router's
    exit or the last replica's (1). Returns the exit status.

    Raises:
        RouterNotInstalledError: sglang-router is not installed.
        ConfigError: an engine option is unknown or has a bad value.
    """
    check_router_installed()
    router_key(server)  # its ConfigError before any replica starts
    num_threads = threads_per_replica(fleet, engine_kwargs)
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in _EXIT_SIGNALS}
    *ports, metrics_port = free_ports(fleet.dp_size + 1)
    running = Fleet([], [f"http://127.0.0.1:{port}" for port in ports])
    try:
        for i, port in enumerate(ports):
            command = replica_command(server, engine_kwargs, port, num_threads)
            running.replicas.append(_start(command))
            logger.info("replica %d: %s (pid %d)", i, running.urls[i], running.replicas[i].pid)
        if not _await_replicas(running, fleet.replica_start_timeout_s, stop):
            return 0 if stop.is_set() else 1
        prometheus_port = fleet.router_prometheus_port or metrics_port
        running.router = _start(router_command(fleet, server, running.urls, prometheus_port))
        if not _await_router(running, server, stop):
            return 0 if stop.is_set() else 1
        logger.info(
            "serving on http://%s:%d: %d replicas behind sglang-router (policy %s, its "
            "metrics on port %d)",
            server.host,
            server.port,
            fleet.dp_size,
            fleet.router_policy,
            prometheus_port,
        )
        return _supervise(running, stop)
    finally:
        running.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


_EXIT_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _start(command: list[str]) -> subprocess.Popen:
    return subprocess.Popen(command, preexec_fn=_stop_with_parent)


def _stop_with_parent() -> None:
    """In the child before exec: SIGTERM when the launcher dies, even by SIGKILL (Linux),
    so no replica outlives it."""
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _await_replicas(running: Fleet, timeout_s: float, stop: threading.Event) -> bool:
    """Until every replica answers /health 200 (True); False on a stop, a replica's
    exit or the timeout (logged)."""
    deadline = time.monotonic() + timeout_s
    waiting = set(range(len(running.replicas)))
    while waiting and not stop.is_set():
        for i in sorted(waiting):
            if running.replicas[i].poll() is not None:
                status = running.replicas[i].returncode
                logger.error("replica %d exited while starting (status %s)", i, status)
                return False
            if _get_json(running.urls[i] + "/health", {}) is not None:
                waiting.discard(i)
        if time.monotonic() > deadline:
            logger.error("replicas %s not healthy after %.0f s", sorted(waiting), timeout_s)
            return False
        stop.wait(_POLL_S)
    return not stop.is_set()


def _await_router(running: Fleet, server: ServerConfig, stop: threading.Event) -> bool:
    """Until the router reports every replica healthy (True); False on a stop, the
    router's exit or ``ROUTER_START_TIMEOUT_S`` (logged)."""
    url = f"http://{_url_host(server.host)}:{server.port}/readiness"
    key = router_key(server)
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    deadline = time.monotonic() + ROUTER_START_TIMEOUT_S
    while not stop.is_set():
        assert running.router is not None
        if running.router.poll() is not None:
            status = running.router.returncode
            logger.error("sglang-router exited while starting (status %s)", status)
            return False
        readiness = _get_json(url, headers)
        if isinstance(readiness, dict) and readiness.get("healthy_workers") == len(running.urls):
            return True
        if time.monotonic() > deadline:
            logger.error("sglang-router not ready after %.0f s", ROUTER_START_TIMEOUT_S)
            return False
        stop.wait(_POLL_S)
    return False


def _supervise(running: Fleet, stop: threading.Event) -> int:
    """Watches the children until a stop (0), the router's exit or the last replica's (1)."""
    while not stop.wait(_POLL_S):
        running.note_exited_replicas()
        if len(running.gone) == len(running.replicas):
            logger.error("every replica has exited: stopping the router")
            return 1
        assert running.router is not None
        if running.router.poll() is not None:
            status = running.router.returncode
            logger.error("sglang-router exited (status %s): stopping the replicas", status)
            return 1
    logger.info("stopping: the router and %d replicas", len(running.replicas))
    return 0


def _get_json(url: str, headers: Mapping[str, str]) -> Any:
    """A 200 answer's JSON (``{}`` when its body is not JSON), or None for anything else
    (no answer yet, another status)."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=2) as r:
            body = r.read()
    except (OSError, urllib.error.URLError):  # refused, reset, timed out, HTTP errors
        return None
    try:
        return json.loads(body)
    except ValueError:
        return {}


def _url_host(host: str) -> str:
    """How a URL names, from this machine, a server listening on ``host``."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"[{host}]" if ":" in host else host
