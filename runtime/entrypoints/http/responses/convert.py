"""A Responses request -> the chat request the chat route already knows how to run.

    previous conversation (stored JSON) + instructions + input items
        --> chat messages (system, user, assistant with tool_calls, tool)
    text.format, tools, tool_choice, max_output_tokens, ...
        --> response_format, tools, tool_choice, max_completion_tokens, ...
    ChatCompletionRequest --chat_call--> ConvertedCall (template, tools, grammar)

So templates, tool prompts and constrained decoding are the chat route's own. Its
errors name chat fields; ``renamed`` gives them the Responses names back
(``response_format`` -> ``text.format``, ``tools.0.function.name`` -> ``tools.0.name``).

Input items become messages in order: consecutive ``function_call`` items join the
assistant message before them (one turn, as the model wrote it: content, then its
calls), and each ``function_call_output`` is a ``tool`` message. ``instructions``
is the first system message of this turn only (OpenAI does not carry it over).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

from radixlm.runtime.config import LimitsConfig
from radixlm.runtime.entrypoints.http.openai.convert import (
    DEFAULT_LIMITS,
    PARAM_NAMES,
    ConvertedCall,
    chat_call,
)
from radixlm.runtime.entrypoints.http.openai.prompts import PromptBuilder
from radixlm.runtime.entrypoints.http.openai.protocol import ChatCompletionRequest
from radixlm.runtime.entrypoints.http.responses.protocol import (
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    ResponsesRequest,
    TextFormat,
)
from radixlm.runtime.entrypoints.http.server.errors import INVALID, APIError
from radixlm.runtime.io.limits import check_json_depth
from radixlm.runtime.reasoning.effort import REASONING_EFFORTS

__all__ = ["RESPONSES_PARAM_NAMES", "ResponsesCall", "renamed", "responses_call"]

# OpenAI fields that would change what a response means: refused unless one of these.
_HARMLESS = (None, False, [], {})
_REFUSED = (
    "include",
    "background",
    "conversation",
    "prompt",
    "top_logprobs",
    "context_management",
    "prompt_cache_retention",
    "prompt_cache_options",
    "access_programs",
    "background_options",
    "moderation",
    "image",
)
# chat field (in a param or a message) -> the Responses field it came from
_RENAMES = {
    "reasoning_effort": "reasoning.effort",
    "max_completion_tokens": "max_output_tokens",
    "max_tokens": "max_output_tokens",
    "response_format": "text.format",
    "messages": "input",
}
_TOOL_PATH = re.compile(r"\btools\.(\d+)\.function\.")
# engine field -> the Responses field, for errors the engine raises on submission
RESPONSES_PARAM_NAMES = {name: _RENAMES.get(p, p) for name, p in PARAM_NAMES.items()}


@dataclass(frozen=True)
class ResponsesCall:
    """chat: what the engine runs (one request, one sample); conversation: the
    messages so far without ``instructions`` (what a stored response continues from)."""

    chat: ConvertedCall
    conversation: tuple[dict[str, Any], ...]


def responses_call(
    body: ResponsesRequest,
    previous: bytes | None,
    prompts: PromptBuilder,
    limits: LimitsConfig = DEFAULT_LIMITS,
) -> ResponsesCall:
    """Templates and tokenizing: the route runs it in a worker for a large body.

    Args:
        previous: the stored conversation of ``previous_response_id`` (JSON), or None.

    Raises:
        APIError (400): a refused field, an empty conversation, anything the chat
            conversion refuses (with the Responses field names); RequestLimitError:
            a ``function_call`` item's arguments nested past ``limits.max_json_depth``.
    """
    check_supported(body)
    history: list[dict[str, Any]] = orjson.loads(previous) if previous else []
    conversation = history + input_messages(body, limits)
    if not conversation:
        raise APIError(INVALID, "input is empty and there is no previous_response_id", "input")
    system = [{"role": "system", "content": body.instructions}] if body.instructions else []
    try:
        chat = chat_call(_chat_request(body, system + conversation), prompts, limits)
    except APIError as e:
        raise renamed(e) from e
    return ResponsesCall(chat, tuple(conversation))


def check_supported(body: ResponsesRequest) -> None:
    """Raises APIError (400, ``unsupported_parameter``) naming a field this server
    cannot honour."""
    for name in _REFUSED:
        if getattr(body, name) not in _HARMLESS:
            _refuse(name, f"{name} is not supported by this server")
    _reasoning_effort(body.reasoning)
    if body.truncation == "auto":
        _refuse(
            "truncation",
            "truncation 'auto' is not supported: a conversation longer than the context "
            "is refused (truncation 'disabled')",
        )
    if body.text is not None and body.text.verbosity not in (None, "medium"):
        _refuse("text.verbosity", "text.verbosity other than 'medium' is not supported")
    if body.stream_options is not None and not body.stream:
        raise APIError(INVALID, "stream_options needs stream: true", "stream_options")


def _refuse(param: str, message: str) -> None:
    raise APIError(INVALID, message, param, code="unsupported_parameter")


def input_messages(body: ResponsesRequest, limits: LimitsConfig) -> list[dict[str, Any]]:
    """``input`` as OpenAI chat message dicts (a string: one user message)."""
    if body.input is None:
        return []
    if isinstance(body.input, str):
        return [{"role": "user", "content": body.input}]
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(body.input):
        if isinstance(item, MessageItem):
            messages.append({"role": item.role, "content": item.text()})
        elif isinstance(item, FunctionCallItem):
            check_json_depth(item.arguments, f"input.{i}.arguments", limits)
            _assistant_turn(messages).setdefault("tool_calls", []).append(_tool_call(item))
        elif isinstance(item, FunctionCallOutputItem):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text()})
    return messages


def _assistant_turn(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant message a call joins: the last one, or a new one without content."""
    if not messages or messages[-1]["role"] != "assistant":
        messages.append({"role": "assistant", "content": None})
    return messages[-1]


