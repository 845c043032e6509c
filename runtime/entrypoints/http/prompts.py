"""Prompts to token ids, and the token budget each request may use.

Runs in a worker thread (tokenizing and rendering a template are CPU work the
event loop must not wait on). The server tokenizes itself, rather than handing
text to the engine, so it knows each prompt's length: a prompt that leaves no
room for ``max_tokens`` in the model's context is a 400 ``context_length_exceeded``
naming both numbers, and an omitted ``max_tokens`` means "the rest of the context".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from radixlm.runtime.entrypoints.http.errors import INVALID, APIError

__all__ = ["PromptBuilder"]

# OpenAI's "developer" role is the system role of models that predate it.
_ROLE_ALIASES = {"developer": "system"}


@dataclass(frozen=True)
class PromptBuilder:
    """tokenizer: the engine's; max_total_tokens: the most prompt + output tokens one
    request may hold (the smaller of the context length and the KV pool)."""

    tokenizer: Any
    max_total_tokens: int

    def chat_ids(self, messages: Sequence[tuple[str, str]]) -> tuple[int, ...]:
        """(role, text) messages rendered by the model's chat template, with the
        assistant's generation prompt appended.

        Raises:
            APIError: the model has no chat template, or its template refuses these messages.
        """
        if not getattr(self.tokenizer, "chat_template", None):
            raise APIError(
                INVALID, "this model has no chat template; use /v1/completions", "messages"
            )
        conversation = [
            {"role": _ROLE_ALIASES.get(role, role), "content": text} for role, text in messages
        ]
        try:
            text = self.tokenizer.apply_chat_template(
                conversation, tokenize=False, add_generation_prompt=True
            )
        except Exception as e:  # the template is the model's Jinja: it may raise anything
            raise APIError(
                INVALID, f"the model's chat template refused the messages: {e}", "messages"
            ) from e
        # The template writes any BOS text itself: adding special tokens would double it.
        return tuple(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def text_ids(self, text: str, param: str) -> tuple[int, ...]:
        if not text:
            raise APIError(INVALID, f"{param} is empty", param)
        return tuple(self.tokenizer(text)["input_ids"])

    def max_new_tokens(self, num_prompt_tokens: int, requested: int | None, param: str) -> int:
        """``requested``, or all the room left when None.

        Raises:
            APIError (400, ``context_length_exceeded``): prompt + requested tokens do
                not fit.
        """
        room = self.max_total_tokens - num_prompt_tokens
        if requested is None and room >= 1:
            return room
        if requested is not None and requested <= room:
            return requested
        asked = f" + {requested} new tokens ({param})" if requested is not None else ""
        raise APIError(
            INVALID,
            f"the prompt has {num_prompt_tokens} tokens{asked}; this model's context holds "
            f"{self.max_total_tokens} (prompt plus output)",
            param,
            code="context_length_exceeded",
        )
