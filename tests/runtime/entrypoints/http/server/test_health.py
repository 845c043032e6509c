"""``/health_generate`` as a readiness probe: 200 only once the engine generated the
probe's token, 503 in bounded time otherwise; the probe counts in no metric, needs no
API key, and concurrent calls share one probe."""

from __future__ import annotations

import asyncio
import functools
import time

import httpx
import pytest

from radixlm.runtime.entrypoints.http.server.health import HealthProbe
from radixlm.runtime.errors import EngineStoppedError
from radixlm.runtime.io.messages import FinishReason, GenerateOutput, LogprobSpec
from tests.runtime.entrypoints.http.conftest import running_server, wait_idle

# a loaded 2-core machine can take seconds: never httpx's 5 s default
get = functools.partial(httpx.get, timeout=120)


def _output(reason: FinishReason | None, ids: tuple[int, ...]) -> GenerateOutput:
    return GenerateOutput("r", 0, "", ids, reason, 1, 0, 0.0, None, LogprobSpec(), (0,), (), ())


class StubEngine:
    """``async_generate_requests`` answering as told, counting the probes."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.calls = 0

    async def async_generate_requests(self, requests):
        self.calls += 1
        (probe,) = requests
        assert probe.log_metrics is False and probe.sampling_params.max_new_tokens == 1
        await asyncio.sleep(0.05)
        return await self.answer()


def _check(answer, timeout_s: float = 2.0) -> tuple[bool, StubEngine]:
    engine = StubEngine(answer)
    return asyncio.run(HealthProbe(engine, timeout_s).check()), engine  # type: ignore[arg-type]


def test_a_token_is_ready():
    async def token():
        return [_output(FinishReason("length", length=1), (7,))]

    assert _check(token)[0] is True


@pytest.mark.parametrize(
    "reason",
    [FinishReason("abort", message="engine shut down"), None],
    ids=["aborted", "unfinished"],
)
def test_an_abort_or_no_token_is_not_ready(reason):
    async def answer():
        return [_output(reason, ())]

    assert _check(answer)[0] is False


def test_a_stopped_engine_is_not_ready():
    async def stopped():
        raise EngineStoppedError("the engine was shut down")

    assert _check(stopped)[0] is False


def test_no_token_within_the_timeout_is_not_ready_in_bounded_time():
    async def never():
        await asyncio.sleep(60)

    started = time.monotonic()
    assert _check(never, timeout_s=0.3)[0] is False
    assert time.monotonic() - started < 2


def test_concurrent_checks_share_one_probe():
    async def token():
        await asyncio.sleep(0.2)
        return [_output(FinishReason("length", length=1), (7,))]

    engine = StubEngine(token)
    probe = HealthProbe(engine, 2.0)  # type: ignore[arg-type]

    async def many():
        return await asyncio.gather(*(probe.check() for _ in range(8)))

    assert asyncio.run(many()) == [True] * 8 and engine.calls == 1


# ---- on the real engine -------------------------------------------------------------


@pytest.fixture(scope="module")
def server(http_engine):
    with running_server(http_engine, api_key="k", health_generate_timeout_s=10) as running:
        yield running


def test_ready_without_a_key_and_counted_in_no_metric(server, http_engine):
    wait_idle(http_engine)
    before = http_engine.get_stats()
    for _ in range(3):
        assert get(server.base_url + "/health_generate").status_code == 200
    after = http_engine.get_stats()
    for counter in (
        "num_prompt_tokens",
        "num_cached_tokens",
        "num_generated_tokens",
        "num_finished",
        "num_aborted",
    ):
        assert getattr(after, counter) == getattr(before, counter), counter
    assert after.latency.ttft.count == before.latency.ttft.count
    assert after.latency.e2e.count == before.latency.e2e.count
    assert after.latency.queue.count == before.latency.queue.count
    metrics = get(server.base_url + "/metrics", headers={"Authorization": "Bearer k"})
    assert metrics.status_code == 200  # the other routes still need the key
    assert get(server.base_url + "/metrics").status_code == 401
    wait_idle(http_engine)


def test_a_stopped_engine_answers_503(default_model_dir):
    from radixlm import Engine

    engine = Engine(model_path=str(default_model_dir), dtype="float32", max_total_tokens=512)
    try:
        with running_server(engine) as running:
            assert get(running.base_url + "/health_generate").status_code == 200
            engine.shutdown()
            started = time.monotonic()
            assert get(running.base_url + "/health_generate").status_code == 503
            assert time.monotonic() - started < 5
            assert get(running.base_url + "/health").status_code == 200  # liveness
    finally:
        engine.shutdown()
