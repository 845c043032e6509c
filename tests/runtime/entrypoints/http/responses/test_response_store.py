"""ResponseStore's bounds (count and bytes, least recently used first) and the
ServerConfig fields that set them: no model."""

import pytest

from radixlm.runtime.config import ConfigError
from radixlm.runtime.entrypoints.cli import _build_parser, _prefixed
from radixlm.runtime.entrypoints.http.responses.store import ResponseStore, StoredResponse
from radixlm.runtime.entrypoints.http.server.config import ServerConfig


def entry(name: str, num_bytes: int = 10) -> StoredResponse:
    """An entry of exactly ``num_bytes`` (body and conversation together)."""
    return StoredResponse(name, b"b" * (num_bytes - 2), b"[]")


def ids(store: ResponseStore) -> list[str]:
    return [name for name in ("a", "b", "c", "d", "e") if store.get(name) is not None]


def test_count_bound_drops_the_least_recently_used():
    store = ResponseStore(max_responses=2, max_bytes=1000)
    assert store.put(entry("a")) and store.put(entry("b"))
    assert store.get("a") is not None  # "a" is now more recent than "b"
    assert store.put(entry("c"))
    assert store.get("b") is None
    assert (len(store), store.num_bytes) == (2, 20)
    assert store.get("a").body == entry("a").body and store.get("c") is not None


def test_byte_bound_drops_as_many_as_needed():
    store = ResponseStore(max_responses=100, max_bytes=30)
    for name in ("a", "b", "c"):
        store.put(entry(name))
    assert store.put(entry("d", 25))  # needs 25 of 30: a, b and c must all go
    assert ids(store) == ["d"] and store.num_bytes == 25
    assert store.put(entry("e", 5))
    assert ids(store) == ["d", "e"] and store.num_bytes == 30


def test_an_entry_larger_than_the_whole_budget_is_not_kept():
    store = ResponseStore(max_responses=10, max_bytes=30)
    store.put(entry("a"))
    assert not store.put(entry("b", 31))
    assert ids(store) == ["a"] and store.num_bytes == 10


def test_replacing_and_deleting_keep_the_byte_count_exact():
    store = ResponseStore(max_responses=10, max_bytes=100)
    store.put(entry("a", 10))
    store.put(entry("a", 40))
    assert (len(store), store.num_bytes) == (1, 40)
    assert store.delete("a") and not store.delete("a")
    assert (len(store), store.num_bytes) == (0, 0)


@pytest.mark.parametrize(("max_responses", "max_bytes"), [(0, 100), (10, 0)])
def test_a_zero_bound_keeps_nothing(max_responses, max_bytes):
    store = ResponseStore(max_responses, max_bytes)
    assert not store.put(entry("a"))
    assert len(store) == 0 and store.get("a") is None


def test_negative_bounds_are_refused():
    with pytest.raises(ValueError, match="bounds"):
        ResponseStore(-1, 10)


def test_server_config_fields_and_flags():
    config = ServerConfig()
    assert (config.max_stored_responses, config.max_stored_response_bytes) == (1024, 64 << 20)
    for name in ("max_stored_responses", "max_stored_response_bytes"):
        with pytest.raises(ConfigError, match=name):
            ServerConfig(**{name: -1})
    args = _build_parser().parse_args(
        ["serve", "--max-stored-responses", "8", "--max-stored-response-bytes", "4096"]
    )
    server = ServerConfig(**_prefixed(args, "server_"))
    assert (server.max_stored_responses, server.max_stored_response_bytes) == (8, 4096)


def test_an_entry_is_seen_and_deleted_only_by_its_owner():
    store = ResponseStore(4, 1000)
    store.put(StoredResponse("a", b"{}", b"[]", owner="alice"))
    assert store.get("a") is None and store.get("a", "bob") is None
    assert not store.delete("a", "bob") and not store.delete("a") and len(store) == 1
    assert store.get("a", "alice") is not None
    assert store.delete("a", "alice") and len(store) == 0 and store.num_bytes == 0
