"""Role blocks into chat: the chat template's text around each block, and the
messages the blocks make (``state.messages()``).

    s += sgl.user("Hi")  ->  text: <user prefix> Hi <user suffix>
                             messages: [{"role": "user", "content": "Hi"}]

Blocks do not nest; a gen inside an assistant block also stops at the template's
end-of-turn tokens (``turn_stop_token_ids``).
"""

from __future__ import annotations

from radixlm.runtime.io.chat_template import ChatTemplate
from radixlm.stream_store import StreamStore

__all__ = ["Conversation"]


class Conversation:
    """The chat messages of one stream and its open role block, if any."""

    def __init__(self, template: ChatTemplate) -> None:
        self.template = template
        self.messages: list[dict[str, str]] = []
        self.role: str | None = None  # the open block's
        self._content_start = 0  # where the open block's content starts in the text

    def branch(self) -> Conversation:
        """A copy (messages and the open block) for a forked stream."""
        other = Conversation(self.template)
        other.messages = list(self.messages)
        other.role, other._content_start = self.role, self._content_start
        return other

    def begin(self, role: str, store: StreamStore) -> None:
        """Opens a ``role`` block: appends the template's prefix for it.

        Raises:
            ValueError: a block is already open.
        """
        if self.role is not None:
            raise ValueError(f"a {role} block inside the open {self.role} block")
        prefix, _ = self.template.prefix_and_suffix(role, len(self.messages))
        store.append(prefix)
        self.role, self._content_start = role, len(store.text)

    def end(self, role: str, store: StreamStore) -> None:
        """Closes the ``role`` block: appends its suffix; its text becomes a message.

        Raises:
            ValueError: the open block is not a ``role`` block (or none is open).
        """
        if self.role != role:
            raise ValueError(f"the end of a {role} block, but the open one is {self.role}")
        content = store.text[self._content_start :]
        _, suffix = self.template.prefix_and_suffix(role, len(self.messages))
        store.append(suffix)
        self.messages.append({"role": role, "content": content.lstrip()})
        self.role = None

    def turn_stop_token_ids(self) -> tuple[int, ...]:
        """The tokens a gen here must also stop at: the end of the assistant's turn
        inside an assistant block, none elsewhere."""
        return self.template.stop_token_ids if self.role == "assistant" else ()
