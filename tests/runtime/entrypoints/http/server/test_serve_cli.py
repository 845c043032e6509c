"""``radixlm serve`` as a process: SIGTERM mid-stream aborts the stream and exits 0."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import httpx

from tests.runtime.entrypoints.http.conftest import free_port

START_TIMEOUT_S = 90


def test_sigterm_aborts_in_flight_streams_and_exits_zero(default_model_dir):
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "radixlm.runtime.entrypoints.cli",
            "serve",
            "--port",
            str(port),
            "--model-path",
            str(default_model_dir),
            "--dtype",
            "float32",
            "--max-total-tokens",
            "4096",
            "--num-threads",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "server did not come up"
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        body = {
            "model": "default",
            "prompt": "Tell a story:",
            "max_tokens": 3000,
            "ignore_eos": True,
            "stream": True,
        }
        events = []
        with httpx.stream("POST", base + "/v1/completions", json=body, timeout=60) as response:
            for line in response.iter_lines():
                if not line:
                    continue
                events.append(line)
                if len(events) == 3:
                    proc.send_signal(signal.SIGTERM)
        # the stream ended (well before 3000 tokens) and the process exits cleanly
        assert proc.wait(timeout=30) == 0
        payloads = [json.loads(e[6:]) for e in events if e.startswith("data: {")]
        assert len(payloads) < 3000
        assert events[-1] == "data: [DONE]"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
