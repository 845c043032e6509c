"""The Hermes structural tag of each tool_choice, checked with xgrammar on strings: no
model (every format on both backends: test_tool_formats.py)."""

import json

import pytest
import xgrammar
from xgrammar.testing import _is_grammar_accept_string as accepts

from radixlm.runtime.tools.format import HERMES
from radixlm.runtime.tools.grammar import to_structural_tag, tool_grammar
from radixlm.runtime.tools.plan import FunctionTool, ToolPlan

CALL_SEPARATOR = HERMES.separator
render_call = HERMES.render_call


def tool_structural_tag(plan: ToolPlan) -> str | None:
    grammar = tool_grammar(plan, HERMES)
    return None if grammar is None else to_structural_tag(grammar)


CITY = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = (FunctionTool("get_weather", None, CITY), FunctionTool("get_time"))
PARIS = render_call("get_weather", '{"city": "Paris"}')
NOW = render_call("get_time", "{}")


def grammar(choice: str, parallel: bool = True, name: str | None = None) -> xgrammar.Grammar:
    text = tool_structural_tag(ToolPlan(TOOLS, choice, name, parallel))
    return xgrammar.Grammar.from_structural_tag(text)


def test_required_admits_only_valid_calls():
    g = grammar("required")
    assert accepts(g, PARIS)
    assert accepts(g, render_call("get_weather", '{"city": "Oslo", "days": 3}'))
    assert accepts(g, PARIS + CALL_SEPARATOR + NOW)  # parallel
    assert not accepts(g, "")  # at least one call
    assert not accepts(g, "Sure: " + PARIS)  # no text
    assert not accepts(g, render_call("get_weather", '{"city": 3}'))  # schema
    assert not accepts(g, render_call("get_weather", '{"days": 2}'))  # required property
    assert not accepts(g, render_call("get_weather", '{"city": "a", "days": 0}'))  # minimum
    assert not accepts(g, render_call("get_forecast", "{}"))  # only the tools' names


def test_parallel_false_allows_one_call():
    assert accepts(grammar("required", parallel=False), PARIS)
    assert not accepts(grammar("required", parallel=False), PARIS + CALL_SEPARATOR + NOW)
    assert not accepts(grammar("auto", parallel=False), PARIS + CALL_SEPARATOR + NOW)


def test_named_admits_that_function_once():
    g = grammar("named", parallel=False, name="get_time")
    assert accepts(g, NOW)
    assert not accepts(g, PARIS)
    assert not accepts(g, NOW + CALL_SEPARATOR + NOW)


def test_auto_admits_text_and_calls_but_no_broken_call():
    g = grammar("auto")
    assert accepts(g, "The weather is nice.")
    assert accepts(g, "")
    assert accepts(g, PARIS)
    assert accepts(g, "Let me check.\n" + PARIS + CALL_SEPARATOR + NOW)
    assert not accepts(g, "<tool_call>\nnot json")
    assert not accepts(g, render_call("get_weather", '{"town": "Paris"}'))


def test_none_has_no_grammar():
    assert tool_structural_tag(ToolPlan(TOOLS, "none")) is None


@pytest.mark.parametrize("choice", ["auto", "required"])
def test_the_tag_names_every_tool_schema(choice):
    tag = tool_structural_tag(ToolPlan(TOOLS, choice))
    schemas = []

    def collect(node):
        if isinstance(node, dict):
            if node.get("type") == "json_schema":
                schemas.append(node["json_schema"])
            for value in node.values():
                collect(value)
        elif isinstance(node, list):
            for value in node:
                collect(value)

    collect(json.loads(tag))
    assert schemas[:2] == [CITY, {"type": "object", "properties": {}}]
