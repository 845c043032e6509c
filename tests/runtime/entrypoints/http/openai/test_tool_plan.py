"""tools / tool_choice checking and their conversion (plan, prompt, constraint): no model."""

import json

import pytest

from radixlm.runtime.entrypoints.http.openai.convert import chat_call
from radixlm.runtime.entrypoints.http.openai.prompts import PromptBuilder
from radixlm.runtime.entrypoints.http.openai.protocol import ChatCompletionRequest
from radixlm.runtime.entrypoints.http.openai.tools import tool_plan_from
from radixlm.runtime.entrypoints.http.server.errors import APIError
from radixlm.runtime.io.context_room import ContextRoom
from radixlm.runtime.tools.plan import FunctionTool, ToolPlan
from tests.runtime.entrypoints.http.openai.test_openai_convert import PROMPTS, CharTokenizer

ROOMY = PromptBuilder(CharTokenizer(), ContextRoom(4096))  # the tools block is long
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": CITY}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "Now."}}


def chat(**fields):
    body = {"model": "default", "messages": [{"role": "user", "content": "hi"}], **fields}
    return ChatCompletionRequest.model_validate(body)


def test_plans_follow_tool_choice():
    assert tool_plan_from(chat()) is None
    assert tool_plan_from(chat(tools=[])) is None
    auto = tool_plan_from(chat(tools=[WEATHER, TIME]))
    assert (auto.choice, auto.parallel, auto.name) == ("auto", True, None)
    assert auto.tools[1].parameters == {"type": "object", "properties": {}}
    single = tool_plan_from(
        chat(tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False)
    )
    assert (single.choice, single.parallel) == ("required", False)
    named = tool_plan_from(
        chat(
            tools=[WEATHER, TIME],
            tool_choice={"type": "function", "function": {"name": "get_time"}},
        )
    )
    assert (named.choice, named.name, named.parallel) == ("named", "get_time", False)
    assert [t.name for t in named.callable_tools] == ["get_time"]
    none = tool_plan_from(chat(tools=[WEATHER], tool_choice="none"))
    assert not none.calls_allowed and none.callable_tools == ()


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tool_choice": "auto"}, "tool_choice"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),  # noqa: E501
        (
            {"tools": [{"type": "function", "function": {"name": "bad name"}}]},
            "tools.0.function.name",
        ),  # noqa: E501
        ({"tools": [WEATHER, WEATHER]}, "tools.1.function.name"),
        (
            {
                "tools": [
                    TIME,
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"type": "strnig"}},
                    },
                ]
            },
            "tools.1.function.parameters",
        ),  # noqa: E501
        (
            {
                "tools": [
                    {"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}
                ]
            },
            "tools.0.function.parameters",
        ),  # noqa: E501
        ({"tools": [WEATHER], "tool_choice": "required", "regex": "a+"}, "regex"),
        ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "response_format"),
    ],
)
def test_bad_tools_are_400s_naming_the_field(fields, param):
    with pytest.raises(APIError) as info:
        chat_call(chat(**fields), PROMPTS)
    assert info.value.status == 400 and info.value.param == param


def test_tool_choice_none_leaves_other_constraints_alone():
    call = chat_call(chat(tools=[WEATHER], tool_choice="none", regex="a+", max_tokens=4), PROMPTS)
    params = call.requests[0].sampling_params
    assert params.regex == "a+" and params.structural_tag is None
    # "none": the tools are not shown to the model either
    assert "get_weather" not in CharTokenizer().decode(call.requests[0].input_ids)


def test_tools_become_a_structural_tag_and_a_system_block():
    call = chat_call(chat(tools=[WEATHER], tool_choice="required", max_tokens=8), ROOMY)
    tag = json.loads(call.requests[0].sampling_params.structural_tag)
    assert tag["format"]["type"] == "sequence"  # calls only: no free text first
    assert call.tool_parser is not None and call.tool_parser.format.name == "hermes"
    assert call.tools is not None and call.tools.choice == "required"
    prompt = CharTokenizer().decode(call.requests[0].input_ids)
    assert prompt.startswith("<system>You have functions you can call.")
    assert json.dumps(WEATHER) in prompt and "<user>hi\n<assistant>" in prompt


def test_plan_invariants():
    tool = FunctionTool("f")
    with pytest.raises(ValueError, match="function name"):
        FunctionTool("f g")
    with pytest.raises(ValueError, match="at least one tool"):
        ToolPlan((), "auto")
    with pytest.raises(ValueError, match="exactly when"):
        ToolPlan((tool,), "named")
    with pytest.raises(ValueError, match="not one of the tools"):
        ToolPlan((tool,), "named", name="g")
    with pytest.raises(ValueError, match="repeat"):
        ToolPlan((tool, tool), "auto")
