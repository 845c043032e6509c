"""The typed messages in the JSON of the native HTTP API (SGLang's ``/generate``).

A client (the DSL's ``RuntimeEndpoint``) sends ``generate_body(requests)`` and
reads each result dict back with ``output_from_dict``: the inverse of
``GenerateOutput.to_dict`` given the request it answers (the dict does not repeat
the prompt ids or the logprob options)::

    GenerateRequest(s) --generate_body--> {"input_ids": ..., "sampling_params": ...}
    {"text", "output_ids", "meta_info"} --output_from_dict(request, prompt_ids)--> GenerateOutput

Ownership: pure functions of their arguments; the server side answers with
``GenerateOutput.to_dict`` (the dicts ``Engine.generate`` returns).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from radixlm.runtime.errors import InvalidRequestError
from radixlm.runtime.io.messages import (
    FinishReason,
    GenerateOutput,
    GenerateRequest,
    LogprobSpec,
    TokenLogprob,
)

__all__ = ["generate_body", "logprob_spec", "output_from_dict"]

# LogprobSpec.start_len for "no prompt logprobs" (the request builder's value too)
_NO_PROMPT_LOGPROBS = 1 << 62


def generate_body(requests: Sequence[GenerateRequest], stream: bool = False) -> dict[str, Any]:
    """One ``/generate`` body for ``requests`` (a batch). They must agree on the
    logprob options (one body carries one set) and each give ``input_ids``.

    Raises:
        InvalidRequestError: a request gives text, or the logprob options differ.
    """
    if not requests:
        raise InvalidRequestError("no requests to send")
    first = requests[0]
    options = (first.return_logprob, first.logprob_start_len, first.top_logprobs_num)
    for r in requests:
        if r.input_ids is None:
            raise InvalidRequestError("requests sent to a server carry input_ids")
        if (r.return_logprob, r.logprob_start_len, r.top_logprobs_num) != options:
            raise InvalidRequestError("one /generate body carries one set of logprob options")
    single = len(requests) == 1
    ids = [list(r.input_ids or ()) for r in requests]
    params = [r.sampling_params.to_dict() for r in requests]
    return {
        "input_ids": ids[0] if single else ids,
        "sampling_params": params[0] if single else params,
        "return_logprob": first.return_logprob,
        "logprob_start_len": first.logprob_start_len,
        "top_logprobs_num": first.top_logprobs_num,
        "stream": stream,
    }


def logprob_spec(request: GenerateRequest) -> LogprobSpec:
    """The ``LogprobSpec`` the engine derives from a request's options."""
    start = request.logprob_start_len
    start = _NO_PROMPT_LOGPROBS if start is None or start < 0 else start
    return LogprobSpec(request.return_logprob, start, request.top_logprobs_num or 0)


def output_from_dict(
    result: Mapping[str, Any], request: GenerateRequest, index: int = 0
) -> GenerateOutput:
    """The ``GenerateOutput`` whose ``to_dict`` is ``result``, answering ``request``
    (its ``input_ids`` are the prompt) as output ``index`` of its call.

    Raises:
        InvalidRequestError: ``result`` is not a /generate result (a key is missing).
    """
    try:
        meta = result["meta_info"]
        prompt_ids = tuple(request.input_ids or ())
        spec = logprob_spec(request)
        reason = meta.get("finish_reason")
        return GenerateOutput(
            rid=str(meta["id"]),
            index=index,
            text=str(result["text"]),
            output_ids=tuple(int(t) for t in result["output_ids"]),
            finish_reason=None if reason is None else FinishReason(**reason),
            prompt_tokens=int(meta["prompt_tokens"]),
            cached_tokens=int(meta.get("cached_tokens", 0)),
            e2e_latency=float(meta.get("e2e_latency") or 0.0),
            ttft=meta.get("ttft"),
            logprob=spec,
            prompt_ids=prompt_ids,
            prompt_logprobs=_prompt_logprobs(meta, spec, len(prompt_ids)) if spec.enabled else (),
            output_logprobs=_output_logprobs(meta) if spec.enabled else (),
            grammar_warnings=tuple(str(w) for w in meta.get("grammar_warnings", ())),
            spec_verify_ct=int(meta.get("spec_verify_ct", 0)),
            spec_accepted_tokens=int(meta.get("spec_accepted_tokens", 0)),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise InvalidRequestError(f"not a /generate result ({e!r}): {dict(result)!r}") from e


def _prompt_logprobs(
    meta: Mapping[str, Any], spec: LogprobSpec, num_prompt: int
) -> tuple[tuple[int, TokenLogprob], ...]:
    """Position -> entry for the computed prompt positions (position 0 has none)."""
    start = min(spec.start_len, num_prompt)
    entries = meta.get("input_token_logprobs") or []
    tops = meta.get("input_top_logprobs") or [None] * len(entries)
    out = []
    for offset, ((lp, token, _), top) in enumerate(zip(entries, tops, strict=True)):
        if lp is not None:
            out.append((start + offset, (float(lp), int(token), _pairs(top))))
    return tuple(out)


def _output_logprobs(meta: Mapping[str, Any]) -> tuple[TokenLogprob, ...]:
    entries = meta.get("output_token_logprobs") or []
    tops = meta.get("output_top_logprobs") or [None] * len(entries)
    return tuple(
        (float(lp), int(token), _pairs(top))
        for (lp, token, _), top in zip(entries, tops, strict=True)
    )


def _pairs(top: Sequence[Sequence[Any]] | None) -> list[tuple[float, int]]:
    return [(float(lp), int(token)) for lp, token, *_ in top or ()]
