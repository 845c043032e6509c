"""Turns what a caller passed to ``generate`` into validated ``Request``s.

Runs in the caller's thread: every error here is the caller's, raised before
anything reaches the engine loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from radixlm.runtime.constrained import GrammarCompiler, GrammarMatcher
from radixlm.runtime.detokenizer import IncrementalDetokenizer
from radixlm.runtime.errors import InvalidRequestError
from radixlm.runtime.request import LogprobSpec, Request
from radixlm.runtime.sampling_params import SamplingParams

__all__ = ["RequestBuilder"]


@dataclass(frozen=True)
class RequestBuilder:
    """tokenizer: a transformers fast tokenizer; eos_token_ids: the model's end tokens;
    kv_capacity: KV slots in the pool (one request must fit in it alone);
    grammars: compiles constraints (in this, the caller's, thread);
    jump_forward: the engine's default for requests that do not say."""

    tokenizer: Any
    vocab_size: int
    context_len: int
    kv_capacity: int
    eos_token_ids: frozenset[int]
    grammars: GrammarCompiler
    jump_forward: bool = False

    def normalize_prompts(
        self, prompt: str | Sequence[str] | None, input_ids: Any
    ) -> tuple[list[list[int]], bool]:
        """Returns the token ids of every prompt and whether the call had a single one."""
        if (prompt is None) == (input_ids is None):
            raise InvalidRequestError("pass exactly one of `prompt` and `input_ids`")
        if prompt is not None:
            return self._tokenize(prompt)
        return self._check_ids(input_ids)

    def _tokenize(self, prompt: str | Sequence[str]) -> tuple[list[list[int]], bool]:
        single = isinstance(prompt, str)
        texts = [prompt] if single else list(prompt)
        if not texts:
            raise InvalidRequestError("`prompt` is an empty list")
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise InvalidRequestError(f"prompt[{i}] must be a str, got {type(text).__name__}")
            if not text:
                raise InvalidRequestError(
                    f"prompt[{i}] is empty" if not single else "prompt is empty"
                )
        return [self.tokenizer(t)["input_ids"] for t in texts], single

    def _check_ids(self, input_ids: Any) -> tuple[list[list[int]], bool]:
        if not isinstance(input_ids, list | tuple) or not input_ids:
            raise InvalidRequestError("`input_ids` must be a non-empty list of token ids")
        single = not isinstance(input_ids[0], list | tuple)
        batch = [list(input_ids)] if single else [list(x) for x in input_ids]
        for i, ids in enumerate(batch):
            if not ids:
                raise InvalidRequestError(f"input_ids[{i}] is empty")
            bad = [
                t
                for t in ids
                if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab_size
            ]
            if bad:
                raise InvalidRequestError(
                    f"input_ids[{i}] holds {bad[0]!r}: token ids must be ints in "
                    f"[0, {self.vocab_size})"
                )
        return batch, single

    def normalize_params(self, params: Any, num_prompts: int) -> list[SamplingParams]:
        if isinstance(params, list | tuple):
            if len(params) != num_prompts:
                raise InvalidRequestError(
                    f"got {len(params)} sampling_params for {num_prompts} prompts"
                )
            return [SamplingParams.from_dict(p) for p in params]
        return [SamplingParams.from_dict(params)] * num_prompts

    def logprob_spec(
        self, return_logprob: bool, start_len: int | None, top_k: int | None
    ) -> LogprobSpec:
        if not isinstance(return_logprob, bool):
            raise InvalidRequestError("return_logprob must be a bool")
        start = -1 if start_len is None else start_len
        for name, value in (("logprob_start_len", start), ("top_logprobs_num", top_k or 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < -1:
                raise InvalidRequestError(f"{name} must be an int >= 0, got {value!r}")
        if top_k and top_k > self.vocab_size:
            raise InvalidRequestError(f"top_logprobs_num {top_k} exceeds the vocab size")
        # SGLang's default -1: no prompt logprobs, only output ones.
        start = start if start >= 0 else 1 << 62
        return LogprobSpec(return_logprob, start, top_k or 0)

    @staticmethod
    def expand_samples(params: SamplingParams) -> Iterator[SamplingParams]:
        """n > 1 becomes n requests; seeded ones get seeds seed, seed+1, ... so they differ."""
        for i in range(params.n):
            seed = None if params.seed is None else params.seed + i
            yield dataclasses.replace(params, n=1, seed=seed)

    def build(
        self,
        rid: str,
        prompt_ids: list[int],
        params: SamplingParams,
        logprob: LogprobSpec,
        stream: bool,
    ) -> Request:
        params.validate_for_model(self.vocab_size, self.context_len, len(prompt_ids))
        needed = len(prompt_ids) + params.max_new_tokens
        if needed > self.kv_capacity:
            raise InvalidRequestError(
                f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({params.max_new_tokens}) "
                f"needs {needed} KV slots; the pool holds {self.kv_capacity} "
                "(raise max_total_tokens)"
            )
        grammar = self._grammar_matcher(params)
        stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids |= self.eos_token_ids
        detok = IncrementalDetokenizer(
            self.tokenizer,
            prompt_ids,
            params.skip_special_tokens,
            params.spaces_between_special_tokens,
            params.stop,
            params.no_stop_trim,
        )
        # Jumped tokens are not sampled, so they have no logprobs: logprob requests decode.
        jump = params.jump_forward if params.jump_forward is not None else self.jump_forward
        return Request(
            rid,
            prompt_ids,
            params,
            frozenset(stop_ids),
            detok,
            logprob,
            stream,
            grammar=grammar,
            jump_forward=grammar is not None and jump and not logprob.enabled,
        )

    def _grammar_matcher(self, params: SamplingParams) -> GrammarMatcher | None:
        """A fresh matcher for the request's constraint (compiled once, cached).

        Raises:
            GrammarError: the constraint is invalid, unsupported, accepts nothing,
                or took too long to compile.
        """
        spec = params.grammar
        if spec is None:
            return None
        backend = self.grammars.backend_for(spec, params.grammar_backend)
        return self.grammars.compile(spec, backend).new_matcher()
