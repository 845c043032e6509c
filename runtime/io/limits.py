"""What one request may cost: the engine's ``LimitsConfig`` applied to a request.

    GenerateRequest --check_request--> (stop strings, stop_regex sizes, top_logprobs_num,
                                        JSON depth)
    its built samples --check_logprob_entries--> (the entries the call's outputs hold)

Both run in the caller's thread, before anything is queued, and raise
``RequestLimitError`` naming the field and the option that bounds it.
"""

from __future__ import annotations

from collections.abc import Iterable

from radixlm.runtime.config import LimitsConfig
from radixlm.runtime.errors import RequestLimitError
from radixlm.runtime.io.messages import GenerateRequest, LogprobSpec
from radixlm.runtime.json_depth import json_depth
from radixlm.runtime.regex_size import expanded_size

__all__ = ["check_json_depth", "check_logprob_entries", "check_request", "logprob_entries"]


def check_request(request: GenerateRequest, limits: LimitsConfig) -> None:
    """Raises RequestLimitError for stop strings, top logprobs or a constraint's JSON
    past ``limits``."""
    params = request.sampling_params
    _check_stops(params.stop + params.stop_regex, limits)
    _check_stop_regex_size(params.stop_regex, limits)
    top = request.top_logprobs_num or 0
    if top > limits.max_top_logprobs_num:
        raise RequestLimitError(
            "top_logprobs_num",
            "max_top_logprobs_num",
            f"{top} alternatives per position asked; at most {limits.max_top_logprobs_num}",
        )
    spec = params.grammar
    if spec is not None and spec.kind in ("json_schema", "structural_tag"):
        check_json_depth(spec.text, spec.kind, limits)


def check_json_depth(text: str, field: str, limits: LimitsConfig) -> None:
    """Raises RequestLimitError when the JSON ``text`` of ``field`` nests too deeply."""
    depth = json_depth(text)
    if depth > limits.max_json_depth:
        raise RequestLimitError(
            field,
            "max_json_depth",
            f"JSON nested {depth} levels deep; at most {limits.max_json_depth}",
        )


def logprob_entries(spec: LogprobSpec, num_prompt_tokens: int, max_new_tokens: int) -> int:
    """The most logprob entries one sample's output can hold (0 without logprobs)."""
    if not spec.enabled:
        return 0
    prompt_positions = num_prompt_tokens - min(spec.start_len, num_prompt_tokens)
    return (prompt_positions + max_new_tokens) * (1 + spec.top_k)


def check_logprob_entries(entries: Iterable[int], limits: LimitsConfig) -> None:
    """Raises RequestLimitError when one call's samples (their ``logprob_entries``)
    together hold more than ``limits.max_logprob_entries``."""
    total = sum(entries)
    if total > limits.max_logprob_entries:
        raise RequestLimitError(
            "return_logprob",
            "max_logprob_entries",
            f"the outputs would hold up to {total} logprob entries (prompt positions and "
            f"new tokens, each with its top alternatives, over every sample); at most "
            f"{limits.max_logprob_entries}: ask for fewer positions, alternatives or tokens",
        )


def _check_stops(stops: tuple[str, ...], limits: LimitsConfig) -> None:
    longest = max(map(len, stops), default=0)
    if longest > limits.max_stop_string_chars:
        raise RequestLimitError(
            "stop",
            "max_stop_string_chars",
            f"a stop string (or stop_regex) of {longest} characters; at most "
            f"{limits.max_stop_string_chars}",
        )
    total = sum(map(len, stops))
    if total > limits.max_stop_chars:
        raise RequestLimitError(
            "stop",
            "max_stop_chars",
            f"the stop strings and stop_regex patterns hold {total} characters in all; at "
            f"most {limits.max_stop_chars}",
        )


def _check_stop_regex_size(patterns: tuple[str, ...], limits: LimitsConfig) -> None:
    """Measured before any pattern is compiled (compiling is what costs the memory)."""
    limit = limits.max_stop_regex_size
    total = 0
    for pattern in patterns:
        total += expanded_size(pattern, limit)
        if total > limit:
            raise RequestLimitError(
                "stop_regex",
                "max_stop_regex_size",
                f"the patterns expand to at least {total} positions (a counted repeat "
                f"multiplies what it repeats, through nesting); at most {limit}",
            )
