"""Tracing: an argument not given is symbolic; appending it works, formatting it into a
string raises TypeError out of ``trace()`` (as SGLang's tracer), while ``cache()``
keeps the prefix up to there."""

from __future__ import annotations

import pytest

import radixlm as sgl
from radixlm.ir import ExprList, Gen, SymbolicArgument, Text, placeholder
from radixlm.runtime.io.chat_template import FALLBACK
from tests.lang.fake_backend import FakeBackend

FORMATS = {
    "f-string": lambda topic: f"About {topic}.",
    "str()": lambda topic: "About " + str(topic) + ".",
    "%": lambda topic: "About %s." % topic,  # noqa: UP031 (the habit under test)
    "format()": lambda topic: "About {}.".format(topic),  # noqa: UP032
}


@pytest.mark.parametrize("how", list(FORMATS))
def test_formatting_a_symbolic_argument_raises_type_error(how):
    @sgl.function
    def prog(s, topic):
        s += "Intro. "
        s += FORMATS[how](topic)
        s += sgl.gen("text")

    with pytest.raises(TypeError, match="argument 'topic' is symbolic"):
        prog.trace()
    assert prog.cache(FakeBackend()) == "Intro. "  # the prefix before it still caches
    nodes = prog.trace(topic="cats")  # a given argument is a str like any other
    assert nodes[1] == Text("About cats.")


def test_appending_a_symbolic_argument_traces_its_placeholder():
    @sgl.function
    def prog(s, topic, style):
        s += "About " + topic
        s += sgl.user(style)
        s += topic
        s += sgl.gen("text")

    nodes = prog.trace()
    assert nodes[0] == Text("About " + placeholder("topic"))
    assert nodes[1] == ExprList((sgl.user_begin(), Text(placeholder("style")), sgl.user_end()))
    assert nodes[2] == Text(placeholder("topic")) and isinstance(nodes[3], Gen)
    assert prog.cache(FakeBackend()) == "About "


def test_generated_variables_may_be_formatted_and_backend_is_sglangs_unused_argument():
    @sgl.function
    def prog(s, topic):
        s += sgl.gen("x")
        s += f"You said {s['x']}. " + topic  # a variable is not an argument: no TypeError

    nodes = prog.trace(backend=FakeBackend())
    assert nodes[1] == Text(f"You said {placeholder('x')}. " + placeholder("topic"))


def test_a_symbolic_argument_is_a_str_with_its_name():
    topic = SymbolicArgument("topic")
    assert isinstance(topic, str) and topic.name == "topic"
    assert len(topic) == len(placeholder("topic")) and repr(topic) == repr(placeholder("topic"))
    with pytest.raises(TypeError):
        format(topic, "")


def test_a_prefix_trace_stops_at_the_first_generated_expression():
    calls = []

    @sgl.function
    def agent(s):
        s += sgl.system("Use tools.")
        s += sgl.assistant(sgl.gen("action"))
        calls.append("after the first gen")
        while s["action"] != "finish":  # a placeholder forever: trace() would loop
            s += sgl.gen("action")

    system_prefix, system_suffix = FALLBACK.prefix_and_suffix("system", 0)
    assistant_prefix = FALLBACK.prefix_and_suffix("assistant", 1)[0]
    backend = FakeBackend()
    prefix = agent.cache(backend)
    assert prefix == system_prefix + "Use tools." + system_suffix + assistant_prefix
    assert calls == [] and len(backend.cached_prefixes) == 1
