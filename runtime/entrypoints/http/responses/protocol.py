"""OpenAI's Responses request body, as pydantic models (the HTTP edge only).

Strict and closed like ``openai/protocol.py``: a wrong type is a 400 naming the field,
an unknown field is a 400. ``input`` is a string or a list of items, told apart by
their ``type`` (a message may leave it out, as OpenAI's "easy" messages do):

    message               role user / system / developer / assistant; text content
    function_call         a call an earlier response made (call_id, name, arguments)
    function_call_output  the caller's answer to it (call_id, output)

Items a response returned (``response.output``) validate as input unchanged, so a
client may send them back. Fields OpenAI defines that this server cannot honour
are declared loosely here and refused, by name, in ``convert``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Discriminator, Field, Tag
from pydantic_core import PydanticCustomError

from radixlm.runtime.entrypoints.http.openai.sampling_bounds import SamplingBound

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


# What a response echoes back is capped as OpenAI caps it (its API reference); ``user``
# has no published cap there, so radixlm's own.
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
MAX_USER_CHARS = 256
_FORMAT_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _check_format_name(name: str | None) -> str | None:
    if name is not None and not _FORMAT_NAME.fullmatch(name):
        got = repr(name) if len(name) <= 64 else f"{len(name)} characters"
        raise PydanticCustomError(
            "format_name",
            "must be 1-64 characters of a-z, A-Z, 0-9, '_' and '-', got {got}",
            {"got": got},
        )
    return name


def _check_metadata(metadata: dict[str, str] | None) -> dict[str, str] | None:
    if metadata is None:
        return None
    if len(metadata) > MAX_METADATA_PAIRS:
        raise _metadata_error(f"at most {MAX_METADATA_PAIRS} key-value pairs, got {len(metadata)}")
    longest_key = max(map(len, metadata), default=0)
    if longest_key > MAX_METADATA_KEY_CHARS:
        raise _metadata_error(
            f"keys of at most {MAX_METADATA_KEY_CHARS} characters, got one of {longest_key}"
        )
    longest_value = max(map(len, metadata.values()), default=0)
    if longest_value > MAX_METADATA_VALUE_CHARS:
        raise _metadata_error(
            f"values of at most {MAX_METADATA_VALUE_CHARS} characters, got one of {longest_value}"
        )
    return metadata


def _metadata_error(what: str) -> PydanticCustomError:
    return PydanticCustomError("metadata_limit", "{what}", {"what": what})


class TextFormat(_Body):
    """``text.format``: ``text``, ``json_object``, or ``json_schema`` with its schema."""

    type: Literal["text", "json_object", "json_schema"]
    name: Annotated[str | None, AfterValidator(_check_format_name)] = None
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
    radixlm cannot honour: refused unless absent or harmless (``convert``)."""

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
    metadata: Annotated[dict[str, str] | None, AfterValidator(_check_metadata)] = None
    user: str | None = Field(default=None, max_length=MAX_USER_CHARS)
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    truncation: Literal["auto", "disabled"] | None = None  # "auto" is refused
    max_tool_calls: int | None = Field(default=None, ge=1)  # bounds built-in tools: none here
    # {"effort": ..., "summary": ...}: a budget of reasoning tokens (convert checks it)
    reasoning: Any = None
    # refused unless absent, null, false or empty
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
