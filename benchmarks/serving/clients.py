"""The ways a benchmark request reaches radixlm, behind one ``send``:

    OpenAIClient  streamed ``POST /v1/completions`` to any OpenAI-compatible server
                  (prompt as token ids, greedy, ``ignore_eos`` + ``min_tokens`` =
                  ``max_tokens`` so every request makes exactly its output length,
                  ``stream_options.include_usage`` for the server's token counts)
    GenerateClient  the same through SGLang's native ``POST /generate`` (``input_ids``):
                  what SGLang's router forwards token ids on (its ``/v1/completions``
                  takes text prompts only)
    EngineClient  radixlm's in-process Engine (``async_stream_requests``): the same
                  requests with no HTTP, the reference the server is measured against

Both time a request the same way, on the client: from just before it is sent, each
chunk that carries text is a token arrival (``TokenClock``). Both are async context
managers, entered once per run on that run's event loop.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from serving.datasets import BenchRequest
from serving.metrics import RequestResult
from serving.sse import DONE, SSEParser, completion_delta, generate_delta

__all__ = ["Client", "EngineClient", "GenerateClient", "OpenAIClient", "TokenClock"]


class Client(Protocol):
    name: str

    async def __aenter__(self) -> Client: ...

    async def __aexit__(self, *exc: object) -> None: ...

    async def send(self, request: BenchRequest) -> RequestResult: ...


class TokenClock:
    """A request's timings: started when built, ``tick`` at each chunk carrying text."""

    def __init__(self, now=time.perf_counter) -> None:
        self._now = now
        self.start = now()
        self.ttft_s: float | None = None
        self.itl_s: list[float] = []
        self._last: float | None = None

    def tick(self) -> None:
        now = self._now()
        if self._last is None:
            self.ttft_s = now - self.start
        else:
            self.itl_s.append(now - self._last)
        self._last = now

    def result(self, num_prompt_tokens: int, num_output_tokens: int) -> RequestResult:
        return RequestResult(
            num_prompt_tokens=num_prompt_tokens,
            num_output_tokens=num_output_tokens,
            ttft_s=self.ttft_s,
            e2e_s=self._now() - self.start,
            itl_s=self.itl_s,
        )


class OpenAIClient:
    """Streamed completions from ``base_url`` (``http://host:port``); the model id is
    the first one the server lists at ``/v1/models``. ``transport``: an httpx
    transport to use instead of the network (tests)."""

    def __init__(
        self, name: str, base_url: str, api_key: str | None = None, transport: Any = None
    ) -> None:
        self.name = name
        self._transport = transport
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http: Any = None
        self.model: str | None = None

    async def __aenter__(self) -> OpenAIClient:
        import httpx

        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=self._headers,
            timeout=None,
            limits=limits,
            transport=self._transport,
        )
        models = await self._http.get("/v1/models")
        models.raise_for_status()
        self.model = models.json()["data"][0]["id"]
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._http.aclose()

    def body(self, request: BenchRequest) -> dict:
        n = request.num_output_tokens
        return {
            "model": self.model,
            "prompt": list(request.prompt_ids),
            "max_tokens": n,
            "min_tokens": n,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }

    path = "/v1/completions"

    def parse(self, payload: dict) -> tuple[str, int | None]:
        """An event's new text and, when it says, the output tokens so far."""
        text, usage = completion_delta(payload)
        return text, usage["completion_tokens"] if usage else None

    async def send(self, request: BenchRequest) -> RequestResult:
        clock = TokenClock()
        num_chunks, num_out = 0, None
        try:
            async with self._http.stream("POST", self.path, json=self.body(request)) as r:
                if r.status_code != 200:
                    body = (await r.aread()).decode(errors="replace")
                    raise RuntimeError(f"HTTP {r.status_code}: {body[:200]}")
                parser = SSEParser()
                async for line in r.aiter_lines():
                    payload = parser.feed(line)
                    if payload is None:
                        continue
                    if payload is DONE:
                        break
                    text, tokens = self.parse(payload)
                    num_out = tokens if tokens is not None else num_out
                    if text:
                        clock.tick()
                        num_chunks += 1
        except Exception as e:  # the request failed: counted and reported, not raised
            return RequestResult(request.num_prompt_tokens, error=f"{type(e).__name__}: {e}")
        # Without a count, chunks stand in for tokens (a chunk may carry several).
        return clock.result(request.num_prompt_tokens, num_out if num_out else num_chunks)


class GenerateClient(OpenAIClient):
    """Streamed SGLang ``/generate`` with the prompt as ``input_ids``, forced to its
    output length as ``OpenAIClient`` forces it."""

    path = "/generate"

    def body(self, request: BenchRequest) -> dict:
        n = request.num_output_tokens
        return {
            "input_ids": list(request.prompt_ids),
            "sampling_params": {
                "max_new_tokens": n,
                "min_new_tokens": n,
                "ignore_eos": True,
                "temperature": 0.0,
            },
            "stream": True,
        }

    def parse(self, payload: dict) -> tuple[str, int | None]:
        return generate_delta(payload)


class EngineClient:
    """Requests straight into an ``Engine`` of this process (it is not owned: the
    caller builds and shuts it down)."""

    name = "engine"

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    async def __aenter__(self) -> EngineClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass

    async def send(self, request: BenchRequest) -> RequestResult:
        from radixlm.runtime.io import GenerateRequest, SamplingParams

        n = request.num_output_tokens
        params = SamplingParams(
            max_new_tokens=n, min_new_tokens=n, ignore_eos=True, temperature=0.0
        )
        req = GenerateRequest(input_ids=request.prompt_ids, sampling_params=params, stream=True)
        clock = TokenClock()
        last = None
        try:
            async for chunk in self.engine.async_stream_requests([req]):
                if chunk.delta:
                    clock.tick()
                last = chunk
        except Exception as e:
            return RequestResult(request.num_prompt_tokens, error=f"{type(e).__name__}: {e}")
        reason = None if last is None else last.finish_reason
        if reason is None or reason.type == "abort":
            return RequestResult(request.num_prompt_tokens, error=f"not finished: {reason}")
        return clock.result(request.num_prompt_tokens, last.num_output_ids)
