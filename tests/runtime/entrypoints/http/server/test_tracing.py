"""OpenTelemetry traces (``--otlp-traces-endpoint``) sent to a collector in this test: a
tiny HTTP server on 127.0.0.1 that takes OTLP/HTTP protobuf POSTs to ``/v1/traces`` and
decodes them with opentelemetry-proto. One trace per generation request, its stages as
child spans, the caller's ``traceparent`` honoured, no prompt text unless
``--log-requests``."""

from __future__ import annotations

import functools
import gzip
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

pytest.importorskip("opentelemetry.sdk")
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (  # noqa: E402
    ExportTraceServiceRequest,
)

from radixlm.runtime.config import ConfigError  # noqa: E402
from radixlm.runtime.entrypoints.http import ServerConfig  # noqa: E402
from radixlm.runtime.entrypoints.http.server.config import otlp_traces_url  # noqa: E402
from tests.runtime.entrypoints.http.conftest import running_server, wait_idle  # noqa: E402

# a loaded 2-core machine can take seconds: never httpx's 5 s default
post = functools.partial(httpx.post, timeout=120)
get = functools.partial(httpx.get, timeout=120)

# In no span, no log and no export unless --log-requests: checked in the raw bytes.
SECRET = "zebra-quokka-7731 tell me about tea"
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"
STAGES = ("tokenize", "queue", "prefill", "decode", "detokenize")


@dataclass(frozen=True)
class Span:
    name: str
    trace_id: str
    span_id: str
    parent: str
    start_ns: int
    end_ns: int
    attributes: dict
    status: int


