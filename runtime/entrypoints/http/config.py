"""The HTTP server's own options; the engine's stay in ``EngineConfig``.

``radixlm serve`` derives one flag per field (``--max-queued-requests``), as the
engine flags are derived from ``EngineConfig``.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from urllib.parse import urlsplit

from radixlm.runtime.config import ConfigError
from radixlm.runtime.entrypoints.http.tool_format import tool_format_named

__all__ = ["ServerConfig", "otlp_traces_url"]


@dataclass(frozen=True)
class ServerConfig:
    """How the server listens and what it admits.

    host, port: where it listens (127.0.0.1 by default: reachable from this machine only).
    api_key: when set, every endpoint but ``/health`` needs ``Authorization: Bearer <key>``.
    max_queued_requests: the most generations (an ``n``-sample request counts ``n``
        per prompt) the server holds at once, running or waiting; past it a new
        request is answered 503 with ``Retry-After``.
    max_request_body_bytes: larger request bodies are answered 413 unread.
    header_read_timeout_s: a connection whose next request's headers have not all
        arrived this long after it opened (or after its last response) is closed (408).
    body_read_timeout_s: a request body not received whole this long after its
        headers is answered 408 (the most a slow upload can hold a connection).
    incremental_streaming_output: streamed ``/generate`` events carry only the text and
        ``output_ids`` new since the previous event (SGLang's option of the same name);
        off: the text and ids so far. Output logprobs are the new tokens' either way
        (``output_token_logprobs_length`` and ``completion_tokens`` count all), as
        SGLang's server sends them.
    log_requests: log each request's prompt and output (off: only method, path, status).
    max_stored_responses, max_stored_response_bytes: the Responses API keeps responses
        (``store``, the default) in memory for ``previous_response_id`` and ``GET``, at
        most this many and this many bytes of JSON together; the least recently used
        are dropped first (0: keep none).
    tool_call_parser: the format the model writes tool calls in (``tool_format.FORMATS``:
        hermes, llama3_json, mistral, qwen3_coder, deepseek_v3, granite); None: detected
        from the chat template's tool markers (Hermes when it has none).
    otlp_traces_endpoint: where to export one OpenTelemetry trace per generation request
        (OTLP over HTTP, protobuf): a collector's URL (``http://collector:4318``, to which
        ``/v1/traces`` is added when it has no path, or the full ``.../v1/traces``); a bare
        ``host:port`` means ``http://host:port``. None: no tracing, and OpenTelemetry is
        never imported. Needs ``pip install 'radixlm[tracing]'``.
    health_generate_timeout_s: how long ``/health_generate`` waits for its one-token
        probe before answering 503.

    What one request may cost (stop strings, logprobs, JSON depth) is the engine's
    ``LimitsConfig``: ``radixlm serve --max-stop-chars ...`` sets those too.
    """

    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = None
    max_queued_requests: int = 256
    max_request_body_bytes: int = 8 * 1024 * 1024
    header_read_timeout_s: float = 10.0
    body_read_timeout_s: float = 60.0
    incremental_streaming_output: bool = False
    log_requests: bool = False
    max_stored_responses: int = 1024
    max_stored_response_bytes: int = 64 * 1024 * 1024
    tool_call_parser: str | None = None
    otlp_traces_endpoint: str | None = None
    health_generate_timeout_s: float = 20.0

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host:
            raise ConfigError(f"host must be a non-empty str, got {self.host!r}")
        _check_int("port", self.port, 1, 65535)
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key):
            raise ConfigError("api_key must be a non-empty str or None")
        _check_int("max_queued_requests", self.max_queued_requests, 1)
        _check_int("max_request_body_bytes", self.max_request_body_bytes, 1)
        _check_seconds("header_read_timeout_s", self.header_read_timeout_s)
        _check_seconds("body_read_timeout_s", self.body_read_timeout_s)
        if not isinstance(self.incremental_streaming_output, bool):
            raise ConfigError("incremental_streaming_output must be a bool")
        if not isinstance(self.log_requests, bool):
            raise ConfigError(f"log_requests must be a bool, got {self.log_requests!r}")
        _check_int("max_stored_responses", self.max_stored_responses, 0)
        _check_int("max_stored_response_bytes", self.max_stored_response_bytes, 0)
        if self.tool_call_parser is not None:
            _check_tool_call_parser(self.tool_call_parser)
        if self.otlp_traces_endpoint is not None:
            _check_otlp_endpoint(self.otlp_traces_endpoint)
        _check_seconds("health_generate_timeout_s", self.health_generate_timeout_s)


def _check_int(name: str, value: object, minimum: int, maximum: int | None = None) -> None:
    too_big = maximum is not None and isinstance(value, int) and value > maximum
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or too_big:
        bounds = f"in [{minimum}, {maximum}]" if maximum is not None else f">= {minimum}"
        raise ConfigError(f"{name} must be an integer {bounds}, got {value!r}")


def _check_tool_call_parser(name: object) -> None:
    try:
        tool_format_named(name if isinstance(name, str) else repr(name))
    except ValueError as e:
        raise ConfigError(f"tool_call_parser: {e}") from e


# What --otlp-traces-endpoint imports (the radixlm[tracing] extra), checked before the
# model loads.
TRACING_MODULES = ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http")


def otlp_traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL of ``endpoint``: ``host:port`` -> ``http://host:port``;
    no path -> ``/v1/traces`` added (as OTEL_EXPORTER_OTLP_ENDPOINT is read).

    Raises:
        ConfigError: not an http(s) URL with a host.
    """
    if not isinstance(endpoint, str) or not endpoint or any(c.isspace() for c in endpoint):
        raise ConfigError(f"otlp_traces_endpoint must be a URL, got {endpoint!r}")
    url = endpoint if "://" in endpoint else f"http://{endpoint}"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"otlp_traces_endpoint must be an http(s) URL, got {endpoint!r}")
    return url.rstrip("/") + "/v1/traces" if parts.path in ("", "/") else url


def _check_otlp_endpoint(endpoint: object) -> None:
    otlp_traces_url(endpoint)  # type: ignore[arg-type]
    for name in TRACING_MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # a parent package is missing
            found = False
        if not found:
            raise ConfigError(
                f"otlp_traces_endpoint needs OpenTelemetry's SDK and OTLP exporter ({name} "
                "is not installed): pip install 'radixlm[tracing]'"
            )


def _check_seconds(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e6:
        raise ConfigError(f"{name} must be a number of seconds in (0, 1e6), got {value!r}")
