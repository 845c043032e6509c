"""Field names other servers define, accepted on radixlm's routes: honoured or ignored.

Clients written for vLLM or SGLang, and the gateways in front of them (SGLang's router,
LiteLLM), send fields OpenAI's API lacks. radixlm's request models stay closed, so a
misspelt field is still a 400 naming it, but a name one of those servers defines on the
same route is accepted, as one of:

    honoured     declared on the request model and acted on (see the converters)
    ignored      accepted whatever its value and named in a debug log ("radixlm.http"):
                 it cannot change the text generated (a routing or scheduling hint, an
                 id, a request for extra output whose absence the client can see)
    unsupported  accepted while it asks for nothing (null, false, empty; ``best_of`` 1);
                 any other value is a 400 naming it, because ignoring it would silently
                 change what is generated (an adapter, beam search, a logits processor)

The lists were read off SGLang's ``ChatCompletionRequest`` / ``CompletionRequest``
(``entrypoints/openai/protocol.py``), ``GenerateReqInput`` (``managers/io_struct.py``) and
``SamplingParams`` (``sampling/sampling_params.py``), and vLLM's ``ChatCompletionRequest`` /
``CompletionRequest`` (``entrypoints/openai/protocol.py``, before and after 0.11 dropped
``guided_*``). Fields of theirs for features radixlm has no notion of at all (images,
audio, embeddings as input) are ``unsupported``; their internal IPC fields are not listed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError
from typing_extensions import Self

from radixlm.runtime.entrypoints.http.server.errors import INVALID, APIError
from radixlm.runtime.errors import InvalidSamplingParamsError
from radixlm.runtime.io.sampling_fields import SAMPLING_FIELDS, sampling_field

__all__ = [
    "CHAT",
    "COMPLETIONS",
    "GENERATE",
    "SAMPLING_PARAMS",
    "AcceptsForeignFields",
    "RouteFields",
    "screen",
    "screen_sampling_params",
]

logger = logging.getLogger("radixlm.http")


@dataclass(frozen=True)
class RouteFields:
    """The foreign names one route (or ``/generate``'s ``sampling_params``) accepts.

    Invariant: the three groups are disjoint. ``unsupported`` maps a name to what radixlm
    lacks, for the 400 a value asking for it gets.
    """

    route: str
    honoured: frozenset[str] = frozenset()
    ignored: frozenset[str] = frozenset()
    unsupported: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        overlap = (
            (self.honoured & self.ignored)
            | (self.honoured & set(self.unsupported))
            | (self.ignored & set(self.unsupported))
        )
        if overlap:
            raise ValueError(f"{self.route}: {sorted(overlap)} are listed twice")

    @property
    def accepted(self) -> frozenset[str]:
        return self.honoured | self.ignored | frozenset(self.unsupported)


# --- /v1/chat/completions and /v1/completions -------------------------------------------

# vLLM's structured-output spellings: mapped onto radixlm's constraints (constraints.py).
_VLLM_CONSTRAINTS = frozenset(
    {
        "structured_outputs",  # vLLM >= 0.10.2: {json|regex|choice|grammar|json_object|...}
        "guided_json",  # vLLM <= 0.11 (LiteLLM's vLLM provider still sends it): json_schema
        "guided_regex",  # vLLM <= 0.11: regex
        "guided_choice",  # vLLM <= 0.11: choices
        "guided_grammar",  # vLLM <= 0.11: ebnf, or lark without a "::=" rule
    }
)
_SHARED_HONOURED = _VLLM_CONSTRAINTS | {
    "stop_regex",  # SGLang: SamplingParams.stop_regex
    "add_special_tokens",  # vLLM: tokenize the prompt with BOS & co. (chat False, else True)
    "include_stop_str_in_output",  # vLLM: radixlm's no_stop_trim
    "spaces_between_special_tokens",  # vLLM: SamplingParams' own field
}
_SHARED_IGNORED = frozenset(
    {
        "guided_decoding_backend",  # vLLM <= 0.11: the server picks the grammar backend
        "guided_whitespace_pattern",  # vLLM <= 0.11: JSON is always compact here
        "request_id",  # vLLM: request ids come from the engine (random, unguessable)
        "rid",  # SGLang: same
        "priority",  # vLLM, SGLang: one queue, first come first served
        "session_id",  # SGLang: a label; it does not change the prompt
        "length_penalty",  # vLLM: beam search only
        "prompt_logprobs",  # vLLM: the answer has no prompt_logprobs
        "return_tokens_as_token_ids",  # vLLM: logprob tokens stay text
        "return_token_ids",  # vLLM, SGLang: the answer has no token_ids
        "return_hidden_states",  # SGLang: the answer has no hidden states
        "return_routed_experts",  # SGLang: no MoE routing to report
        "routed_experts_start_len",  # SGLang: with return_routed_experts
        "return_cached_tokens_details",  # SGLang: usage has no cache breakdown
        "kv_transfer_params",  # vLLM: disaggregated prefill; one process here
        "vllm_xargs",  # vLLM: arguments for vLLM's plugins
        "custom_params",  # SGLang: arguments for a custom logit processor (refused below)
        "custom_labels",  # SGLang: metric labels
        "bootstrap_host",  # SGLang: prefill/decode disaggregation
        "bootstrap_port",  # SGLang: same
        "bootstrap_room",  # SGLang: same
        "routed_dp_rank",  # SGLang: data-parallel routing; one engine here
        "data_parallel_rank",  # SGLang: same (its router's dp-aware mode adds it)
        "disagg_prefill_dp_rank",  # SGLang: same
        "images_config",  # SGLang: image processing; no images here
        "ngram_corpus_id",  # SGLang: n-gram speculative decoding corpus
    }
)
_SHARED_UNSUPPORTED = {
    "use_beam_search": "beam search",  # vLLM
    "allowed_token_ids": "token allow-lists",  # vLLM
    "logits_processors": "custom logits processors",  # vLLM
    "custom_logit_processor": "custom logits processors",  # SGLang
    "truncate_prompt_tokens": "prompt truncation",  # vLLM
    "cache_salt": "prefix-cache isolation per salt",  # vLLM, SGLang
    "extra_key": "prefix-cache isolation per key",  # SGLang
    "lora_path": "LoRA adapters",  # SGLang
    "session_params": "sessions (continuing an earlier request's context)",  # SGLang
}

CHAT = RouteFields(
    "/v1/chat/completions",
    honoured=_SHARED_HONOURED
    | {
        "structural_tag",  # vLLM 0.8-0.10: xgrammar's structural tag, as JSON text
        "continue_final_message",  # vLLM, SGLang: the reply continues the last message
        "add_generation_prompt",  # vLLM: the template's assistant header (default true)
        "chat_template_kwargs",  # vLLM, SGLang: extra variables for the template
        "separate_reasoning",  # SGLang: false keeps the reasoning in the content
        "include_reasoning",  # vLLM: false leaves reasoning_content out
        "documents",  # vLLM: the template's RAG documents
        "reasoning_effort",  # OpenAI, vLLM, SGLang: a reasoning budget and template variable
    },
    ignored=_SHARED_IGNORED
    | {
        "metadata",  # OpenAI: stored completions' tags; nothing is stored
        "store",  # OpenAI: same
        "service_tier",  # OpenAI: one tier
        "prompt_cache_key",  # OpenAI: the radix cache finds shared prefixes itself
        "safety_identifier",  # OpenAI: abuse monitoring
        "stream_reasoning",  # SGLang: reasoning_content is always streamed as it comes
        "mm_processor_kwargs",  # vLLM: multimodal processor; text only here
        "return_prompt_token_ids",  # SGLang: the answer has no prompt_token_ids
        "return_meta_info",  # SGLang: the answer has no meta_info
        "max_dynamic_patch",  # SGLang: image tiling
        "min_dynamic_patch",  # SGLang: same
        "use_audio_in_video",  # SGLang: video input
    },
    unsupported={
        **_SHARED_UNSUPPORTED,
        "echo": "echoing the last message in the reply",  # vLLM (chat's own meaning)
        "bad_words": "bad-word lists",  # vLLM
        "chat_template": "a chat template per request",  # vLLM
        "input_ids": "pre-tokenized chat prompts",  # SGLang: would bypass the template
    },
)

COMPLETIONS = RouteFields(
    "/v1/completions",
    honoured=_SHARED_HONOURED
    | {
        "response_format",  # vLLM, SGLang: as on chat
        "json_schema",  # SGLang: a JSON schema (text or object)
    },
    ignored=_SHARED_IGNORED,
    unsupported={
        **_SHARED_UNSUPPORTED,
        "best_of": "best_of above 1 (ranking samples)",  # OpenAI (legacy), vLLM, SGLang
        "prompt_embeds": "prompt embeddings as input",  # vLLM
    },
)

# --- /generate (SGLang's GenerateReqInput) -----------------------------------------------

GENERATE = RouteFields(
    "/generate",
    honoured=frozenset(
        {
            "no_logs",  # SGLang: the prompt and output are not logged (--log-requests)
        }
    ),
    ignored=frozenset(
        {
            "model",  # SGLang's router adds it to what it forwards; one model here
            "rid",  # request ids come from the engine: random, so no client can abort
            # another's by guessing (meta_info.id says which one it got)
            "session_id",  # a label; it does not change the prompt
            "priority",  # one queue, first come first served
            "log_metrics",  # every request is counted
            "custom_labels",  # metric labels
            "return_hidden_states",  # the answer has no hidden states
            "return_routed_experts",  # no MoE routing to report
            "routed_experts_start_len",  # with return_routed_experts
            "return_entropy",  # the answer has no entropy
            "return_bytes",  # image generation's raw bytes; text only here (the router sends it)
            "return_prompt_token_ids",  # the answer has no prompt ids
            "token_ids_logprob",  # the answer has no logprobs for chosen ids
            "bootstrap_host",  # prefill/decode disaggregation
            "bootstrap_port",  # same
            "bootstrap_room",  # same
            "bootstrap_pair_key",  # same
            "decode_tp_size",  # same
            "routed_dp_rank",  # data-parallel routing; one engine here
            "data_parallel_rank",  # same (its router's dp-aware mode adds it)
            "disagg_prefill_dp_rank",  # same
            "kv_router_hint",  # same, for a KV-aware router
            "routing_key",  # same
            "conversation_id",  # a label for tracking
            "background",  # the Responses API's; /generate always answers
            "require_reasoning",  # hybrid reasoning models
            "max_thinking_tokens",  # same
            "max_dynamic_patch",  # image tiling
            "min_dynamic_patch",  # same
            "use_audio_in_video",  # video input
        }
    ),
    unsupported={
        "input_embeds": "embeddings as input",
        "image_data": "image input",
        "video_data": "video input",
        "audio_data": "audio input",
        "modalities": "image and video input",
        "lora_path": "LoRA adapters",
        "lora_id": "LoRA adapters",
        "custom_logit_processor": "custom logits processors",
        "session_params": "sessions (continuing an earlier request's context)",
        "cache_salt": "prefix-cache isolation per salt",
        "extra_key": "prefix-cache isolation per key",
    },
)

# /generate's other names for a sampling field (the sampling table's "generate" names
# past the field's own: SGLang's sampling_seed for seed, ...) -> the field
GENERATE_ALIASES: Mapping[str, str] = {
    alias: spec.name
    for spec in SAMPLING_FIELDS
    for alias in spec.names_on("generate")
    if alias != spec.name
}

# Keys of /generate's sampling_params that SGLang's SamplingParams has and radixlm's lacks.
SAMPLING_PARAMS = RouteFields(
    "sampling_params",
    honoured=frozenset(GENERATE_ALIASES),  # renamed to their fields
    ignored=frozenset(
        {
            "stream_interval",  # every token is streamed
            "custom_params",  # arguments for a custom logit processor (none here)
        }
    ),
    unsupported={"logit_bias": "logit biases"},  # as on the OpenAI routes
)

# A value that asks for nothing, beyond null, false and empty ones.
_NO_OP_VALUES: dict[str, Any] = {"best_of": 1}
# What an unsupported field's value must be at all (else a 400 saying so, not one about
# the feature it would ask for): best_of counts samples, so 0 asks for no ranking at all.
_DOMAINS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "best_of": (lambda v: type(v) is int and v >= 1, "an integer >= 1 (1, the default, is served)"),
}


def asks_for_nothing(name: str, value: Any) -> bool:
    """Whether an unsupported field's value leaves the request as if it were absent."""
    if value is None or value is False:
        return True
    if isinstance(value, (str, list, dict)) and not value:
        return True
    no_op = _NO_OP_VALUES.get(name)
    return no_op is not None and type(value) is type(no_op) and value == no_op


def screen(fields: RouteFields, extras: Mapping[str, Any]) -> None:
    """Checks the fields a body holds beyond its model's own; logs the ignored ones.

    Raises:
        ValidationError: a name ``fields`` does not accept (``extra_forbidden``, as a
            closed model refuses it), or an unsupported field that asks for something.
    """
    errors = [_error(fields, name, value) for name, value in extras.items()]
    errors = [e for e in errors if e is not None]
    if errors:
        raise ValidationError.from_exception_data(fields.route, errors)
    if extras:
        logger.debug("%s: ignored fields of other servers: %s", fields.route, sorted(extras))


def _error(fields: RouteFields, name: str, value: Any) -> InitErrorDetails | None:
    if name in fields.ignored:
        return None
    if name not in fields.unsupported:
        return InitErrorDetails(type="extra_forbidden", loc=(name,), input=value)
    if asks_for_nothing(name, value):
        return None
    domain = _DOMAINS.get(name)
    if domain is not None and not domain[0](value):
        error = PydanticCustomError(
            "invalid_value",
            "must be {domain}, got {value}",
            {"domain": domain[1], "value": repr(value)[:64]},
        )
        return InitErrorDetails(type=error, loc=(name,), input=value)
    message = "{what} are not supported by this server; leave {name} out or send null"
    error = PydanticCustomError(
        "unsupported", message, {"what": fields.unsupported[name], "name": name}
    )
    return InitErrorDetails(type=error, loc=(name,), input=value)


class AcceptsForeignFields(BaseModel):
    """A top-level request body that takes the foreign names its ``foreign_fields`` lists
    besides its own fields; any other name is refused as a closed model refuses it.

    Subclasses set ``foreign_fields``; the default accepts none.
    """

    model_config = ConfigDict(extra="allow", strict=True, populate_by_name=True)
    foreign_fields: ClassVar[RouteFields] = RouteFields("body")

    @model_validator(mode="after")
    def _screen_foreign_fields(self) -> Self:
        # An "after" validator: a "before" one would switch the fields' validation from
        # JSON mode to Python mode, where strict pydantic refuses a JSON array for a tuple.
        screen(self.foreign_fields, self.__pydantic_extra__ or {})
        return self


def screen_sampling_params(params: Any) -> Any:
    """``/generate``'s ``sampling_params`` (a dict or a list of them) with the names
    radixlm's fields lack handled: an alias (``GENERATE_ALIASES``: ``sampling_seed``,
    ``min_tokens``, ...) becomes its field; ``stream_interval`` and ``custom_params`` are
    dropped (debug log); ``logit_bias`` is dropped while empty. Other keys pass on
    (``SamplingParams.from_dict`` refuses a name no server knows).

    Raises:
        APIError (400): ``logit_bias`` with biases, an alias next to its field, or an
            alias's value its field refuses.
    """
    if isinstance(params, list):
        return [_screen_one(p, f"sampling_params.{i}") for i, p in enumerate(params)]
    return _screen_one(params, "sampling_params")


def _screen_one(params: Any, where: str) -> Any:
    if not isinstance(params, dict) or not set(params) & SAMPLING_PARAMS.accepted:
        return params
    out = dict(params)
    for name in sorted(set(out) & SAMPLING_PARAMS.accepted):
        value = out.pop(name)
        if name in SAMPLING_PARAMS.unsupported and not asks_for_nothing(name, value):
            what = SAMPLING_PARAMS.unsupported[name]
            raise APIError(INVALID, f"{where}.{name}: {what} are not supported", f"{where}.{name}")
        if name in GENERATE_ALIASES and value is not None:
            field_name = GENERATE_ALIASES[name]
            out[field_name] = _aliased(name, value, out.get(field_name), f"{where}.{name}")
    logger.debug("%s: SGLang's keys ignored or renamed: %s", where, sorted(set(params) - set(out)))
    return out


def _aliased(alias: str, value: Any, field_value: Any, param: str) -> Any:
    """``value`` given under ``alias``, checked as its field checks it."""
    name = GENERATE_ALIASES[alias]
    if field_value is not None:
        raise APIError(INVALID, f"{param}: give {alias} or {name}, not both", param)
    try:
        sampling_field(name).check(value, "generate")
    except InvalidSamplingParamsError as e:
        raise APIError(INVALID, f"{param}: {e.reason}", param) from e
    return value
