"""The reasoning formats' registry, where a reply starts, and detection from templates."""

from __future__ import annotations

import pytest

from radixlm.runtime.errors import InvalidRequestError
from radixlm.runtime.reasoning import (
    REASONING_FORMATS,
    Phase,
    ReasoningFormat,
    UnknownReasoningParserError,
    detect_reasoning_format,
    reasoning_format,
    resolve_reasoning_format,
)

# Cut-down versions of the families' own templates: the markers and switches that matter.
QWEN3 = (
    "{%- for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}"
    "<|im_end|>\n{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{%- endif %}{%- endif %}"
)
DEEPSEEK_R1 = (
    "{% for message in messages %}{% if message['role'] == 'user' %}<\uff5cUser\uff5c>"
    "{{ message['content'] }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<\uff5cAssistant\uff5c><think>\n{% endif %}"
)
DEEPSEEK_V3 = DEEPSEEK_R1.replace(
    "<think>\n{% endif %}",
    "{% if thinking %}<think>{% else %}</think>{% endif %}{% endif %}",
)
PLAIN = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{% endfor %}"


@pytest.mark.parametrize(
    ("template", "name"),
    [
        (QWEN3, "qwen3"),
        (DEEPSEEK_R1, "deepseek-r1"),
        (DEEPSEEK_V3, "deepseek-v3"),
        ("{{ messages }}<think>", "think"),
        ("\u25c1think\u25b7{{ messages }}", "kimi"),
        (PLAIN, None),
        (None, None),
    ],
)
def test_detection_from_the_chat_template(template, name):
    found = detect_reasoning_format(template)
    assert (found.name if found else None) == name


def test_auto_none_and_names_resolve():
    assert resolve_reasoning_format("auto", QWEN3) is REASONING_FORMATS["qwen3"]
    assert resolve_reasoning_format("none", QWEN3) is None
    assert resolve_reasoning_format(None, QWEN3) is None
    assert resolve_reasoning_format("deepseek_r1", PLAIN) is REASONING_FORMATS["deepseek-r1"]


def test_an_unknown_name_is_our_value_error_naming_the_known_ones():
    with pytest.raises(UnknownReasoningParserError, match="'gpt-99'.*deepseek-r1, .*qwen3"):
        reasoning_format("gpt-99")
    assert issubclass(UnknownReasoningParserError, InvalidRequestError)
    assert issubclass(UnknownReasoningParserError, ValueError)


@pytest.mark.parametrize(
    ("prompt", "qwen3", "deepseek_r1"),
    [
        ("<|im_start|>assistant\n<think>\n", Phase.REASONING, Phase.REASONING),
        ("assistant\n<think>\nso far I", Phase.REASONING, Phase.REASONING),  # prefilled
        ("assistant\n<think>\n\n</think>\n\n", Phase.ANSWER, Phase.ANSWER),  # thinking off
        ("<|im_start|>assistant\n", Phase.MAY_OPEN, Phase.REASONING),  # no marker
        # an earlier turn's closed section: the family's default again
        ("<think>a</think>b<|im_end|><|im_start|>assistant\n", Phase.MAY_OPEN, Phase.REASONING),
    ],
)
def test_the_prompts_last_marker_decides_where_a_reply_starts(prompt, qwen3, deepseek_r1):
    assert reasoning_format("qwen3").opening_phase(prompt) is qwen3
    assert reasoning_format("deepseek-r1").opening_phase(prompt) is deepseek_r1


def test_a_format_needs_two_distinct_markers():
    with pytest.raises(ValueError, match="two distinct"):
        ReasoningFormat("x", start="<t>", end="<t>")
