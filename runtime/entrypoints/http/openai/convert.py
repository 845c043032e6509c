"""OpenAI request bodies -> typed ``GenerateRequest``s for the engine.

    ChatCompletionRequest --(chat template)--> prompt ids --> GenerateRequest (n samples)
        tools, tool_choice --> ToolPlan --> tools in the prompt + the calls' grammar
                               (the model's ToolFormat: tools.py), its markers read
                               as text where they are special tokens
    CompletionRequest     --(tokenizer)------> prompt ids --> GenerateRequest per prompt

Field names change on the way (``max_tokens`` -> ``max_new_tokens``,
``min_tokens`` -> ``min_new_tokens``, ``response_format`` -> ``json_schema``,
``tools`` -> ``structural_tag``, vLLM's ``guided_regex`` -> ``regex``: ``constraints``);
``PARAM_NAMES``, and per call ``ConvertedCall.param_names``, map them back so an error
names the field the client sent.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from radixlm.runtime.config import LimitsConfig
from radixlm.runtime.entrypoints.http.openai.constraints import (
    Constraint,
    one_constraint,
    requested_constraints,
)
from radixlm.runtime.entrypoints.http.openai.prompts import (
    RESERVED_TEMPLATE_KWARGS,
    OutputBudget,
    PromptBuilder,
    TemplateOptions,
)
from radixlm.runtime.entrypoints.http.openai.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    SamplingExtras,
    ToolCall,
)
from radixlm.runtime.entrypoints.http.openai.tools import tool_plan_from
from radixlm.runtime.entrypoints.http.server.errors import INVALID, APIError, api_error_from
from radixlm.runtime.errors import GrammarError
from radixlm.runtime.io.limits import check_json_depth
from radixlm.runtime.io.messages import GenerateRequest
from radixlm.runtime.io.sampling_fields import SamplingField, Surface, fields_on
from radixlm.runtime.io.sampling_params import SamplingParams
from radixlm.runtime.reasoning.effort import effort_budget
from radixlm.runtime.tools.format import ToolFormat
from radixlm.runtime.tools.parser import ToolCallParser
from radixlm.runtime.tools.plan import ToolPlan

__all__ = ["PARAM_NAMES", "ConvertedCall", "chat_call", "completion_call"]

# engine field -> the OpenAI field it came from, for error messages' `param`
PARAM_NAMES = {
    **{
        spec.name: spec.names_on("completions")[0]
        for spec in fields_on("completions")
        if spec.names_on("completions")[0] != spec.name
    },
    "json_schema": "response_format",
    "structural_tag": "tools",
    "lark": "tools",
    "top_logprobs_num": "top_logprobs",
}
DEFAULT_LIMITS = LimitsConfig()


@dataclass(frozen=True)
class ConvertedCall:
    """What one HTTP request asks of the engine: its requests (each prompt's ``n``
    samples come out together, in order), whether it streams, for completions
    each prompt's text (what ``echo`` repeats), for chat the tool plan (None: no
    tools) and the parser of its outputs' calls (None: no tools, or choice "none"),
    and the names an error's ``param`` takes (engine field -> the client's)."""

    requests: tuple[GenerateRequest, ...]
    num_prompts: int
    n: int
    stream: bool
    prompt_texts: tuple[str, ...] = ()
    tools: ToolPlan | None = None
    tool_parser: ToolCallParser | None = None
    param_names: Mapping[str, str] = field(default_factory=lambda: MappingProxyType(PARAM_NAMES))

    @property
    def num_samples(self) -> int:
        return self.num_prompts * self.n


def chat_call(
    body: ChatCompletionRequest, prompts: PromptBuilder, limits: LimitsConfig = DEFAULT_LIMITS
) -> ConvertedCall:
    """Raises APIError (400) for anything the engine would refuse, RequestLimitError
    for a tool call's arguments nested deeper than ``limits.max_json_depth``."""
    _check_common(body)
    plan = tool_plan_from(body)
    fmt = prompts.tool_calling.format_for(body.tool_call_parser)
    found = requested_constraints(body)
    constraint = None if plan is None else _tool_constraint(plan, prompts, fmt)
    if constraint is not None:
        _check_no_other_constraint(constraint, found, plan)
    else:
        constraint = one_constraint(found)
    names = _param_names(constraint)
    shown = [t.to_openai() for t in plan.tools] if plan and plan.calls_allowed else []
    messages = [_message_dict(m, f"messages[{i}]", limits) for i, m in enumerate(body.messages)]
    requested = body.max_completion_tokens if body.max_completion_tokens is not None else None
    requested = body.max_tokens if requested is None else requested
    param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    budget = OutputBudget(requested, param)
    prompt_ids = prompts.chat_ids(messages, shown, _template_options(body), fmt, budget)
    max_new = prompts.max_new_tokens(len(prompt_ids), requested, param)
    if body.top_logprobs and not body.logprobs:
        raise APIError(INVALID, "top_logprobs needs logprobs: true", "top_logprobs")
    route_fields = _reasoning_budget(body, prompts.reasons)
    if plan is not None and plan.calls_allowed and fmt.tokens:
        # the format's markers a tokenizer makes special tokens: the grammar writes them,
        # the output text keeps them for the parser (which takes them out of content)
        route_fields["special_tokens_as_text"] = fmt.tokens
    params = _sampling_params(body, max_new, constraint, names, route_fields)
    request = GenerateRequest(
        input_ids=prompt_ids,
        sampling_params=params,
        return_logprob=body.logprobs,
        top_logprobs_num=body.top_logprobs or 0,
        stream=body.stream,
    )
    parser = ToolCallParser(fmt, plan.tools) if plan and plan.calls_allowed else None
    return ConvertedCall(
        (request,), 1, params.n, body.stream, tools=plan, tool_parser=parser, param_names=names
    )


