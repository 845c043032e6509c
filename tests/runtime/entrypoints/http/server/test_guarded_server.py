"""A server with an API key, a small body limit, a small admission limit and
request logging, on the default model."""

from __future__ import annotations

import asyncio
import json
import logging

import httpx
import openai
import pytest

from tests.runtime.entrypoints.http.conftest import running_server, wait_idle, wait_released

KEY = "test-key-123"
MESSAGES = [{"role": "user", "content": "Say a word."}]


@pytest.fixture(scope="module")
def server(http_engine):
    with running_server(
        http_engine,
        api_key=KEY,
        max_request_body_bytes=2000,
        max_queued_requests=2,
        log_requests=True,
    ) as running:
        yield running


def test_key_required_except_health(server):
    assert httpx.get(server.base_url + "/health").status_code == 200
    for path in ("/v1/models", "/server_info", "/get_model_info"):
        response = httpx.get(server.base_url + path)
        assert response.status_code == 401
        assert response.json()["error"]["type"] == "authentication_error"
    bad = openai.OpenAI(base_url=server.base_url + "/v1", api_key="wrong")
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    good = openai.OpenAI(base_url=server.base_url + "/v1", api_key=KEY)
    reply = good.chat.completions.create(model="default", messages=MESSAGES, max_tokens=2)
    assert reply.choices[0].message.content


def test_oversized_body_is_413(server):
    body = {"model": "default", "messages": [{"role": "user", "content": "x" * 3000}]}
    response = httpx.post(
        server.base_url + "/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {KEY}"},
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


def test_past_the_admission_limit_is_503_with_retry_after(server, http_engine):
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {
        "model": "default",
        "prompt": "Go:",
        "max_tokens": 40,
        "ignore_eos": True,
        "stream": True,
    }

    async def scenario():
        async with httpx.AsyncClient(
            base_url=server.base_url, headers=headers, timeout=60
        ) as client:
            first_events = [asyncio.Event(), asyncio.Event()]

            async def hold(i):
                text = ""
                async with client.stream("POST", "/v1/completions", json=body) as response:
                    assert response.status_code == 200
                    async for line in response.aiter_lines():
                        first_events[i].set()
                        if line.startswith("data: {"):
                            text += json.loads(line[6:])["choices"][0]["text"]
                return text

            holders = [asyncio.ensure_future(hold(i)) for i in range(2)]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in first_events)), 30)
            in_use = server.state.admission.in_use
            refused = await client.post(
                "/v1/completions", json={"model": "default", "prompt": "a", "max_tokens": 1}
            )
            return in_use, refused, await asyncio.gather(*holders)

    in_use, refused, texts = asyncio.run(scenario())
    assert in_use == 2
    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "server_overloaded"
    assert all(texts)
    wait_idle(http_engine)
    wait_released(server.state)
    ok = httpx.post(
        server.base_url + "/v1/completions",
        headers=headers,
        json={"model": "default", "prompt": "a", "max_tokens": 1},
    )
    assert ok.status_code == 200


def test_prompts_are_logged_only_with_log_requests(server, http_engine, caplog):
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=KEY)
    with caplog.at_level(logging.INFO, logger="radixlm.http"):
        client.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": "zebra-marker-1"}],
            max_tokens=1,
        )
    assert "zebra-marker-1" in caplog.text


def test_without_log_requests_nothing_of_the_prompt_is_logged(http_engine, caplog):
    with running_server(http_engine) as quiet:
        client = openai.OpenAI(base_url=quiet.base_url + "/v1", api_key="unused")
        with caplog.at_level(logging.DEBUG):
            client.chat.completions.create(
                model="default",
                messages=[{"role": "user", "content": "zebra-marker-2"}],
                max_tokens=1,
            )
    assert "zebra-marker-2" not in caplog.text
