"""What every route of one server shares: the engine, the options, the model's
names, the prompt builder, the token texts and the admission counter.

Built once per server (two servers in one process each have their own); routes
read it from ``request.app.state.server``.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry

from radixlm.runtime.entrypoints.engine import Engine
from radixlm.runtime.entrypoints.http.openai.prompts import PromptBuilder
from radixlm.runtime.entrypoints.http.openai.tools import ToolCalling
from radixlm.runtime.entrypoints.http.server.admission import Admission
from radixlm.runtime.entrypoints.http.server.config import ServerConfig
from radixlm.runtime.entrypoints.http.server.errors import NOT_FOUND, APIError
from radixlm.runtime.entrypoints.http.server.health import HealthProbe
from radixlm.runtime.entrypoints.http.server.metrics import metrics_registry
from radixlm.runtime.entrypoints.http.server.request_context import RecordExporter, current_record
from radixlm.runtime.entrypoints.http.server.token_text import TokenTexts
from radixlm.runtime.io.chat_template import ChatTemplate, chat_template_from_tokenizer

__all__ = ["DEFAULT_MODEL_ID", "ServerState"]

# The id every client may use whatever model is loaded (as SGLang's "default").
DEFAULT_MODEL_ID = "default"
T = TypeVar("T")
logger = logging.getLogger("radixlm.http")


@dataclass(frozen=True, eq=False)
class ServerState:
    """engine: owned by whoever built it (``serve`` shuts it down; tests share one).

    model_name: the other id clients may send: ``served_model_name``, else the hub id
        the model was named by, else its directory's name.
    """

    engine: Engine
    config: ServerConfig
    model_path: Path
    model_name: str
    prompts: PromptBuilder
    tokens: TokenTexts
    admission: Admission
    chat_template: ChatTemplate  # the role blocks DSL clients render (/get_model_info)
    metrics: CollectorRegistry  # this server's /metrics (its engine's collector only)
    health: HealthProbe  # /health_generate's
    tracer: RecordExporter | None = None  # --otlp-traces-endpoint's (tracing.RequestTracer)

    @classmethod
    def create(cls, engine: Engine, config: ServerConfig) -> ServerState:
        model_path = engine.model_path
        model_name = config.served_model_name or engine.model_name
        template = getattr(engine.tokenizer, "chat_template", None)
        tools = ToolCalling.for_model(template, config.tool_call_parser, engine.config.grammar)
        return cls(
            engine=engine,
            config=config,
            model_path=model_path,
            model_name=model_name,
            prompts=PromptBuilder(
                engine.tokenizer, engine.context_room, tools, engine.reasoning is not None
            ),
            tokens=TokenTexts.from_tokenizer(engine.tokenizer),
            admission=Admission(config.max_queued_requests, engine.config.scheduler.max_n),
            chat_template=chat_template_from_tokenizer(engine.tokenizer),
            metrics=metrics_registry(engine, model_name),
            health=HealthProbe(engine, config.health_generate_timeout_s),
            tracer=_tracer(config, model_name),
        )

    def close(self) -> None:
        """Sends the traces still batched (the server calls this once it stopped)."""
        if self.tracer is not None:
            self.tracer.shutdown()

    @property
    def model_ids(self) -> tuple[str, ...]:
        return (DEFAULT_MODEL_ID, self.model_name)

    def check_model(self, model: str) -> None:
        """Raises APIError (404, ``model_not_found``) for a model this server does not serve."""
        if model not in self.model_ids:
            raise APIError(
                NOT_FOUND,
                f"model {model!r} is not served here; this server serves {list(self.model_ids)}",
                "model",
            )

    def log_request(self, route: str, prompt: Any, outputs: Any) -> None:
        """Prompts and outputs reach the log (and the request's trace) only with
        ``log_requests`` on."""
        if not self.config.log_requests:
            return
        record = current_record()
        request_id = None if record is None else record.request_id
        logger.info("%s request_id=%s prompt=%r outputs=%r", route, request_id, prompt, outputs)
        if record is not None:
            record.prompt, record.completion = prompt, outputs


def _tracer(config: ServerConfig, model_name: str) -> RecordExporter | None:
    """The trace exporter of ``--otlp-traces-endpoint`` (None: OpenTelemetry is not
    even imported)."""
    if config.otlp_traces_endpoint is None:
        return None
    # lazy: imports OpenTelemetry's SDK, only for --otlp-traces-endpoint
    from radixlm.runtime.entrypoints.http.server.tracing import RequestTracer

    return RequestTracer(config.otlp_traces_endpoint, model_name, config.log_requests)


async def in_worker(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a worker thread: encoding large responses (logprobs) off the
    event loop. It runs in the caller's context (its request, for log lines)."""
    context = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(None, context.run, fn, *args)