def _tool_constraint(plan: ToolPlan, prompts: PromptBuilder, fmt: ToolFormat) -> Constraint | None:
    """The grammar of ``plan``'s calls; an arguments schema the backend refuses is a 400
    naming ``tools``."""
    try:
        return prompts.tool_calling.constraint(plan, fmt)
    except GrammarError as e:
        raise api_error_from(e, {e.field: "tools"}) from e


def _check_no_other_constraint(tools: Constraint, found: list[Constraint], plan: ToolPlan) -> None:
    """Tool calls are enforced by a grammar of their own: a second constraint is a 400
    naming it (the one rule: ``one_constraint``)."""
    one_constraint([replace(tools, param=f"tools under tool_choice {plan.choice!r}"), *found])


def _param_names(constraint: Constraint | None) -> Mapping[str, str]:
    """PARAM_NAMES, with the constraint's engine field named as the client named it."""
    if constraint is None:
        return MappingProxyType(PARAM_NAMES)
    return MappingProxyType({**PARAM_NAMES, constraint.field: constraint.param})


def _template_options(body: ChatCompletionRequest) -> TemplateOptions:
    """vLLM's and SGLang's template fields. Raises APIError (400): both
    ``continue_final_message`` and ``add_generation_prompt``, or a template variable
    that is one of apply_chat_template's own arguments."""
    continue_final = bool(body.continue_final_message)
    add_prompt = body.add_generation_prompt
    if continue_final and add_prompt:
        raise APIError(
            INVALID,
            "continue_final_message continues the last message: it needs "
            "add_generation_prompt false (or left out)",
            "continue_final_message",
        )
    kwargs = dict(body.chat_template_kwargs or {})
    for key in kwargs:
        if key in RESERVED_TEMPLATE_KWARGS:
            message = f"{key!r} is set by the request itself, not as a template variable"
            raise APIError(INVALID, message, f"chat_template_kwargs.{key}")
    if body.documents is not None:
        kwargs["documents"] = body.documents
    if body.reasoning_effort is not None:
        kwargs.setdefault("reasoning_effort", body.reasoning_effort)
    return TemplateOptions(
        add_generation_prompt=not continue_final if add_prompt is None else add_prompt,
        continue_final_message=continue_final,
        template_kwargs=kwargs,
        add_special_tokens=bool(body.add_special_tokens),
    )


def _message_dict(message: ChatMessage, where: str, limits: LimitsConfig) -> dict[str, Any]:
    """A message as chat templates read it; a call's arguments parsed back to an object
    (what templates expect) when they are JSON, else kept as the client's text."""
    out: dict[str, Any] = {"role": message.role, "content": message.text()}
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {
                    "name": call.function.name,
                    "arguments": _arguments(
                        call, f"{where}.tool_calls[{j}].function.arguments", limits
                    ),
                },
            }
            for j, call in enumerate(message.tool_calls)
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        out["name"] = message.name
    return out


def _arguments(call: ToolCall, where: str, limits: LimitsConfig) -> Any:
    check_json_depth(call.function.arguments, where, limits)
    try:
        return json.loads(call.function.arguments)
    except json.JSONDecodeError:
        return call.function.arguments


def completion_call(body: CompletionRequest, prompts: PromptBuilder) -> ConvertedCall:
    """Raises APIError (400) for anything the engine would refuse."""
    _check_common(body)
    constraint = one_constraint(requested_constraints(body))
    names = MappingProxyType({**_param_names(constraint), "top_logprobs_num": "logprobs"})
    requests = []
    add_special = body.add_special_tokens is not False
    all_ids = _prompt_ids(body.prompt, prompts, OutputBudget(body.max_tokens), add_special)
    for ids in all_ids:
        max_new = prompts.max_new_tokens(len(ids), body.max_tokens, "max_tokens")
        wants_logprobs = body.logprobs is not None
        request = GenerateRequest(
            input_ids=ids,
            sampling_params=_sampling_params(body, max_new, constraint, names),
            return_logprob=wants_logprobs,
            # echo with logprobs reports the prompt's too (its first token has none)
            logprob_start_len=0 if wants_logprobs and body.echo else None,
            top_logprobs_num=body.logprobs or 0,
            stream=body.stream,
        )
        requests.append(request)
    texts = _prompt_texts(body.prompt, all_ids, prompts)
    return ConvertedCall(
        tuple(requests),
        len(requests),
        requests[0].sampling_params.n,
        body.stream,
        texts,
        param_names=names,
    )


