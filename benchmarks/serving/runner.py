"""A workload sent through a client: each request at its arrival offset, at most
``max_concurrency`` in flight (None: no limit); a request whose turn comes while the
limit is reached waits for a slot, so its measured latency excludes that wait (as
in vLLM's and SGLang's load generators: the limit models a client pool)."""

from __future__ import annotations

import asyncio
import time

from serving.clients import Client
from serving.datasets import BenchRequest
from serving.metrics import RequestResult

__all__ = ["run_workload"]


async def run_workload(
    client: Client,
    requests: list[BenchRequest],
    offsets: list[float],
    max_concurrency: int | None,
) -> tuple[list[RequestResult], float]:
    """Results in request order and the run's duration (first send -> last completion)."""
    if len(offsets) != len(requests):
        raise ValueError(f"{len(requests)} requests but {len(offsets)} arrival offsets")
    slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    start = time.perf_counter()

    async def one(request: BenchRequest, offset: float) -> RequestResult:
        await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
        if slots is None:
            return await client.send(request)
        async with slots:
            return await client.send(request)

    results = await asyncio.gather(*(one(r, o) for r, o in zip(requests, offsets)))
    return list(results), time.perf_counter() - start
