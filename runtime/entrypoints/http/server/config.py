"""The HTTP server's own options; the engine's stay in ``EngineConfig``.

``radixlm serve`` derives one flag per field (``--max-queued-requests``), as the
engine flags are derived from ``EngineConfig``.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import ClassVar
from urllib.parse import urlsplit

from radixlm.runtime.config import ConfigError
from radixlm.runtime.tools.format import tool_format_named

__all__ = ["ServerConfig", "otlp_traces_url"]


@dataclass(frozen=True)
class ServerConfig:
    """How the server listens and what it admits.

    host, port: where it listens (127.0.0.1 by default: reachable from this machine only).
    api_key: a key, or several (``--api-key`` given more than once; kept as a tuple).
        With any key (here or in ``api_key_file``) every endpoint but ``/health`` needs
        ``Authorization: Bearer <one of them>``, and a stored response (the Responses
        API) is seen only with the key that stored it.
    api_key_file: a file of more keys, one a line (surrounding whitespace stripped;
        blank lines and lines starting with ``#`` skipped), read once at start; kept as
        an absolute path.
    max_queued_requests: the most generations (an ``n``-sample request counts ``n``
        per prompt) the server holds at once, running or waiting; past it a new
        request is answered 503 with ``Retry-After``.
    max_request_body_bytes: larger request bodies are answered 413 unread.
    max_messages, max_tools: the most ``messages`` (chat) or ``input`` items (Responses),
        and the most ``tools``, one request may carry (OpenAI caps tools at 128); a body
        with more is a 400 ``request_limit_exceeded``, counted before it is validated
        or any prompt is built (rendering a huge list only to refuse it takes seconds).
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
    tool_call_parser: the format the model writes tool calls in (``tools.format.FORMATS``:
        hermes, llama3_json, mistral, qwen3_coder, deepseek_v3, granite); None: detected
        from the chat template's tool markers (Hermes when it has none).
    otlp_traces_endpoint: where to export one OpenTelemetry trace per generation request
        (OTLP over HTTP, protobuf): a collector's URL (``http://collector:4318``, to which
        ``/v1/traces`` is added when it has no path, or the full ``.../v1/traces``); a bare
        ``host:port`` means ``http://host:port``. None: no tracing, and OpenTelemetry is
        never imported. Needs ``pip install 'radixlm[tracing]'``.
    health_generate_timeout_s: how long ``/health_generate`` waits for its one-token
        probe before answering 503.
    served_model_name: the model's id in ``/v1/models``, ``/model_info`` and the metrics'
        labels (None: the hub id the model was named by, else its directory's name).

    What one request may cost (stop strings, logprobs, JSON depth) is the engine's
    ``LimitsConfig``: ``radixlm serve --max-stop-chars ...`` sets those too.
    """

    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | tuple[str, ...] | None = None
    api_key_file: str | None = None
    max_queued_requests: int = 256
    max_request_body_bytes: int = 8 * 1024 * 1024
    max_messages: int = 2048
    max_tools: int = 128
    header_read_timeout_s: float = 10.0
    body_read_timeout_s: float = 60.0
    incremental_streaming_output: bool = False
    log_requests: bool = False
    max_stored_responses: int = 1024
    max_stored_response_bytes: int = 64 * 1024 * 1024
    tool_call_parser: str | None = None
    otlp_traces_endpoint: str | None = None
    health_generate_timeout_s: float = 20.0
    served_model_name: str | None = None
    # api_key_file's keys, set by __post_init__: not a field, so they stay out of
    # asdict() (/get_server_info, the replicas' flags) and repr()
    _file_keys: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host:
            raise ConfigError(f"host must be a non-empty str, got {self.host!r}")
        _check_int("port", self.port, 1, 65535)
        object.__setattr__(self, "api_key", _keys_given(self.api_key))
        file_keys: tuple[str, ...] = ()
        if self.api_key_file is not None:
            path, file_keys = _read_key_file(self.api_key_file)
            object.__setattr__(self, "api_key_file", path)
        object.__setattr__(self, "_file_keys", file_keys)
        _check_int("max_queued_requests", self.max_queued_requests, 1)
        _check_int("max_request_body_bytes", self.max_request_body_bytes, 1)
        _check_int("max_messages", self.max_messages, 1)
        _check_int("max_tools", self.max_tools, 1)
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
        if self.served_model_name is not None and not (
            isinstance(self.served_model_name, str) and self.served_model_name.strip()
        ):
            raise ConfigError(
                f"served_model_name must be a non-empty str, got {self.served_model_name!r}"
            )

    @property
    def api_keys(self) -> tuple[str, ...]:
        """Every key the server accepts, ``api_key``'s then ``api_key_file``'s; () means
        the server is open."""
        return tuple(dict.fromkeys((*(self.api_key or ()), *self._file_keys)))


def _keys_given(value: object) -> tuple[str, ...] | None:
    keys = (value,) if isinstance(value, str) else value
    if keys is None:
        return None
    if not isinstance(keys, list | tuple) or not keys or not all(_is_key(k) for k in keys):
        raise ConfigError(
            f"api_key must be a non-empty str (or a list of them) without surrounding "
            f"whitespace, or None; got {_redacted(value)}"
        )
    return tuple(keys)


def _is_key(key: object) -> bool:
    return isinstance(key, str) and bool(key) and key == key.strip()


def _redacted(value: object) -> str:
    """What a bad api_key was, without the secret."""
    if isinstance(value, list | tuple):
        return f"a {type(value).__name__} of {len(value)} ({[type(k).__name__ for k in value]})"
    return "an empty str" if value == "" else type(value).__name__


def _read_key_file(path: object) -> tuple[str, tuple[str, ...]]:
    """The file's absolute path and its keys.

    Raises:
        ConfigError: not a readable UTF-8 text file, or one without a key.
    """
    if not isinstance(path, str) or not path:
        raise ConfigError(f"api_key_file must be a path, got {path!r}")
    absolute = os.path.abspath(path)
    try:
        with open(absolute, encoding="utf-8") as f:
            lines = [line.strip() for line in f]
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"api_key_file {absolute}: cannot read it ({e})") from e
    keys = tuple(line for line in lines if line and not line.startswith("#"))
    if not keys:
        raise ConfigError(f"api_key_file {absolute} holds no key (one a line)")
    return absolute, keys


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
