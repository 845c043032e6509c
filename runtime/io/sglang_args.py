"""The argument checks of SGLang's ``generate(prompt, sampling_params, input_ids, ...)``:
prompts, token ids, sampling-parameter dicts and logprob options, each into its typed
form (``GenerateRequest``, ``SamplingParams``, ``LogprobSpec``) or a named error.

Pure functions of their arguments (and the vocabulary's size): the request builder
calls them in the caller's context, before anything is tokenized.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from radixlm.runtime.errors import InvalidRequestError
from radixlm.runtime.io.messages import GenerateRequest, LogprobSpec
from radixlm.runtime.io.sampling_params import SamplingParams

__all__ = [
    "check_bool",
    "check_ids",
    "check_texts",
    "logprob_spec",
    "requests_of",
    "sampling_params_of",
]


def requests_of(
    prompt: str | Sequence[str] | None,
    sampling_params: dict | Sequence[dict] | None,
    input_ids: Any,
    return_logprob: bool,
    logprob_start_len: int | None,
    top_logprobs_num: int | None,
    stream: bool,
    vocab_size: int,
) -> tuple[list[GenerateRequest], bool]:
    """``generate``'s SGLang-shaped arguments as one ``GenerateRequest`` per prompt, and
    whether the call had a single prompt (its result is then not a list).

    Raises:
        InvalidRequestError: the arguments' shapes or types are wrong.
    """
    if (prompt is None) == (input_ids is None):
        raise InvalidRequestError("pass exactly one of `prompt` and `input_ids`")
    texts: list[str] | None = None
    ids: list[tuple[int, ...]] | None = None
    if prompt is not None:
        texts, single = check_texts(prompt), isinstance(prompt, str)
        num_prompts = len(texts)
    else:
        ids, single = check_ids(input_ids, vocab_size)
        num_prompts = len(ids)
    params = sampling_params_of(sampling_params, num_prompts)
    check_bool("stream", stream)
    return [
        GenerateRequest(
            text=texts[i] if texts is not None else None,
            input_ids=ids[i] if ids is not None else None,
            sampling_params=params[i],
            return_logprob=return_logprob,
            logprob_start_len=logprob_start_len,
            top_logprobs_num=top_logprobs_num,
            stream=stream,
        )
        for i in range(num_prompts)
    ], single


def check_texts(prompt: str | Sequence[str]) -> list[str]:
    """A prompt or a list of them: non-empty, valid Unicode text each."""
    single = isinstance(prompt, str)
    texts = [prompt] if single else list(prompt)
    if not texts:
        raise InvalidRequestError("`prompt` is an empty list")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise InvalidRequestError(f"prompt[{i}] must be a str, got {type(text).__name__}")
        where = "prompt" if single else f"prompt[{i}]"
        if not text:
            raise InvalidRequestError(f"{where} is empty")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InvalidRequestError(
                f"{where} is not valid Unicode text: {e.reason} at index {e.start}"
            ) from e
    return texts


def check_ids(input_ids: Any, vocab_size: int) -> tuple[list[tuple[int, ...]], bool]:
    """Token ids (one prompt's, or a list of prompts'), and whether it was one prompt."""
    if not isinstance(input_ids, list | tuple) or not input_ids:
        raise InvalidRequestError("`input_ids` must be a non-empty list of token ids")
    single = not isinstance(input_ids[0], list | tuple)
    batch = [tuple(input_ids)] if single else [tuple(x) for x in input_ids]
    for i, ids in enumerate(batch):
        if not ids:
            raise InvalidRequestError(f"input_ids[{i}] is empty")
        bad = [
            t
            for t in ids
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size
        ]
        if bad:
            raise InvalidRequestError(
                f"input_ids[{i}] holds {bad[0]!r}: token ids must be ints in [0, {vocab_size})"
            )
    return batch, single


def sampling_params_of(params: Any, num_prompts: int) -> list[SamplingParams]:
    """One dict for every prompt, or one per prompt."""
    if isinstance(params, list | tuple):
        if len(params) != num_prompts:
            raise InvalidRequestError(
                f"got {len(params)} sampling_params for {num_prompts} prompts"
            )
        return [SamplingParams.from_dict(p) for p in params]
    return [SamplingParams.from_dict(params)] * num_prompts


def logprob_spec(
    return_logprob: bool, start_len: int | None, top_k: int | None, vocab_size: int
) -> LogprobSpec:
    """SGLang's logprob options as a ``LogprobSpec``."""
    check_bool("return_logprob", return_logprob)
    start = -1 if start_len is None else start_len
    # logprob_start_len -1 is SGLang's "no prompt logprobs"; top_logprobs_num has no -1.
    for name, value, lowest in (
        ("logprob_start_len", start, -1),
        ("top_logprobs_num", 0 if top_k is None else top_k, 0),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
            raise InvalidRequestError(f"{name} must be an int >= {lowest}, got {value!r}")
    if top_k and top_k > vocab_size:
        raise InvalidRequestError(f"top_logprobs_num {top_k} exceeds the vocab size")
    # SGLang's default -1: no prompt logprobs, only output ones.
    start = start if start >= 0 else 1 << 62
    return LogprobSpec(return_logprob, start, top_k or 0)


def _is_token_id(value: Any, vocab_size: int) -> bool:
    # bool is an int subclass, but True as a token id is always a mistake
    return not isinstance(value, bool) and isinstance(value, int) and 0 <= value < vocab_size


def check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise InvalidRequestError(f"{name} must be a bool, got {value!r}")
