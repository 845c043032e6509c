"""ServerConfig validation and the serve CLI's flags: no model."""

import dataclasses

import pytest

from radixlm.runtime.config import ConfigError
from radixlm.runtime.entrypoints.cli import _build_parser, _prefixed
from radixlm.runtime.entrypoints.http.server.admission import Admission
from radixlm.runtime.entrypoints.http.server.config import ServerConfig
from radixlm.runtime.entrypoints.http.server.errors import APIError


def test_defaults():
    config = ServerConfig()
    assert (config.host, config.port, config.api_key, config.log_requests) == (
        "127.0.0.1",
        30000,
        None,
        False,
    )


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"port": 0}, "port"),
        ({"port": 70000}, "port"),
        ({"port": True}, "port"),
        ({"api_key": ""}, "api_key"),
        ({"max_queued_requests": 0}, "max_queued_requests"),
        ({"max_request_body_bytes": -1}, "max_request_body_bytes"),
        ({"log_requests": "yes"}, "log_requests"),
        ({"host": ""}, "host"),
    ],
)
def test_bad_values_raise_naming_the_field(kwargs, name):
    with pytest.raises(ConfigError, match=name):
        ServerConfig(**kwargs)


def test_serve_flags_come_from_both_configs():
    args = _build_parser().parse_args(
        ["serve", "--port", "8123", "--api-key", "k", "--log-requests", "--max-total-tokens", "64"]
    )
    server = ServerConfig(**_prefixed(args, "server_"))
    assert (server.port, server.api_key, server.log_requests) == (8123, ("k",), True)
    assert _prefixed(args, "engine_")["max_total_tokens"] == 64


def test_admission_refuses_past_the_limit_with_retry_after():
    admission = Admission(3, max_n=2)
    first = admission.acquire(2)
    with pytest.raises(APIError) as info:
        admission.acquire(2)
    assert info.value.status == 503 and info.value.headers["Retry-After"] == "1"
    first.release()
    first.release()  # idempotent
    assert admission.in_use == 0
    admission.acquire(3).release()


def test_api_keys_come_from_repeated_flags_and_a_key_file(tmp_path):
    key_file = tmp_path / "keys"
    key_file.write_text("# ops\n  c  \n\nd\na\n", encoding="utf-8")
    args = _build_parser().parse_args(
        ["serve", "--api-key", "a", "--api-key", "b", "--api-key-file", str(key_file)]
    )
    server = ServerConfig(**_prefixed(args, "server_"))
    assert server.api_key == ("a", "b") and server.api_keys == ("a", "b", "c", "d")
    assert "'c'" not in repr(server) and "c" not in str(dataclasses.asdict(server)["api_key"])
    assert ServerConfig(api_key="k").api_keys == ("k",) and ServerConfig().api_keys == ()


@pytest.mark.parametrize("text", ["", "# only a comment\n\n"])
def test_a_key_file_without_keys_is_refused(tmp_path, text):
    (tmp_path / "keys").write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match="holds no key"):
        ServerConfig(api_key_file=str(tmp_path / "keys"))
    with pytest.raises(ConfigError, match="cannot read"):
        ServerConfig(api_key_file=str(tmp_path / "missing"))


def test_n_past_max_n_is_a_400_even_when_the_rest_is_full():
    admission = Admission(8, max_n=2)
    held = admission.acquire(7)
    with pytest.raises(APIError) as info:
        admission.acquire(3, n=3)
    assert info.value.status == 400 and info.value.param == "n"
    assert "max_n 2" in info.value.message and info.value.code == "request_limit_exceeded"
    held.release()
