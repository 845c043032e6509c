"""The HTTP server's own options; the engine's stay in ``EngineConfig``.

``radixlm serve`` derives one flag per field (``--max-queued-requests``), as the
engine flags are derived from ``EngineConfig``.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixlm.runtime.config import ConfigError
from radixlm.runtime.entrypoints.http.tool_format import tool_format_named

__all__ = ["ServerConfig"]


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


def _check_seconds(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e6:
        raise ConfigError(f"{name} must be a number of seconds in (0, 1e6), got {value!r}")
