"""``sgl.global_config``: SGLang's fields, the honoured ones doing what they say, read
once per run (on a scripted backend: exact requests, no model)."""

from __future__ import annotations

import dataclasses

import pytest

import radixlm as sgl
from radixlm.global_config import GlobalConfig, global_config
from tests.lang.fake_backend import FakeBackend

LONG_SYSTEM = "You answer questions about the sea, briefly and exactly. " * 2  # > 64 chars


@pytest.fixture(autouse=True)
def _restore_global_config():
    saved = dataclasses.asdict(global_config)
    yield
    for name, value in saved.items():
        setattr(global_config, name, value)


@sgl.function
def ask(s, question):
    s += LONG_SYSTEM + "Q: "
    s += question + "\nA: " + sgl.gen("a", max_tokens=4)


def test_sglangs_fields_and_defaults_and_no_new_ones():
    assert sgl.global_config is global_config and isinstance(global_config, GlobalConfig)
    fresh = GlobalConfig()
    assert (fresh.verbosity, fresh.default_backend) == (0, None)
    assert fresh.skip_special_tokens_in_output and fresh.spaces_between_special_tokens_in_out
    assert fresh.enable_precache_with_tracing and fresh.enable_parallel_encoding
    assert (fresh.retract_decode_steps, fresh.default_init_new_token_ratio) == (20, 0.7)
    with pytest.raises(AttributeError):
        global_config.verbose = 2  # a misspelled field raises instead of doing nothing


def test_the_default_backend_is_the_global_configs():
    backend = FakeBackend(replies=["x"])
    sgl.set_default_backend(backend)
    assert global_config.default_backend is backend
    other = FakeBackend(replies=["y"])
    global_config.default_backend = other  # as SGLang programs set it
    assert sgl.get_default_backend() is other
    assert ask("Why?")["a"] == "y" and other.requests and not backend.requests


def test_the_special_token_switches_reach_every_gen():
    backend = FakeBackend()
    ask.run("Q?", backend=backend)
    first = backend.requests[-1].sampling_params
    assert (first.skip_special_tokens, first.spaces_between_special_tokens) == (True, True)
    global_config.skip_special_tokens_in_output = False
    global_config.spaces_between_special_tokens_in_out = False
    ask.run("Q?", backend=backend)
    ask.run_batch([{"question": "Q?"}], backend=backend)
    for request in backend.requests[-2:]:
        params = request.sampling_params
        assert (params.skip_special_tokens, params.spaces_between_special_tokens) == (False, False)


def test_verbosity_two_prints_each_final_text(capsys):
    backend = FakeBackend(replies=["one", "two"])
    ask.run("Q?", backend=backend)
    assert capsys.readouterr().out == ""
    global_config.verbosity = 2
    state = ask.run("Q?", backend=backend)
    assert capsys.readouterr().out == state.text() + "\n"
    assert state.text().endswith("A: two")


def test_run_batch_precaches_a_long_constant_prefix_once():
    backend = FakeBackend()
    ask.run_batch([{"question": "a?"}, {"question": "b?"}], backend=backend)
    prefix = LONG_SYSTEM + "Q: "
    assert backend.cached_prefixes == [tuple(ord(c) for c in prefix)]
    ask.run_batch([{"question": "a?"}], backend=backend)  # one program: nothing to share
    global_config.enable_precache_with_tracing = False
    ask.run_batch([{"question": "a?"}, {"question": "b?"}], backend=backend)
    assert len(backend.cached_prefixes) == 1


def test_a_short_prefix_and_a_looping_body_are_not_precached():
    @sgl.function
    def loop(s, topic):
        s += "Short. " + sgl.gen("x", max_tokens=8)
        while s["x"] != "done":  # never "done" in a trace: the prefix trace stops first
            s += sgl.gen("x", max_tokens=8)

    backend = FakeBackend(replies=["done", "done"])
    states = loop.run_batch([{"topic": "a"}, {"topic": "b"}], backend=backend)
    assert [s["x"] for s in states] == ["done", "done"] and backend.cached_prefixes == []


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("verbosity", "2"),
        ("skip_special_tokens_in_output", 0),
        ("enable_precache_with_tracing", None),
    ],
)
def test_a_badly_typed_field_is_named_when_a_run_starts(field, value):
    setattr(global_config, field, value)
    with pytest.raises(ValueError, match=f"global_config.{field} must be"):
        ask.run("Q?", backend=FakeBackend())
