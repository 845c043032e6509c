"""Prompts to token ids, and the token budget each request may use.

The server tokenizes itself, rather than handing text to the engine, so it knows each
prompt's length: a prompt that leaves no room for ``max_tokens`` in the model's
context is a 400 ``context_length_exceeded`` naming both numbers, and an omitted
``max_tokens`` means "the rest of the context" (the engine's rule, ``ContextRoom``,
applied before the request is built: the engine applies it again to what arrives).

    rendered text --(TokenBound: at least len/k tokens)--> refused untokenized, or
                  --tokenizer--> ids --(the exact count)--> refused, or the budget

A text far too long for the context is refused from the bound alone: tokenizing
8 MB took seconds and gigabytes. The routes call this in a worker thread for a large
body (``OFF_LOOP_BODY_BYTES``); a small one is built on the event loop, where rendering and
tokenizing take well under a millisecond (about what a hand-off to a thread costs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from radixlm.runtime.entrypoints.http.openai.tools import ToolCalling
from radixlm.runtime.entrypoints.http.server.errors import INVALID, APIError, api_error_from
from radixlm.runtime.errors import ContextLengthError
from radixlm.runtime.io.context_room import ContextRoom
from radixlm.runtime.io.token_bound import TokenBound
from radixlm.runtime.tools.format import ToolFormat
from radixlm.runtime.tools.prompt import (
    fallback_conversation,
    template_renders_tools,
)

__all__ = [
    "OFF_LOOP_BODY_BYTES",
    "RESERVED_TEMPLATE_KWARGS",
    "OutputBudget",
    "PromptBuilder",
    "TemplateOptions",
]

# A request body this large has its prompt built in a worker thread, and the memory
# its building freed handed back (``release_free_memory``).
OFF_LOOP_BODY_BYTES = 64 * 1024

# OpenAI's "developer" role is the system role of models that predate it.
_ROLE_ALIASES = {"developer": "system"}
# apply_chat_template's own arguments and the conversation's name inside templates: a
# template variable (chat_template_kwargs) may not take these.
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "messages",
        "conversation",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "sanitize_control_tokens",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)


@dataclass(frozen=True)
class TemplateOptions:
    """How a conversation is rendered (vLLM's and SGLang's chat request fields).

    Attributes:
        add_generation_prompt: append the assistant's header, so the reply starts fresh.
        continue_final_message: leave the last message open, so the reply continues it
            (exclusive with ``add_generation_prompt``).
        template_kwargs: extra variables for the template (``chat_template_kwargs``,
            ``documents``); none of ``RESERVED_TEMPLATE_KWARGS`` but ``documents``.
        add_special_tokens: tokenize the rendered text with the tokenizer's special
            tokens (a BOS) on top of what the template writes.
    """

    add_generation_prompt: bool = True
    continue_final_message: bool = False
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    add_special_tokens: bool = False

    def render_kwargs(self) -> dict[str, Any]:
        """apply_chat_template's keyword arguments (only the ones a plain call lacks)."""
        out: dict[str, Any] = {**self.template_kwargs}
        out["add_generation_prompt"] = self.add_generation_prompt
        if self.continue_final_message:
            out["continue_final_message"] = True
        return out


@dataclass(frozen=True)
class OutputBudget:
    """What a request's output asks of the context: ``requested`` new tokens (None: all
    the room left, at least one), named ``param`` in an error."""

    requested: int | None = None
    param: str = "max_tokens"


@dataclass(frozen=True)
class PromptBuilder:
    """tokenizer: the engine's; room: what one request may hold, prompt plus output
    (the engine's context length and KV pool); tool_calling: the format the model writes
    calls in (what the fallback prompt shows) and how they are enforced; reasons: the
    engine has a reasoning parser (a request's reasoning effort then sets its budget of
    reasoning tokens, radixlm.runtime.reasoning.effort); bound: the tokenizer's lower
    bound on a text's tokens (read from the tokenizer once)."""

    tokenizer: Any
    room: ContextRoom
    tool_calling: ToolCalling = field(default_factory=ToolCalling)
    reasons: bool = False
    bound: TokenBound = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "bound", TokenBound.from_tokenizer(self.tokenizer))

    def chat_ids(
        self,
        conversation: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] = (),
        options: TemplateOptions = TemplateOptions(),
        tool_format: ToolFormat | None = None,
        budget: OutputBudget = OutputBudget(),
    ) -> tuple[int, ...]:
        """OpenAI-shaped message dicts (``role``, ``content`` text, an assistant's
        ``tool_calls``, a tool message's ``tool_call_id``) rendered by the model's chat
        template as ``options`` say (by default with the assistant's generation prompt
        appended). ``tools`` (OpenAI-shaped function dicts) go to a template that
        renders them; any other template gets ``tools.prompt``'s fallback conversation,
        showing ``tool_format`` (None: ``tool_calling``'s).

        Raises:
            APIError: the model has no chat template, or its template refuses these
                messages; (``context_length_exceeded``) the rendered text is certainly
                too long to leave room for ``budget`` (it is then never tokenized).
        """
        template = getattr(self.tokenizer, "chat_template", None)
        if not template:
            raise APIError(
                INVALID, "this model has no chat template; use /v1/completions", "messages"
            )
        messages = [{**m, "role": _ROLE_ALIASES.get(m["role"], m["role"])} for m in conversation]
        extra: dict[str, Any] = {}
        if template_renders_tools(template):
            extra = {"tools": list(tools)} if tools else {}
        else:
            fmt = tool_format or self.tool_calling.format
            messages = fallback_conversation(messages, tools, fmt)
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tokenize=False, **options.render_kwargs(), **extra
            )
        except Exception as e:  # the template is the model's Jinja: it may raise anything
            raise APIError(
                INVALID, f"the model's chat template refused the messages: {e}", "messages"
            ) from e
        # The template writes any BOS text itself: adding special tokens would double it
        # (unless the client asks for that, as vLLM's add_special_tokens lets it).
        return self._tokenize(text, options.add_special_tokens, budget)

    def text_ids(
        self,
        text: str,
        param: str,
        add_special_tokens: bool = True,
        budget: OutputBudget = OutputBudget(),
    ) -> tuple[int, ...]:
        """``text`` tokenized; like ``chat_ids``, refused untokenized when it certainly
        leaves no room for ``budget``."""
        if not text:
            raise APIError(INVALID, f"{param} is empty", param)
        return self._tokenize(text, add_special_tokens, budget)

    def _tokenize(
        self, text: str, add_special_tokens: bool, budget: OutputBudget
    ) -> tuple[int, ...]:
        at_least = self.bound.at_least(text)  # too many: then so is the exact count
        self._fit(at_least, budget.requested, budget.param, at_least=True)
        return tuple(self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])

    def max_new_tokens(self, num_prompt_tokens: int, requested: int | None, param: str) -> int:
        """``requested``, or all the room left when None.

        Raises:
            APIError (400, ``context_length_exceeded``): prompt + requested tokens do
                not fit.
        """
        return self._fit(num_prompt_tokens, requested, param)

    def _fit(
        self, num_prompt_tokens: int, requested: int | None, param: str, at_least: bool = False
    ) -> int:
        try:
            return self.room.num_new_tokens(num_prompt_tokens, requested, param, at_least)
        except ContextLengthError as e:
            raise api_error_from(e) from e
