"""OpenAI's request and response bodies, as pydantic models (the HTTP edge only).

Requests are strict about types (``"0.5"`` is not a temperature) and refuse
unknown fields, so a misspelt option is a 400 naming it rather than silently
ignored. Beyond OpenAI's fields, requests take every sampling field the sampling table
(``runtime/io/sampling_fields``) names on these routes (``top_k``, ``min_p``,
``min_tokens``, ``repetition_penalty``, ``ignore_eos``, ``stop_token_ids``, ...: declared
there once, made into fields here) and radixlm's (SGLang's) constraints: ``regex``,
``ebnf``, ``lark``, ``choices``. Chat requests take OpenAI's ``tools``, ``tool_choice``
and ``parallel_tool_calls`` (checked further by ``tools.tool_plan_from``). The names vLLM's and
SGLang's servers define on these routes are accepted too (``compat/fields.py`` lists them:
some honoured and declared here, the rest ignored or accepted only while unset), among
them vLLM's ``structured_outputs`` and ``guided_*`` (``constraints`` maps them). The
converters (``convert``) turn them into ``GenerateRequest``s; nothing past them
sees these models.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from radixlm.runtime.entrypoints.http.compat.fields import (
    CHAT,
    COMPLETIONS,
    AcceptsForeignFields,
)
from radixlm.runtime.entrypoints.http.openai.sampling_bounds import OPENAI, SamplingBound
from radixlm.runtime.io.sampling_fields import SAMPLING_FIELDS, Surface

__all__ = [
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "FunctionDefinition",
    "NamedToolChoice",
    "ResponseFormat",
    "SamplingExtras",
    "StreamOptions",
    "StructuredOutputs",
    "ToolCall",
    "ToolDefinition",
]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class TextPart(_Body):
    type: Literal["text"]
    text: str


class FunctionCall(_Body):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(_Body):
    """A call an earlier assistant message made (the conversation's history)."""

    id: str
    type: Literal["function"]
    function: FunctionCall


class ChatMessage(_Body):
    """One message; ``content`` may be a list of text parts (joined in order).
    ``tool_calls``: an assistant's calls; ``tool_call_id``: which call a tool
    message answers."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(_Body):
    include_usage: bool = False
    continuous_usage_stats: bool | None = None  # vLLM's, SGLang's: ignored


class JsonSchemaFormat(_Body):
    name: str
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class FunctionDefinition(_Body):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; None: no arguments
    strict: bool | None = None  # calls are enforced by constrained decoding either way


class ToolDefinition(_Body):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: FunctionName


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(_Body):
    """vLLM's ``structured_outputs``: at most one constraint (``json``, ``regex``, ``choice``,
    ``grammar``, ``json_object``, ``structural_tag``) and options (see ``constraints``)."""

    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: dict[str, Any] | str | None = None
    disable_any_whitespace: bool | None = None  # holds: JSON is generated compact
    disable_fallback: bool | None = None  # holds: no backend falls back to another
    disable_additional_properties: bool | None = None  # ignored
    whitespace_pattern: str | None = None  # ignored


# The body type of each kind of sampling field (the table's kinds; grammars and options
# have bodies of their own, below)
_KIND_TYPES: dict[str, Any] = {
    "float": float,
    "int": int,
    "bool": bool,
    "strings": str | list[str],
    "token_ids": list[int],
}


def _table_fields() -> dict[str, Any]:
    """The sampling table's fields that chat and completions take under the same names,
    each name a field of that kind, None for the default (``n``: 1, as OpenAI), bounded
    by the table's own check (``SamplingBound``): a field added to the table with
    ``openai=`` names is on both bodies, and ``convert`` reads it by the table."""
    fields: dict[str, Any] = {}
    for spec in SAMPLING_FIELDS:
        names = spec.names_on("chat")
        if spec.kind not in _KIND_TYPES or not names or names != spec.names_on("completions"):
            continue
        kind = Annotated[_KIND_TYPES[spec.kind] | None, SamplingBound(spec.name, OPENAI)]
        fields.update((name, (kind, None)) for name in names)
    return fields


_TableFields = create_model("_TableFields", __base__=AcceptsForeignFields, **_table_fields())


class SamplingExtras(_TableFields):  # type: ignore[misc, valid-type]
    """The fields chat and completions share: the sampling table's (above), OpenAI's
    stream options, radixlm's constraints and the other servers' that radixlm honours
    (``compat/fields.py``). ``surface``: the sampling table's name for the route
    (``runtime/io/sampling_fields``)."""

    surface: ClassVar[Surface] = "completions"

    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    logit_bias: dict[str, float] | None = None
    # radixlm / SGLang constraints
    regex: str | None = None
    ebnf: str | None = None
    lark: str | None = None
    choices: list[str] | None = None
    # vLLM's and SGLang's (compat/fields.py: honoured)
    add_special_tokens: bool | None = None  # None: chat False, completions True
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None


_CHAT_MAX_TOKENS = SamplingBound("max_new_tokens", ("chat",))


class ChatCompletionRequest(SamplingExtras):
    foreign_fields = CHAT
    surface = "chat"

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Annotated[int | None, _CHAT_MAX_TOKENS] = None
    max_completion_tokens: Annotated[int | None, _CHAT_MAX_TOKENS] = None
    logprobs: bool = False
    # at most LimitsConfig.max_top_logprobs_num (20, OpenAI's cap), checked with the others
    top_logprobs: int | None = Field(default=None, ge=0)
    response_format: ResponseFormat | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    tool_call_parser: str | None = None  # radixlm: this request's tool-call format
    # vLLM's and SGLang's (compat/fields.py: honoured)
    structural_tag: dict[str, Any] | str | None = None
    continue_final_message: bool | None = None
    add_generation_prompt: bool | None = None  # None: not continue_final_message
    chat_template_kwargs: dict[str, Any] | None = None
    documents: list[dict[str, Any]] | None = None
    separate_reasoning: bool | None = None  # SGLang's; None: true (reasoning_content)
    include_reasoning: bool | None = None  # vLLM's; false: the reasoning is left out
    # OpenAI's: a reasoning budget (radixlm.runtime.reasoning.effort) and a template variable
    reasoning_effort: str | None = None


class CompletionRequest(SamplingExtras):
    foreign_fields = COMPLETIONS
    surface = "completions"

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: Annotated[int | None, SamplingBound("max_new_tokens", ("completions",))] = 16
    logprobs: int | None = Field(default=None, ge=0)  # at most max_top_logprobs_num
    echo: bool = False
    suffix: None = None  # accepted only when absent or null: insertion is not served
    # vLLM's and SGLang's (compat/fields.py: honoured)
    response_format: ResponseFormat | None = None
    json_schema: dict[str, Any] | str | None = None