def _check_common(body: SamplingExtras) -> None:
    if body.logit_bias:
        raise APIError(INVALID, "logit_bias is not supported by this server", "logit_bias")
    if body.stream_options is not None and not body.stream:
        raise APIError(INVALID, "stream_options needs stream: true", "stream_options")


def _prompt_ids(
    prompt: Any, prompts: PromptBuilder, budget: OutputBudget, add_special_tokens: bool = True
) -> list[tuple[int, ...]]:
    """A str, a list of str, a list of token ids, or a list of lists of them; each one
    refused (``context_length_exceeded``) before it is tokenized or read through when
    it certainly leaves no room for ``budget``."""
    if isinstance(prompt, str):
        return [prompts.text_ids(prompt, "prompt", add_special_tokens, budget)]
    if not prompt:
        raise APIError(INVALID, "prompt is an empty list", "prompt")
    if all(isinstance(p, str) for p in prompt):
        return [
            prompts.text_ids(p, f"prompt[{i}]", add_special_tokens, budget)
            for i, p in enumerate(prompt)
        ]
    if all(isinstance(p, int) for p in prompt):
        return [_checked_ids(prompt, "prompt", prompts, budget)]
    for i, ids in enumerate(prompt):
        if not ids:
            raise APIError(INVALID, f"prompt[{i}] is an empty list of token ids", "prompt")
    return [_checked_ids(ids, f"prompt[{i}]", prompts, budget) for i, ids in enumerate(prompt)]


def _checked_ids(
    ids: list[int], where: str, prompts: PromptBuilder, budget: OutputBudget
) -> tuple[int, ...]:
    """Token ids this tokenizer can read back (the prompt's text is decoded from them)."""
    prompts.max_new_tokens(len(ids), budget.requested, budget.param)  # its length first
    vocab_size = len(prompts.tokenizer)
    for j, token in enumerate(ids):
        if not 0 <= token < vocab_size:
            message = f"{where}[{j}] holds {token}: token ids must be ints in [0, {vocab_size})"
            raise APIError(INVALID, message, "prompt")
    return tuple(ids)


def _prompt_texts(
    prompt: Any, all_ids: list[tuple[int, ...]], prompts: PromptBuilder
) -> tuple[str, ...]:
    if isinstance(prompt, str):
        return (prompt,)
    if all(isinstance(p, str) for p in prompt):
        return tuple(prompt)
    return tuple(prompts.tokenizer.decode(list(ids)) for ids in all_ids)


def _reasoning_budget(body: ChatCompletionRequest, reasons: bool) -> dict[str, Any]:
    """``max_reasoning_tokens`` from ``reasoning_effort`` (radixlm.runtime.reasoning.effort),
    for an engine with a reasoning parser (``reasons``) and a request that does not give
    the budget itself; empty otherwise (an engine without a parser has nothing to bound:
    the effort only reaches the template). Raises APIError (400): an unknown effort."""
    effort = body.reasoning_effort
    if effort is None:
        return {}
    try:
        budget = effort_budget(effort)
    except ValueError as e:
        raise APIError(INVALID, str(e), "reasoning_effort") from e
    if not reasons or body.max_reasoning_tokens is not None:
        return {}
    return {"max_reasoning_tokens": budget}


def _sampling_params(
    body: SamplingExtras,
    max_new_tokens: int,
    constraint: Constraint | None,
    param_names: Mapping[str, str],
    extra: Mapping[str, Any] = MappingProxyType({}),
) -> SamplingParams:
    """extra: fields the route sets itself, beside the client's (the client's win)."""
    fields: dict[str, Any] = {"max_new_tokens": max_new_tokens, **extra}
    if constraint is not None:
        fields.update(constraint.as_fields())
    for spec in _passed_on(body.surface):
        value = _first_set(body, spec.names_on(body.surface))
        if value is not None:
            fields[spec.name] = value
    try:
        return SamplingParams(**fields)
    except ValueError as e:
        raise api_error_from(e, dict(param_names)) from e


def _passed_on(surface: Surface) -> tuple[SamplingField, ...]:
    """The table's fields a route hands to SamplingParams as the client gave them: all
    it exposes but the output budget (``PromptBuilder.max_new_tokens`` sets it) and the
    constraints (``constraints`` maps them)."""
    return tuple(
        spec
        for spec in fields_on(surface)
        if spec.kind != "grammar" and spec.name != "max_new_tokens"
    )


def _first_set(body: SamplingExtras, names: tuple[str, ...]) -> Any:
    """The value of the first of ``names`` the body sets (``no_stop_trim`` before vLLM's
    ``include_stop_str_in_output``); None when it sets none."""
    for name in names:
        value = getattr(body, name)
        if value is not None:
            return value
    return None
