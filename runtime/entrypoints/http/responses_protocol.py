"""OpenAI's Responses request body, as pydantic models (the HTTP edge only).

Strict and closed like ``openai_protocol``: a wrong type is a 400 naming the field,
an unknown field is a 400. ``input`` is a string or a list of items, told apart by
their ``type`` (a message may leave it out, as OpenAI's "easy" messages do):

    message               role user / system / developer / assistant; text content
    function_call         a call an earlier response made (call_id, name, arguments)
    function_call_output  the caller's answer to it (call_id, output)

Items a response returned (``response.output``) validate as input unchanged, so a
client may send them back. Fields OpenAI defines that this server cannot honour
are declared loosely here and refused, by name, in ``responses_convert``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from radixlm.runtime.entrypoints.http.sampling_bounds import SamplingBound

__all__ = [
    "FunctionCallItem",
    "FunctionCallOutputItem",
    "FunctionTool",
    "InputItem",
    "MessageItem",
    "NamedFunction",
    "ResponsesRequest",
    "TextFormat",
]

_Status = Literal["in_progress", "completed", "incomplete"]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


def _text_or_list(value: Any) -> str:
    """Tags a ``str | list`` field, so a bad list reports its own error, not the str's.
    Tags are capitalised: ``errors.validation_error`` leaves them out of ``param``."""
    return "Text" if isinstance(value, str) else "List"


def _type_tag(tags: dict[str, str], default: str | None = None) -> Callable[[Any], str | None]:
    """A discriminator reading ``type`` (absent: ``default``); None fails validation."""

    def tag(value: Any) -> str | None:
        kind = value.get("type", default) if isinstance(value, dict) else None
        return tags.get(kind) if isinstance(kind, str) else None

    return tag


class InputText(_Body):
    type: Literal["input_text"]
    text: str


class OutputText(_Body):
    """Text an earlier response wrote; its annotations and logprobs are not read."""

    type: Literal["output_text"]
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] | None = None


_PART_TAGS = {"input_text": "InputText", "output_text": "OutputText"}
ContentPart = Annotated[
    Annotated[InputText, Tag("InputText")] | Annotated[OutputText, Tag("OutputText")],
    Discriminator(
        _type_tag(_PART_TAGS),
        custom_error_type="unsupported_content",
        custom_error_message="this server reads text only: a part's type is 'input_text' or "
        "'output_text'",
    ),
]
Content = Annotated[
    Annotated[str, Tag("Text")] | Annotated[list[ContentPart], Tag("List")],
    Discriminator(_text_or_list),
]


class MessageItem(_Body):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: Content
    id: str | None = None
    status: _Status | None = None
    phase: Literal["commentary", "final_answer"] | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class FunctionCallItem(_Body):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str  # JSON text, as the model wrote it
    id: str | None = None
    status: _Status | None = None


class FunctionCallOutputItem(_Body):
    type: Literal["function_call_output"]
    call_id: str
    output: Content
    id: str | None = None
    status: _Status | None = None

    def text(self) -> str:
        if isinstance(self.output, str):
            return self.output
        return "".join(part.text for part in self.output)


_ITEM_TAGS = {
    "message": "MessageItem",
    "function_call": "FunctionCallItem",
    "function_call_output": "FunctionCallOutputItem",
}
InputItem = Annotated[
    Annotated[MessageItem, Tag("MessageItem")]
    | Annotated[FunctionCallItem, Tag("FunctionCallItem")]
    | Annotated[FunctionCallOutputItem, Tag("FunctionCallOutputItem")],
    Discriminator(
        _type_tag(_ITEM_TAGS, default="message"),
        custom_error_type="unsupported_item",
        custom_error_message="this server reads input items of type 'message', "
        "'function_call' and 'function_call_output'",
    ),
]
Input = Annotated[
    Annotated[str, Tag("Text")] | Annotated[list[InputItem], Tag("List")],
    Discriminator(_text_or_list),
]


class FunctionTool(_Body):
    """A function the model may call (the Responses shape: flat, no ``function`` key)."""

    type: Literal["function"]
    name: str
    parameters: dict[str, Any] | None = None  # a JSON schema; None: no arguments
    strict: bool | None = None  # calls are enforced by constrained decoding either way
    description: str | None = None


class NamedFunction(_Body):
    type: Literal["function"]
    name: str


class TextFormat(_Body):
    """``text.format``: ``text``, ``json_object``, or ``json_schema`` with its schema."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextConfig(_Body):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class StreamOptions(_Body):
    include_obfuscation: bool | None = None  # no obfuscation padding is ever sent


def _bound(name: str) -> SamplingBound:
    return SamplingBound(name, ("responses",))


class ResponsesRequest(_Body):
    """``POST /v1/responses``. The loosely typed fields at the end are OpenAI's that
    radixlm cannot honour: refused unless absent or harmless (``responses_convert``)."""

    model: str
    input: Input | None = None
    instructions: str | None = None
    # Bounds: the sampling table's (runtime/io/sampling_fields), the engine's own.
    max_output_tokens: Annotated[int | None, _bound("max_new_tokens")] = None
    temperature: Annotated[float | None, _bound("temperature")] = None
    top_p: Annotated[float | None, _bound("top_p")] = None
    max_reasoning_tokens: Annotated[int | None, _bound("max_reasoning_tokens")] = None
    text: TextConfig | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    store: bool | None = None  # None: true, as OpenAI
    previous_response_id: str | None = None
    # accepted, echoed back, never read
    metadata: dict[str, str] | None = None
    user: str | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    truncation: Literal["auto", "disabled"] | None = None  # "auto" is refused
    max_tool_calls: int | None = Field(default=None, ge=1)  # bounds built-in tools: none here
    # refused unless absent, null, false or empty
    reasoning: Any = None
    include: Any = None
    background: Any = None
    conversation: Any = None
    prompt: Any = None
    top_logprobs: Any = None
    context_management: Any = None
    prompt_cache_retention: Any = None
    prompt_cache_options: Any = None
    access_programs: Any = None
    background_options: Any = None
    moderation: Any = None
    image: Any = None