def _tool_call(item: FunctionCallItem) -> dict[str, Any]:
    return {
        "id": item.call_id,
        "type": "function",
        "function": {"name": item.name, "arguments": item.arguments},
    }


def _chat_request(body: ResponsesRequest, messages: list[dict[str, Any]]) -> ChatCompletionRequest:
    fields: dict[str, Any] = {
        "model": body.model,
        "messages": messages,
        "max_completion_tokens": body.max_output_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "max_reasoning_tokens": body.max_reasoning_tokens,
        "reasoning_effort": _reasoning_effort(body.reasoning),
        "parallel_tool_calls": body.parallel_tool_calls,
        "stream": body.stream,
    }
    if body.text is not None and body.text.format is not None:
        fields["response_format"] = _response_format(body.text.format)
    if body.tools:
        fields["tools"] = [
            {"type": "function", "function": tool.model_dump(exclude={"type"}, exclude_none=True)}
            for tool in body.tools
        ]
    if body.tool_choice is not None:
        choice = body.tool_choice
        fields["tool_choice"] = (
            choice
            if isinstance(choice, str)
            else {"type": "function", "function": {"name": choice.name}}
        )
    return ChatCompletionRequest.model_validate({k: v for k, v in fields.items() if v is not None})


# OpenAI's reasoning.summary: accepted; the reasoning item carries the whole reasoning
# text (reasoning_text content), a local model writes no separate summary
_SUMMARIES = (None, "auto", "concise", "detailed")


def _reasoning_effort(reasoning: Any) -> str | None:
    """``reasoning.effort`` (None: not asked), for the chat call's ``reasoning_effort``
    (a budget of reasoning tokens: radixlm.runtime.reasoning.effort). Raises APIError
    (400) naming the field: not an object, an unknown key, or a value not taken."""
    if reasoning is None:
        return None
    if not isinstance(reasoning, dict):
        raise APIError(INVALID, "reasoning must be an object", "reasoning")
    for key, value in reasoning.items():
        if key == "effort":
            if value is not None and value not in REASONING_EFFORTS:
                efforts = ", ".join(REASONING_EFFORTS)
                message = f"reasoning.effort must be one of {efforts}, got {value!r}"
                raise APIError(INVALID, message, "reasoning.effort")
        elif key in ("summary", "generate_summary"):  # generate_summary: its old name
            if value not in _SUMMARIES:
                summaries = ", ".join(str(v) for v in _SUMMARIES[1:])
                message = f"reasoning.{key} must be one of {summaries} or null, got {value!r}"
                raise APIError(INVALID, message, f"reasoning.{key}")
        else:
            _refuse(f"reasoning.{key}", f"reasoning.{key} is not supported by this server")
    return reasoning.get("effort")


def _response_format(fmt: TextFormat) -> dict[str, Any]:
    if fmt.type != "json_schema":
        return {"type": fmt.type}
    if fmt.schema_ is None:
        raise APIError(
            INVALID, "text.format of type json_schema needs a schema", "text.format.schema"
        )
    spec = {"name": fmt.name or "response", "schema": fmt.schema_, "strict": fmt.strict}
    if fmt.description is not None:
        spec["description"] = fmt.description
    return {"type": "json_schema", "json_schema": spec}


def renamed(error: APIError) -> APIError:
    """``error`` with the chat route's field names in its param and message replaced
    by the Responses names."""
    param = error.param
    if param is not None:
        param = _TOOL_PATH.sub(r"tools.\1.", _RENAMES.get(param, param))
    message = _TOOL_PATH.sub(r"tools.\1.", error.message)
    for chat_name, name in _RENAMES.items():
        if chat_name != "messages":  # the word is used in messages' prose too
            message = re.sub(rf"\b{chat_name}\b", name, message)
    return APIError(error.kind, message, param, error.code, error.headers)
