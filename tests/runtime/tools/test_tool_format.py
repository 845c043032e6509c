"""The per-family format table: how each writes calls, which one a chat template gets,
the names ``--tool-call-parser`` takes. No model."""

from __future__ import annotations

import json

import pytest

from radixlm.runtime.config import ConfigError, GrammarConfig
from radixlm.runtime.entrypoints.http.openai.tools import ToolCalling
from radixlm.runtime.entrypoints.http.server.config import ServerConfig
from radixlm.runtime.tools.format import (
    DEEPSEEK_V3,
    FORMATS,
    GRANITE,
    HERMES,
    LLAMA3_JSON,
    MISTRAL,
    MISTRAL_V11,
    QWEN3_CODER,
    ToolFormat,
    detect_tool_format,
    raw_string,
    tool_format_named,
)

# The tool-call lines of each family's chat template (abridged from the models' own).
TEMPLATES = {
    "hermes": (
        "{%- if tools %}<tools>{% for tool in tools %}{{ tool | tojson }}{% endfor %}</tools>"
        '<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}\\n'
        "</tool_call>{%- endif %}"
    ),
    "llama3_json": (
        '{%- if tools is not none %}Respond in the format {"name": function name, '
        '"parameters": dictionary of argument name and its value}{%- endif %}'
        "{%- if builtin_tools is defined %}{{- '<|python_tag|>' + tool_call.name }}{% endif %}"
    ),
    "mistral": '{%- if message.tool_calls %}{{- "[TOOL_CALLS] [" }}{%- endif %}',
    "mistral_v11": (
        "{%- for tool in message.tool_calls %}"
        "{{- '[TOOL_CALLS]' + tool.function.name + '[ARGS]' + arguments }}{%- endfor %}"
    ),
    "qwen3_coder": (
        "{%- if tools %}<tools>...</tools>{% endif %}"
        "{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}"
        "{{- '<parameter=' + args_name + '>\\n' }}"
    ),
    "deepseek_v3": (
        "{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] }}"
    ),
    "granite": "{%- if tools %}<|start_of_role|>available_tools{% endif %}<|tool_call|>",
}
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
)


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_the_format_comes_from_the_templates_tool_markers(name):
    assert detect_tool_format(TEMPLATES[name]).name == name
    assert detect_tool_format({"default": CHATML, "tool_use": TEMPLATES[name]}).name == name


def test_a_template_without_tools_keeps_hermes():
    assert detect_tool_format(CHATML) is HERMES  # SmolLM2: the fallback prompt shows Hermes
    assert detect_tool_format(None) is HERMES
    assert detect_tool_format("{% if tools %}{{ tools }}{% endif %}") is HERMES


def test_the_flag_overrides_the_template():
    config = GrammarConfig()
    assert ToolCalling.for_model(TEMPLATES["mistral"], None, config).format is MISTRAL
    assert ToolCalling.for_model(TEMPLATES["mistral"], "granite", config).format is GRANITE
    assert ToolCalling.for_model(CHATML, "qwen25", config).format is HERMES  # SGLang's name
    assert ServerConfig(tool_call_parser="llama3").tool_call_parser == "llama3"


def test_a_format_name_that_does_not_exist_is_refused_naming_them():
    with pytest.raises(ValueError, match="expected one of") as e:
        tool_format_named("hermes2")
    assert all(name in str(e.value) for name in FORMATS)
    with pytest.raises(ConfigError, match="tool_call_parser.*'hermes2'"):
        ServerConfig(tool_call_parser="hermes2")
    with pytest.raises(ConfigError, match="tool_call_parser"):
        ServerConfig(tool_call_parser=3)  # type: ignore[arg-type]


def test_serve_takes_the_flag():
    from radixlm.runtime.entrypoints.cli import _build_parser

    args = _build_parser().parse_args(["serve", "--tool-call-parser", "mistral"])
    assert args.server_tool_call_parser == "mistral"
    assert _build_parser().parse_args(["serve"]).server_tool_call_parser is None


def test_each_format_writes_calls_as_its_family_does():
    args = {"city": "Paris", "days": 3}
    assert HERMES.render_section([("f", json.dumps(args))]) == (
        '<tool_call>\n{"name": "f", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>'
    )
    two = [("f", '{"a": 1}'), ("g", "{}")]
    assert LLAMA3_JSON.render_section(two) == (
        '{"name": "f", "parameters": {"a": 1}}; {"name": "g", "parameters": {}}'
    )
    assert MISTRAL.render_section(two) == (
        '[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]'
    )
    assert MISTRAL_V11.render_section(two) == '[TOOL_CALLS]f[ARGS]{"a": 1}[TOOL_CALLS]g[ARGS]{}'
    assert GRANITE.render_section(two) == (
        '<|tool_call|>[{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]'
    )
    assert DEEPSEEK_V3.render_section(two) == (
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n"
        '{"a": 1}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>g\n'
        "```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    )
    xml = QWEN3_CODER.render_arguments(args)
    assert QWEN3_CODER.render_section([("f", xml)]) == (
        "<tool_call>\n<function=f>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
    )


def test_xml_values_are_raw_only_for_plain_strings():
    assert raw_string({"type": "string"}) and raw_string({"type": "string", "enum": ["a"]})
    assert not raw_string({"type": "string", "format": "date"})
    assert not raw_string({"type": ["string", "null"]}) and not raw_string(None)
    assert QWEN3_CODER.render_arguments('{"q": [1]}') == "<parameter=q>\n[1]\n</parameter>\n"
    assert QWEN3_CODER.render_arguments("not json") == "not json"


def test_a_format_checks_its_own_shape():
    with pytest.raises(ValueError, match="trigger"):
        ToolFormat(
            "x", "", trigger="<b>", head="<a>{name}", arguments="json", tail="", separator=""
        )
    with pytest.raises(ValueError, match="head"):
        ToolFormat("x", "", trigger="<a>", head="<a>", arguments="json", tail="", separator="")
