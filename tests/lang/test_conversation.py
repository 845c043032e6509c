"""Role blocks: the template's text around each, the messages they make, the
assistant turn's stop tokens."""

from __future__ import annotations

import pytest

from radixlm.conversation import Conversation
from radixlm.runtime.io.chat_template import ChatTemplate
from radixlm.stream_store import StreamStore

TEMPLATE = ChatTemplate(
    name="t",
    role_prefixes={"user": "<u>", "assistant": "<a>"},
    role_suffixes={"user": "</u>", "assistant": "</a>"},
    first_prefixes={"user": "<bos><u>"},
    stop_token_ids=(7, 8),
)


def test_blocks_append_the_template_text_and_make_messages():
    store, chat = StreamStore(), Conversation(TEMPLATE)
    chat.begin("user", store)
    store.append("  Hi")
    chat.end("user", store)
    chat.begin("assistant", store)
    store.append("Hello")
    chat.end("assistant", store)
    assert store.text == "<bos><u>  Hi</u><a>Hello</a>"
    assert chat.messages == [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
    ]
    assert chat.role is None


def test_the_assistant_turn_stops_at_the_templates_end_of_turn_tokens():
    store, chat = StreamStore(), Conversation(TEMPLATE)
    assert chat.turn_stop_token_ids() == ()
    chat.begin("user", store)
    assert chat.turn_stop_token_ids() == ()
    chat.end("user", store)
    chat.begin("assistant", store)
    assert chat.turn_stop_token_ids() == (7, 8)


def test_blocks_do_not_nest_and_ends_must_match():
    store, chat = StreamStore(), Conversation(TEMPLATE)
    with pytest.raises(ValueError, match="the end of a user block, but the open one is None"):
        chat.end("user", store)
    chat.begin("user", store)
    with pytest.raises(ValueError, match="a assistant block inside the open user block"):
        chat.begin("assistant", store)
    with pytest.raises(ValueError, match="the end of a assistant block, but the open one is user"):
        chat.end("assistant", store)


def test_a_branch_continues_the_open_block_on_its_own_messages():
    store, chat = StreamStore(), Conversation(TEMPLATE)
    chat.begin("user", store)
    store.append("Q")
    branch_store, branch = store.branch(), chat.branch()
    branch_store.append("2")
    branch.end("user", branch_store)
    assert branch.messages == [{"role": "user", "content": "Q2"}]
    assert chat.messages == [] and chat.role == "user"
