"""OpenTelemetry traces of generation requests, built after the fact from timestamps.

    POST /v1/chat/completions (request span: SERVER, the caller's traceparent its parent)
      |-- tokenize     body received -> queued (template, tokenize, checks, compile)
      |-- queue        queued -> admitted           } one of each per engine request
      |-- prefill      admitted -> first token      } (n samples, batched prompts),
      |-- decode       first token -> finished      } attributed with its rid
      '-- detokenize   last finished -> response end (final text into the response)

The engine loop never calls OpenTelemetry: it records plain ``perf_counter`` times per
request (``RequestTimes``), and once the HTTP response has ended this module makes the
spans with explicit start and end times, on the event loop; a ``BatchSpanProcessor``
thread sends them (OTLP over HTTP, protobuf). Output text is decoded incrementally on
the engine loop during decode; ``detokenize`` is what remains after the last token.

Prompts and outputs are never attributes unless ``--log-requests`` is on (then as
``gen_ai.prompt`` / ``gen_ai.completion``, as logged). This module is imported, and
OpenTelemetry with it, only when ``--otlp-traces-endpoint`` is set. The tracer provider
is this server's own (never the process-global one).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from radixlm.runtime.config import ConfigError
from radixlm.runtime.entrypoints.http.server.config import otlp_traces_url
from radixlm.runtime.entrypoints.http.server.request_context import RequestRecord
from radixlm.runtime.io.messages import GenerateOutput, RequestTimes

__all__ = ["RequestTracer"]

SCOPE_NAME = "radixlm.http"


class RequestTracer:
    """Exports one trace per finished ``RequestRecord`` (``export``).

    Args:
        endpoint: the collector (``otlp_traces_url`` reads it).
        model_name: the served model (``gen_ai.response.model``).
        log_requests: prompts and outputs may be attributes.

    Raises:
        ConfigError: OpenTelemetry's SDK or OTLP exporter is not installed.
    """

    def __init__(self, endpoint: str, model_name: str, log_requests: bool) -> None:
        try:
            # lazy: optional (radixlm[tracing]), only for --otlp-traces-endpoint
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                OTLPSpanExporter,
            )
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.trace.propagation.tracecontext import (
                TraceContextTextMapPropagator,
            )
        except ImportError as e:
            raise ConfigError(
                f"--otlp-traces-endpoint needs OpenTelemetry ({e.name} is missing): "
                "pip install 'radixlm[tracing]'"
            ) from e
        from opentelemetry import trace  # lazy: with the SDK above

        self._trace = trace
        self._provider = TracerProvider(resource=Resource.create({"service.name": "radixlm"}))
        exporter = OTLPSpanExporter(endpoint=otlp_traces_url(endpoint))
        self._provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self._provider.get_tracer(SCOPE_NAME)
        self._propagator = TraceContextTextMapPropagator()
        self._model_name = model_name
        self._log_requests = log_requests

    def export(self, record: RequestRecord) -> None:
        """Makes the record's spans (the request's, then its stages')."""
        assert record.ended_at is not None
        clock = _Clock()
        parent = self._propagator.extract(record.trace_headers)
        span = self._tracer.start_span(
            f"{record.method} {record.path}",
            context=parent,
            kind=self._trace.SpanKind.SERVER,
            start_time=clock.ns(record.started_at),
            attributes=self._request_attributes(record),
        )
        if record.status is not None and record.status >= 500:
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR))
        inside = self._trace.set_span_in_context(span)
        for name, start, end, attributes in _stages(record):
            child = self._tracer.start_span(
                name, context=inside, start_time=clock.ns(start), attributes=attributes
            )
            child.end(end_time=clock.ns(max(start, end)))
        span.end(end_time=clock.ns(record.ended_at))

    def shutdown(self) -> None:
        """Sends the spans still batched (a few seconds at most) and stops the exporter."""
        self._provider.shutdown()

    def _request_attributes(self, record: RequestRecord) -> dict[str, Any]:
        outputs = record.outputs
        attributes: dict[str, Any] = {
            "http.request.method": record.method,
            "http.route": record.path,
            "url.path": record.path,
            "radixlm.request_id": record.request_id,
            "gen_ai.response.model": self._model_name,
        }
        if record.status is not None:
            attributes["http.response.status_code"] = record.status
        if record.model is not None:
            attributes["gen_ai.request.model"] = record.model
        if outputs:
            attributes.update(
                {
                    "radixlm.num_outputs": len(outputs),
                    "gen_ai.usage.input_tokens": sum(o.prompt_tokens for o in outputs),
                    "gen_ai.usage.output_tokens": sum(len(o.output_ids) for o in outputs),
                    "radixlm.cached_tokens": sum(o.cached_tokens for o in outputs),
                    "gen_ai.response.finish_reasons": [_finish_type(o) for o in outputs],
                    "radixlm.rids": [o.rid for o in outputs],
                }
            )
        if self._log_requests and record.prompt is not None:
            attributes["gen_ai.prompt"] = _text(record.prompt)
            attributes["gen_ai.completion"] = _text(record.completion)
        return attributes


class _Clock:
    """``perf_counter`` seconds -> Unix nanoseconds (the offset read once per trace)."""

    def __init__(self) -> None:
        self._offset_ns = time.time_ns() - time.perf_counter_ns()

    def ns(self, perf_s: float) -> int:
        return int(perf_s * 1e9) + self._offset_ns


Stage = tuple[str, float, float, dict[str, Any]]


def _stages(record: RequestRecord) -> Iterator[Stage]:
    """The child spans: (name, start, end, attributes), in perf_counter seconds."""
    timed = [(o, o.times) for o in record.outputs if o.times is not None]
    if not timed:
        return
    first_queued = min(t.created_at for _, t in timed)
    yield "tokenize", record.body_received_at or record.started_at, first_queued, {}
    for output, times in timed:
        yield from _engine_stages(output, times)
    last_finished = max(t.finished_at or t.created_at for _, t in timed)
    yield "detokenize", last_finished, record.ended_at or last_finished, {}


def _engine_stages(output: GenerateOutput, t: RequestTimes) -> Iterator[Stage]:
    """One engine request's queue, prefill and decode (those it reached)."""
    ids = {"radixlm.rid": output.rid, "radixlm.index": output.index}
    end = t.finished_at if t.finished_at is not None else t.created_at
    admitted = t.admitted_at if t.admitted_at is not None else end
    yield "queue", t.created_at, admitted, ids
    if t.admitted_at is None:
        return
    prefill_end = t.first_token_at if t.first_token_at is not None else end
    prefill = {
        **ids,
        "gen_ai.usage.input_tokens": output.prompt_tokens,
        "radixlm.cached_tokens": output.cached_tokens,
    }
    yield "prefill", t.admitted_at, prefill_end, prefill
    if t.first_token_at is None:
        return
    decode = {
        **ids,
        "gen_ai.usage.output_tokens": len(output.output_ids),
        "gen_ai.response.finish_reasons": [_finish_type(output)],
    }
    yield "decode", t.first_token_at, end, decode


def _finish_type(output: GenerateOutput) -> str:
    return output.finish_reason.type if output.finish_reason is not None else "none"


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)
