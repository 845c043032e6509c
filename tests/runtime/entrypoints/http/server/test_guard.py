"""The API key and body-size guard, over a trivial ASGI app: no model."""

import asyncio

import httpx
import pytest

from radixlm.runtime.entrypoints.http.server.errors import APIError
from radixlm.runtime.entrypoints.http.server.guard import GuardMiddleware, key_owner


async def _echo_app(scope, receive, send):
    """Reads the whole body and answers with its length (a 413 while reading -> 413)."""
    size = 0
    try:
        while True:
            message = await receive()
            size += len(message.get("body", b""))
            if not message.get("more_body"):
                break
    except APIError as e:
        await send({"type": "http.response.start", "status": e.status, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": str(size).encode()})


def _request(app, method, path, **kwargs) -> httpx.Response:
    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.request(method, path, **kwargs)

    return asyncio.run(go())


@pytest.fixture
def guarded():
    return GuardMiddleware(_echo_app, api_keys="s3cret", max_body_bytes=100, body_timeout_s=30.0)


def test_health_needs_no_key(guarded):
    assert _request(guarded, "GET", "/health").status_code == 200


@pytest.mark.parametrize("header", [None, "Bearer wrong", "Basic s3cret", "Bearer s3cre", "s3cret"])
def test_wrong_or_missing_key_is_401_with_openai_body(guarded, header):
    headers = {"Authorization": header} if header else {}
    response = _request(guarded, "GET", "/v1/models", headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    error = response.json()["error"]
    assert error["type"] == "authentication_error" and error["code"] == "invalid_api_key"


def test_right_key_passes(guarded):
    response = _request(
        guarded, "POST", "/x", headers={"Authorization": "Bearer s3cret"}, content=b"ab"
    )
    assert (response.status_code, response.text) == (200, "2")


def test_declared_oversized_body_is_413_unread():
    app = GuardMiddleware(_echo_app, api_keys=None, max_body_bytes=100, body_timeout_s=30.0)
    response = _request(app, "POST", "/x", content=b"x" * 101)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"
    assert _request(app, "POST", "/x", content=b"x" * 100).text == "100"


def test_chunked_body_past_the_limit_raises_while_read():
    app = GuardMiddleware(_echo_app, api_keys=None, max_body_bytes=100, body_timeout_s=30.0)

    async def chunks():
        for _ in range(5):
            yield b"x" * 30

    assert _request(app, "POST", "/x", content=chunks()).status_code == 413


def test_a_body_not_in_by_the_deadline_is_408():
    app = GuardMiddleware(_echo_app, api_keys=None, max_body_bytes=100, body_timeout_s=0.2)

    async def slow():
        for _ in range(5):
            await asyncio.sleep(0.1)
            yield b"x"

    response = _request(app, "POST", "/x", content=slow())
    assert response.status_code == 408


def test_after_the_body_receive_waits_without_a_deadline():
    """A route that watches for a disconnect once the body is in (a stream) is not cut
    off by the body's deadline."""

    async def waits_after_the_body(scope, receive, send):
        await receive()  # the whole (small) body
        try:
            await asyncio.wait_for(receive(), 0.3)  # nothing comes: only a disconnect would
        except TimeoutError:
            pass
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    app = GuardMiddleware(
        waits_after_the_body, api_keys=None, max_body_bytes=100, body_timeout_s=0.1
    )

    async def go():
        messages = [{"type": "http.request", "body": b"x", "more_body": False}]
        sent = []

        async def receive():
            if messages:
                return messages.pop()
            await asyncio.sleep(10)

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "path": "/x", "headers": []}
        await app(scope, receive, send)
        return sent

    sent = asyncio.run(go())
    assert sent[0]["status"] == 200


async def _owner_app(scope, receive, send):
    """Answers with the key the guard let the request in with."""
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": str(key_owner(scope)).encode()})


def test_each_of_several_keys_passes_as_its_own_owner():
    app = GuardMiddleware(_owner_app, ("k1", "k2"), max_body_bytes=100, body_timeout_s=30.0)
    owners = [
        _request(app, "GET", "/v1/models", headers={"Authorization": f"Bearer {key}"}).text
        for key in ("k1", "k2", "k1")
    ]
    assert owners[0] == owners[2] != owners[1] and "k1" not in owners[0]
    assert len(owners[0]) == 64  # a SHA-256 in hex: the key itself is kept nowhere
    bad = _request(app, "GET", "/v1/models", headers={"Authorization": "Bearer k1k2"})
    assert bad.status_code == 401


def test_an_open_server_has_no_owner():
    app = GuardMiddleware(_owner_app, None, max_body_bytes=100, body_timeout_s=30.0)
    assert _request(app, "GET", "/v1/models").text == "None"