class Collector:
    """Keeps every OTLP/HTTP traces export it receives (raw bytes and decoded spans)."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.paths: list[str] = []
        self._lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                with collector._lock:
                    collector.bodies.append(body)
                    collector.paths.append(self.path)
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def spans(self) -> list[Span]:
        with self._lock:
            bodies = list(self.bodies)
        return [span for body in bodies for span in _decode(body)]

    def raw(self) -> bytes:
        with self._lock:
            return b"".join(self.bodies)

    def clear(self) -> None:
        with self._lock:
            self.bodies.clear()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def _decode(body: bytes) -> Iterator[Span]:
    request = ExportTraceServiceRequest.FromString(body)
    for resource_spans in request.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            for s in scope_spans.spans:
                yield Span(
                    s.name,
                    s.trace_id.hex(),
                    s.span_id.hex(),
                    s.parent_span_id.hex(),
                    s.start_time_unix_nano,
                    s.end_time_unix_nano,
                    {a.key: _value(a.value) for a in s.attributes},
                    s.status.code,
                )


def _value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind)


@pytest.fixture(scope="module")
def collector():
    c = Collector()
    yield c
    c.close()


@pytest.fixture(scope="module")
def server(http_engine, collector):
    with running_server(http_engine, otlp_traces_endpoint=collector.url) as running:
        yield running
        running.state.close()


def _flush(server) -> None:
    assert server.state.tracer._provider.force_flush(10_000)


def _trace(server, collector, request_id: str) -> list[Span]:
    """The spans of the request that carried ``request_id``: its request span first.
    (They are made just after the response's last byte: the client may be faster.)"""
    deadline = time.monotonic() + 10
    while True:
        _flush(server)
        spans = collector.spans()
        roots = [s for s in spans if s.attributes.get("radixlm.request_id") == request_id]
        if roots or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    (root,) = roots
    return [root] + [s for s in spans if s.parent == root.span_id]


CALLS = {
    "/v1/chat/completions": {
        "model": "default",
        "messages": [{"role": "user", "content": SECRET}],
        "max_tokens": 4,
        "temperature": 0,
    },
    "/v1/completions": {"model": "default", "prompt": SECRET, "max_tokens": 4, "n": 2},
    "/generate": {"text": SECRET, "sampling_params": {"max_new_tokens": 4, "temperature": 0}},
    "/v1/responses": {"model": "default", "input": SECRET, "max_output_tokens": 4},
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("path", list(CALLS))
def test_one_trace_per_request_with_its_stages_and_no_prompt(
    server, collector, http_engine, path, stream
):
    collector.clear()
    request_id = f"trace-{path.strip('/').replace('/', '-')}-{stream}"
    headers = {
        "X-Request-Id": request_id,
        "traceparent": f"00-{TRACE_ID}-{CALLER_SPAN}-01",
    }
    body = {**CALLS[path], "stream": stream}
    response = post(server.base_url + path, json=body, headers=headers, timeout=60)
    assert response.status_code == 200 and response.headers["x-request-id"] == request_id
    wait_idle(http_engine)
    root, *children = _trace(server, collector, request_id)

    assert root.name == f"POST {path}"
    assert root.trace_id == TRACE_ID and root.parent == CALLER_SPAN  # the caller's child
    attributes = root.attributes
    assert attributes["http.response.status_code"] == 200
    assert attributes["http.route"] == path
    num_outputs = CALLS[path].get("n", 1)
    assert attributes["radixlm.num_outputs"] == num_outputs
    assert len(attributes["radixlm.rids"]) == num_outputs
    assert all(rid.startswith(request_id + "-") for rid in attributes["radixlm.rids"])
    assert attributes["gen_ai.usage.input_tokens"] > 0
    assert 0 < attributes["gen_ai.usage.output_tokens"] <= 4 * num_outputs
    assert attributes["gen_ai.response.model"] == server.state.model_name
    if path != "/generate":
        assert attributes["gen_ai.request.model"] == "default"
    assert set(attributes["gen_ai.response.finish_reasons"]) <= {"length", "stop"}
    assert "radixlm.cached_tokens" in attributes

    names = [c.name for c in children]
    assert names.count("tokenize") == names.count("detokenize") == 1
    for stage in ("queue", "prefill", "decode"):
        assert names.count(stage) == num_outputs
    by_name = {c.name: c for c in children}
    for c in children:  # inside the request span, in order
        assert root.start_ns <= c.start_ns <= c.end_ns <= root.end_ns, c
    assert by_name["tokenize"].end_ns <= by_name["queue"].start_ns + 1_000
    assert by_name["queue"].end_ns == by_name["prefill"].start_ns
    assert by_name["prefill"].end_ns == by_name["decode"].start_ns
    assert by_name["decode"].attributes["radixlm.rid"] in attributes["radixlm.rids"]
    assert by_name["prefill"].attributes["gen_ai.usage.input_tokens"] > 0

    assert SECRET.encode() not in collector.raw()  # never a prompt without --log-requests
    assert not any(SECRET in str(v) for s in collector.spans() for v in s.attributes.values())


def test_a_refused_request_is_one_span_without_stages(server, collector):
    collector.clear()
    body = {"model": "default", "messages": [{"role": "user", "content": SECRET}], "n": 0}
    response = post(
        server.base_url + "/v1/chat/completions", json=body, headers={"X-Request-Id": "bad-1"}
    )
    assert response.status_code == 400
    root, *children = _trace(server, collector, "bad-1")
    assert root.attributes["http.response.status_code"] == 400 and children == []
    assert root.trace_id != TRACE_ID and root.parent == ""  # no traceparent: a new trace
    assert SECRET.encode() not in collector.raw()


def test_routes_that_do_not_generate_are_not_traced(server, collector):
    collector.clear()
    for path in ("/health", "/v1/models", "/server_info"):
        assert get(server.base_url + path).status_code == 200
    _flush(server)
    assert collector.spans() == []


def test_with_log_requests_the_prompt_and_output_are_attributes(http_engine, collector):
    collector.clear()
    with running_server(
        http_engine, otlp_traces_endpoint=collector.url, log_requests=True
    ) as server:
        body = {**CALLS["/v1/chat/completions"], "stream": False}
        reply = post(
            server.base_url + "/v1/chat/completions", json=body, headers={"X-Request-Id": "lr"}
        ).json()
        root, *_ = _trace(server, collector, "lr")
        server.state.close()
    assert SECRET in root.attributes["gen_ai.prompt"]
    assert reply["choices"][0]["message"]["content"] in root.attributes["gen_ai.completion"]


def test_endpoint_urls():
    assert otlp_traces_url("collector:4318") == "http://collector:4318/v1/traces"
    assert otlp_traces_url("http://c:4318/") == "http://c:4318/v1/traces"
    assert otlp_traces_url("https://c/otlp/v1/traces") == "https://c/otlp/v1/traces"
    for bad in ("ftp://c:21", "http://a b", "http://", ""):
        with pytest.raises(ConfigError, match="URL"):
            ServerConfig(otlp_traces_endpoint=bad)


def test_a_missing_package_is_a_clear_error(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name.startswith("opentelemetry.exporter") else real(name, *a),
    )
    with pytest.raises(ConfigError, match=r"pip install 'radixlm\[tracing\]'"):
        ServerConfig(otlp_traces_endpoint="http://127.0.0.1:4318")


def test_without_the_flag_no_tracing_package_is_imported():
    """FastAPI itself imports opentelemetry's API; the SDK and the exporter only come
    with --otlp-traces-endpoint."""
    code = (
        "import sys\n"
        "from radixlm.runtime.entrypoints.http import ServerConfig\n"
        "from radixlm.runtime.entrypoints.http.server.app import build_app\n"
        "import radixlm.runtime.entrypoints.http.server.serve, radixlm.runtime.entrypoints.cli\n"
        "ServerConfig()\n"
        "bad = [m for m in sys.modules if m.startswith(('opentelemetry.sdk', "
        "'opentelemetry.exporter', 'radixlm.runtime.entrypoints.http.server.tracing'))]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, cwd="/tmp")


def test_spans_are_made_after_the_response_not_on_the_engine_loop(server, collector):
    """The engine loop thread never calls OpenTelemetry: every span is started on the
    server's event loop thread, once its response ended."""
    import opentelemetry.sdk.trace as sdk_trace

    threads: list[str] = []
    original = sdk_trace.Tracer.start_span

    def recording(self, *args, **kwargs):
        threads.append(threading.current_thread().name)
        return original(self, *args, **kwargs)

    sdk_trace.Tracer.start_span = recording
    try:
        body = {**CALLS["/generate"], "stream": True}
        started = time.perf_counter()
        post(server.base_url + "/generate", json=body, timeout=60)
        deadline = started + 10
        while len(threads) < 6 and time.perf_counter() < deadline:
            time.sleep(0.01)
    finally:
        sdk_trace.Tracer.start_span = original
    assert len(threads) == 6 and set(threads) == {"radixlm-test-server"}


def test_the_cli_names_the_extra_before_loading_a_model(monkeypatch, capsys):
    import importlib.util

    from radixlm.runtime.entrypoints.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name.startswith("opentelemetry.sdk") else real(name, *a),
    )
    code = main(["serve", "--otlp-traces-endpoint", "http://127.0.0.1:4318", "--port", "1"])
    assert code == 2
    assert "pip install 'radixlm[tracing]'" in capsys.readouterr().err
