"""Tools in the prompt: a template's own rendering or the fallback conversation: no model."""

import json

from radixlm.runtime.entrypoints.http.openai.prompts import PromptBuilder
from radixlm.runtime.io.context_room import ContextRoom
from radixlm.runtime.tools.format import MISTRAL, QWEN3_CODER
from radixlm.runtime.tools.prompt import (
    fallback_conversation,
    template_renders_tools,
    tools_block,
)

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}
HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Do f."},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "content": "42", "tool_call_id": "call_1"},
]


class ToolTemplateTokenizer:
    """A template that says it renders tools; it records what it was given."""

    chat_template = "{% if tools %}...{% endif %}"

    def __init__(self):
        self.seen = {}

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(c) for c in text]}

    def apply_chat_template(self, messages, tokenize, add_generation_prompt, tools=None):
        self.seen = {"messages": messages, "tools": tools}
        return "x"


def test_templates_that_mention_tools_render_them():
    assert template_renders_tools("{{ tools }}") and template_renders_tools({"default": "tools"})
    assert not template_renders_tools("{{ message['content'] }}") and not template_renders_tools(
        None
    )
    tokenizer = ToolTemplateTokenizer()
    PromptBuilder(tokenizer, ContextRoom(100)).chat_ids(HISTORY, [TOOL])
    assert tokenizer.seen["tools"] == [TOOL]
    assert tokenizer.seen["messages"][2]["tool_calls"] == [CALL]  # left to the template
    assert tokenizer.seen["messages"][3]["role"] == "tool"


def test_fallback_shows_tools_calls_and_results_as_plain_turns():
    turns = fallback_conversation(HISTORY, [TOOL])
    assert [t["role"] for t in turns] == ["system", "user", "assistant", "user"]
    assert turns[0]["content"] == "Be brief.\n\n" + tools_block([TOOL])
    assert turns[2]["content"] == '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    assert turns[3]["content"] == "<tool_response>\n42\n</tool_response>"
    assert all(set(t) == {"role", "content"} for t in turns)


def test_fallback_block_lists_the_tools_and_the_exact_format():
    block = tools_block([TOOL])
    assert f"<tools>\n{json.dumps(TOOL)}\n</tools>" in block
    assert block.endswith(
        "(several calls go one after another):\n"
        '<tool_call>\n{"name": "FUNCTION_NAME", "arguments": {ARGUMENTS}}\n</tool_call>'
    )
    mistral = tools_block([TOOL], MISTRAL)
    assert mistral.endswith(
        'separated by \', \'):\n[TOOL_CALLS] [{"name": "FUNCTION_NAME", "arguments": {ARGUMENTS}}]'
    )
    assert tools_block([TOOL], QWEN3_CODER).endswith(
        "one <parameter=NAME> block each matching its parameters (several calls go one after "
        "another):\n<tool_call>\n<function=FUNCTION_NAME>\n<parameter=NAME>\nVALUE\n"
        "</parameter>\n</function>\n</tool_call>"
    )
    no_system = fallback_conversation([{"role": "user", "content": "hi"}], [TOOL])
    assert no_system[0] == {"role": "system", "content": block}
    assert fallback_conversation([{"role": "user", "content": None}], []) == [
        {"role": "user", "content": ""}
    ]
