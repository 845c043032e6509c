"""Output text -> content and tool calls, whole and streamed, in every format: no model."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixlm.runtime.entrypoints.http.openai.format import tool_message
from radixlm.runtime.tools.format import FORMATS, HERMES
from radixlm.runtime.tools.parser import (
    ParsedCall,
    ToolCallParser,
    ToolCallStream,
    parse_tool_output,
    tool_finish_reason,
)
from tests.runtime.tools.tool_cases import SCHEMAS, TOOLS, sample_section

CALL_SEPARATOR = HERMES.separator
render_call = HERMES.render_call
WEATHER = render_call("get_weather", '{"city": "Paris", "days": [1, {"a": "}"}]}')
TRICKY = render_call("search", '{"q": "a \\"quoted\\" }</tool_call> inside"}')
OUTPUTS = [
    "Just an answer.",
    WEATHER,
    WEATHER + CALL_SEPARATOR + TRICKY,
    "Let me look.\n" + WEATHER + "\nDone, <b>bold</b> and a < sign.",
    "  spaced  ",
    WEATHER[:-5],  # cut off before the closing tag
    WEATHER[:60],  # cut off inside the arguments
    WEATHER[:40],  # cut off inside the header: content
    "<tool_call>\nnot a call",
    "<tool_",
]


def test_a_call_is_parsed_whole():
    parsed = parse_tool_output(WEATHER)
    assert parsed.content == ""
    assert parsed.calls == (
        ParsedCall("get_weather", '{"city": "Paris", "days": [1, {"a": "}"}]}', True),
    )
    assert json.loads(parsed.calls[0].arguments)["city"] == "Paris"


def test_text_around_calls_is_the_content():
    parsed = parse_tool_output("Let me look.\n" + WEATHER + CALL_SEPARATOR + TRICKY + "\nOk.")
    assert parsed.content == "Let me look.\n\nOk."  # the separator is the section's
    assert [c.name for c in parsed.calls] == ["get_weather", "search"]
    assert json.loads(parsed.calls[1].arguments) == {"q": 'a "quoted" }</tool_call> inside'}


def test_a_cut_off_call_keeps_its_arguments_so_far():
    parsed = parse_tool_output(WEATHER[:60])
    (call,) = parsed.calls
    assert not call.complete and call.name == "get_weather"
    assert '{"city": "Paris", "days": [1, {"a": "}"}]}'.startswith(call.arguments)
    assert tool_finish_reason(parsed, "length") == "length"
    closed = parse_tool_output(WEATHER[:-5])
    assert closed.calls[0].arguments == '{"city": "Paris", "days": [1, {"a": "}"}]}'
    assert not closed.calls[0].complete


def test_an_opening_tag_without_a_header_is_content():
    parsed = parse_tool_output("<tool_call>\nnot a call")
    assert parsed.content == "<tool_call>\nnot a call" and parsed.calls == ()


def test_unfinished_text_holds_back_what_may_become_a_call():
    assert parse_tool_output("Hi <tool_", final=False).content == "Hi"
    assert parse_tool_output("Hi <tool_", final=True).content == "Hi <tool_"
    assert parse_tool_output("a < b", final=False).content == "a < b"
    assert parse_tool_output("trailing  \n", final=False).content == "trailing"
    # the name is out only once the header is whole
    assert parse_tool_output('<tool_call>\n{"name": "get_wea', final=False).calls == ()


def test_finish_reason_and_message_shape():
    parsed = parse_tool_output(WEATHER)
    assert tool_finish_reason(parsed, "stop") == "tool_calls"
    assert tool_finish_reason(parse_tool_output("text"), "stop") == "stop"
    message = tool_message(parsed)
    assert message["content"] is None
    (call,) = message["tool_calls"]
    assert call["id"].startswith("call_") and len(call["id"]) == 29
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    assert tool_message(parse_tool_output("plain")) == {"role": "assistant", "content": "plain"}


def _stream(text: str, cuts: list[int], parser=None) -> tuple[str, dict[int, dict]]:
    ids = iter(f"call_{i}" for i in range(999)).__next__
    stream = ToolCallStream(parser or ToolCallParser(), new_id=ids)
    content, calls = "", {}
    bounds = [0, *sorted(set(cuts)), len(text)]
    for i, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False)):
        delta = stream.feed(text[a:b], final=i == len(bounds) - 2).to_openai()
        content += delta.get("content", "")
        for entry in delta.get("tool_calls", []):
            if "id" in entry:
                assert entry["index"] not in calls and entry["type"] == "function"
                calls[entry["index"]] = {"name": entry["function"]["name"], "arguments": ""}
            else:
                assert set(entry) == {"index", "function"} and set(entry["function"]) == {
                    "arguments"
                }
            calls[entry["index"]]["arguments"] += entry["function"]["arguments"]
    return content, calls


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(OUTPUTS), st.lists(st.integers(min_value=0, max_value=200), max_size=12))
def test_stream_deltas_concatenate_to_the_whole_parse(text, cuts):
    content, calls = _stream(text, [c for c in cuts if c <= len(text)])
    whole = parse_tool_output(text)
    assert content == whole.content
    assert [calls[i] for i in sorted(calls)] == [
        {"name": c.name, "arguments": c.arguments} for c in whole.calls
    ]


def test_stream_sends_the_name_first_then_fragments():
    stream = ToolCallStream(new_id=lambda: "call_x")
    split = WEATHER.index("Paris")
    first = stream.feed(WEATHER[:split], final=False).to_openai()
    assert first == {
        "tool_calls": [
            {
                "index": 0,
                "id": "call_x",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "'},
            }
        ]
    }
    rest = stream.feed(WEATHER[split:], final=True).to_openai()
    assert rest["tool_calls"][0]["function"]["arguments"].startswith("Paris")
    assert "content" not in rest


# ---- every format ----------------------------------------------------------------------


def _format_outputs(fmt) -> list[str]:
    """Whole answers, text around calls, and answers cut off anywhere."""
    two = sample_section(fmt, ("get_weather", "search_notes"))
    three = sample_section(fmt, ("get_weather", "search_notes", "get_time"))
    return [
        "Just an answer.",
        two,
        "Let me look. " + three,
        "Let me look.\n" + two + "\nDone.",
        *(three[:cut] for cut in range(0, len(three), 7)),
    ]


FORMAT_OUTPUTS = [(fmt, text) for fmt in FORMATS.values() for text in _format_outputs(fmt)]


@pytest.mark.parametrize("fmt", list(FORMATS.values()), ids=list(FORMATS))
def test_every_format_parses_its_own_calls(fmt):
    parsed = ToolCallParser(fmt, TOOLS).parse("Sure. " + sample_section(fmt, tuple(SCHEMAS)))
    assert parsed.content == "Sure."
    assert [c.name for c in parsed.calls] == list(SCHEMAS) and all(c.complete for c in parsed.calls)
    assert [json.loads(c.arguments) for c in parsed.calls] == [
        {"city": "Paris", "unit": "celsius", "days": 3},
        {"tags": ["a", "bc"], "exact": True},
        {},
    ]
    assert tool_finish_reason(parsed, "stop") == "tool_calls"


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(FORMAT_OUTPUTS), st.lists(st.integers(min_value=0, max_value=400)))
def test_every_formats_stream_concatenates_to_the_whole_parse(case, cuts):
    fmt, text = case
    parser = ToolCallParser(fmt, TOOLS)
    content, calls = _stream(text, [c for c in cuts if c <= len(text)], parser)
    whole = parser.parse(text)
    assert content == whole.content
    assert [calls[i] for i in sorted(calls)] == [
        {"name": c.name, "arguments": c.arguments} for c in whole.calls
    ]


@pytest.mark.parametrize("fmt", list(FORMATS.values()), ids=list(FORMATS))
def test_every_format_streams_character_by_character(fmt):
    text = "Ok. " + sample_section(fmt, tuple(SCHEMAS))
    parser = ToolCallParser(fmt, TOOLS)
    content, calls = _stream(text, list(range(len(text))), parser)
    whole = parser.parse(text)
    assert content == whole.content == "Ok."
    assert [calls[i]["arguments"] for i in sorted(calls)] == [c.arguments for c in whole.calls]


def test_llama_drops_its_python_tag_and_a_cut_xml_value_is_held_back():
    from radixlm.runtime.tools.format import LLAMA3_JSON, QWEN3_CODER

    tagged = "<|python_tag|>" + sample_section(LLAMA3_JSON)
    assert ToolCallParser(LLAMA3_JSON, TOOLS).parse(tagged).content == ""
    assert ToolCallParser(LLAMA3_JSON).parse("<|python", final=False).content == ""
    cut = "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar\n</para"
    (call,) = ToolCallParser(QWEN3_CODER, TOOLS).parse(cut, final=False).calls
    assert call.arguments == '{"city": "Par' and not call.complete
