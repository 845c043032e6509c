"""ChatTemplate read off tokenizers' own Jinja templates: rebuilding a conversation from the
derived prefixes and suffixes gives exactly the text ``apply_chat_template`` renders.

The synthetic tokenizers (a WordLevel vocabulary of special tokens) keep most checks in the
fast suite; the default model's tokenizer (``hf_tokenizer``) makes its tests e2e.
"""

from __future__ import annotations

import pytest

from radixlm.runtime.io.chat_template import FALLBACK, ChatTemplate, chat_template_from_tokenizer

LLAMA3_TEMPLATE = (
    "{% for message in messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    " + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)
LLAMA3_SPECIALS = ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]

MISTRAL_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}"
    "{{ raise_exception('System messages are not supported by this template') }}"
    "{% endif %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/...') }}"
    "{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% else %}{{ message['content'] + eos_token }}{% endif %}"
    "{% endfor %}"
)
MISTRAL_SPECIALS = ["[INST]", "[/INST]"]


def make_tokenizer(chat_template, bos_token, eos_token, specials=()):
    """A tiny transformers tokenizer whose vocabulary is only its special tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="[UNK]",
        bos_token=bos_token,
        eos_token=eos_token,
        additional_special_tokens=list(specials),
    )
    tokenizer.chat_template = chat_template
    return tokenizer


def conversation(*roles):
    return [{"role": role, "content": f"{role} says {i}."} for i, role in enumerate(roles)]


def rebuild(template: ChatTemplate, messages) -> str:
    """The text the interpreter builds: prefix + content + suffix per message."""
    parts = []
    for i, message in enumerate(messages):
        prefix, suffix = template.prefix_and_suffix(message["role"], i)
        parts += [prefix, message["content"], suffix]
    return "".join(parts)


def render(tokenizer, messages, add_generation_prompt=False) -> str:
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )


def generation_prompt(tokenizer, messages) -> str:
    with_prompt, without = render(tokenizer, messages, True), render(tokenizer, messages)
    assert with_prompt.startswith(without)
    return with_prompt[len(without) :]


# --- the default model's tokenizer (e2e) ----------------------------------------------------


def test_default_model_system_user_assistant_rebuilds_the_rendering(hf_tokenizer):
    template = chat_template_from_tokenizer(hf_tokenizer)
    messages = conversation("system", "user", "assistant")
    assert template.name == "model"
    assert rebuild(template, messages) == render(hf_tokenizer, messages)


def test_default_model_first_user_gets_the_injected_system_block(hf_tokenizer):
    template = chat_template_from_tokenizer(hf_tokenizer)
    messages = conversation("user", "assistant", "user")
    assert rebuild(template, messages) == render(hf_tokenizer, messages)
    assert template.first_prefixes["user"].startswith("<|im_start|>system\n")


def test_default_model_assistant_prefix_is_the_generation_prompt(hf_tokenizer):
    template = chat_template_from_tokenizer(hf_tokenizer)
    prefix, _ = template.prefix_and_suffix("assistant", 1)
    assert prefix == generation_prompt(hf_tokenizer, conversation("user"))


def test_default_model_stops_at_im_end(hf_tokenizer):
    template = chat_template_from_tokenizer(hf_tokenizer)
    assert template.stop_token_ids == (hf_tokenizer.convert_tokens_to_ids("<|im_end|>"),)


# --- a Llama-3-style template ---------------------------------------------------------------


@pytest.fixture(scope="module")
def llama3():
    tokenizer = make_tokenizer(
        LLAMA3_TEMPLATE, "<|begin_of_text|>", "<|end_of_text|>", LLAMA3_SPECIALS
    )
    return tokenizer, chat_template_from_tokenizer(tokenizer)


@pytest.mark.parametrize(
    "roles", [("system", "user", "assistant", "user"), ("user", "assistant"), ("assistant",)]
)
def test_llama3_rebuilds_the_rendering(llama3, roles):
    tokenizer, template = llama3
    messages = conversation(*roles)
    assert rebuild(template, messages) == render(tokenizer, messages)


def test_llama3_keeps_bos_text_in_the_first_prefix_only(llama3):
    _, template = llama3
    for role in ("system", "user", "assistant"):
        assert template.first_prefixes[role].startswith("<|begin_of_text|>")
        assert "<|begin_of_text|>" not in template.role_prefixes[role]
    assert template.role_prefixes["user"] == "<|start_header_id|>user<|end_header_id|>\n\n"
    assert template.role_suffixes["user"] == "<|eot_id|>"


def test_llama3_assistant_prefix_is_the_generation_prompt_and_stops_at_eot(llama3):
    tokenizer, template = llama3
    prefix, _ = template.prefix_and_suffix("assistant", 2)
    assert prefix == generation_prompt(tokenizer, conversation("system", "user"))
    assert template.stop_token_ids == (tokenizer.convert_tokens_to_ids("<|eot_id|>"),)


# --- a Mistral-style template: no system role, strict alternation ---------------------------


@pytest.fixture(scope="module")
def mistral():
    tokenizer = make_tokenizer(MISTRAL_TEMPLATE, "<s>", "</s>", MISTRAL_SPECIALS)
    return tokenizer, chat_template_from_tokenizer(tokenizer)  # refused roles do not raise here


def test_mistral_user_and_assistant_rebuild_the_rendering(mistral):
    tokenizer, template = mistral
    messages = conversation("user", "assistant", "user", "assistant")
    assert rebuild(template, messages) == render(tokenizer, messages)
    assert template.prefix_and_suffix("user", 0) == ("<s>[INST] ", " [/INST]")
    assert template.stop_token_ids == (tokenizer.convert_tokens_to_ids("</s>"),)


@pytest.mark.parametrize("num_previous_messages", [0, 2])
def test_mistral_system_raises_naming_the_role_and_the_template_error(
    mistral, num_previous_messages
):
    _, template = mistral
    with pytest.raises(ValueError, match="'system'") as info:
        template.prefix_and_suffix("system", num_previous_messages)
    assert "System messages are not supported" in str(info.value)


def test_mistral_assistant_cannot_open_the_conversation(mistral):
    _, template = mistral
    with pytest.raises(ValueError, match="'assistant' message as the first message") as info:
        template.prefix_and_suffix("assistant", 0)
    assert "roles must alternate" in str(info.value)


# --- no template, and the edges ------------------------------------------------------------


def test_no_chat_template_falls_back_to_the_plain_table():
    tokenizer = make_tokenizer(None, "<s>", "</s>")
    template = chat_template_from_tokenizer(tokenizer)
    assert template is FALLBACK
    assert template.name == "plain" and template.stop_token_ids == ()
    messages = conversation("system", "user", "assistant")
    expected = "System: system says 0.\nUser: user says 1.\nAssistant: assistant says 2.\n"
    assert rebuild(template, messages) == expected


@pytest.mark.parametrize("template_source", ["fallback", "llama3"])
def test_an_unknown_role_raises_naming_it(llama3, template_source):
    template = FALLBACK if template_source == "fallback" else llama3[1]
    with pytest.raises(ValueError, match="'tool'"):
        template.prefix_and_suffix("tool", 0)


def test_whitespace_is_kept_as_rendered():
    source = (
        "{% for m in messages %}  <{{ m['role'] }}>\n{{ m['content'] }}\n\n</{{ m['role'] }}>\n"
        "{% endfor %}{% if add_generation_prompt %}  <assistant>\n{% endif %}"
    )
    tokenizer = make_tokenizer(source, "<s>", "</s>")
    template = chat_template_from_tokenizer(tokenizer)
    messages = conversation("system", "user", "assistant")
    assert rebuild(template, messages) == render(tokenizer, messages)
    assert template.prefix_and_suffix("user", 1) == ("  <user>\n", "\n\n</user>\n")
    assert template.stop_token_ids == ()


def test_a_prefix_without_a_suffix_is_refused_at_construction():
    with pytest.raises(ValueError, match="no entry in role_suffixes"):
        ChatTemplate("bad", {"user": "U: "}, {}, {"user": "U: "}, ())
    with pytest.raises(ValueError, match=">= 0"):
        FALLBACK.prefix_and_suffix("user", -1)


def test_a_template_survives_the_json_a_server_sends(hf_tokenizer):
    import json

    template = chat_template_from_tokenizer(hf_tokenizer)
    wire = json.loads(json.dumps(template.to_dict()))
    assert ChatTemplate.from_dict(wire) == template
    assert ChatTemplate.from_dict(json.loads(json.dumps(FALLBACK.to_dict()))) == FALLBACK
