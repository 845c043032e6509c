"""Turns what a caller passed to ``generate`` into validated ``TokenizedRequest``s.

    generate(prompt, sampling_params, ...)  --sglang_args.requests_of-->  GenerateRequest
                                            per prompt
    GenerateRequest  --check-->  CheckedRequest (tokenized; everything checked)
                     --start_grammar-->  PendingGrammar (its constraint's compile)
                     --build (with the compiled grammar)-->  TokenizedRequest per sample

Runs in the caller's context (its thread, or its event loop): every error here is the
caller's, raised before anything reaches the engine loop. Only the wait for a compile
is the caller's to do (blocking or awaited): the compile runs in a worker process.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from radixlm.runtime.config import LimitsConfig
from radixlm.runtime.constrained import CompiledGrammar, GrammarCompiler, GrammarSpec
from radixlm.runtime.constrained.compiler import PendingGrammar
from radixlm.runtime.constrained.vocab import special_tokens
from radixlm.runtime.errors import InvalidRequestError, InvalidSamplingParamsError
from radixlm.runtime.io.context_room import ContextRoom
from radixlm.runtime.io.detokenizer import IncrementalDetokenizer
from radixlm.runtime.io.limits import check_logprob_entries, check_request, logprob_entries
from radixlm.runtime.io.messages import GenerateRequest, LogprobSpec, TokenizedRequest
from radixlm.runtime.io.sampling_params import SamplingParams
from radixlm.runtime.io.sglang_args import (
    check_bool,
    check_ids,
    check_texts,
    logprob_spec,
)
from radixlm.runtime.io.stop_regex import StopRegexes
from radixlm.runtime.io.stop_strings import StopStrings
from radixlm.runtime.io.token_bound import TokenBound
from radixlm.runtime.reasoning import Phase, ReasoningMarkers, ReasoningMatcher

__all__ = ["CheckedRequest", "RequestBuilder", "is_request_id"]

# A caller's request id (GenerateRequest.request_id): visible ASCII, no spaces, so it
# can stand in a log line or a header as it is.
_REQUEST_ID = re.compile(r"[\x21-\x7e]{1,128}")


@dataclass(frozen=True)
class RequestBuilder:
    """tokenizer: a transformers fast tokenizer; eos_token_ids: the model's end tokens;
    kv_capacity: KV slots in the pool (one request must fit in it alone);
    grammars: compiles constraints (cached; in worker processes);
    jump_forward: the engine's default for requests that do not say;
    limits: what one request (and one call) may cost;
    reasoning: the reasoning markers of the engine's reasoning parser (None: none):
        a constraint, and ``max_reasoning_tokens``, then apply behind the section."""

    tokenizer: Any
    vocab_size: int
    context_len: int
    kv_capacity: int
    eos_token_ids: frozenset[int]
    grammars: GrammarCompiler
    jump_forward: bool = False
    max_n: int = 64
    limits: LimitsConfig = LimitsConfig()
    reasoning: ReasoningMarkers | None = None

    def check(self, request: GenerateRequest) -> CheckedRequest:
        """Everything about ``request`` but its constraint: types, limits, the prompt
        (tokenized), each sample's parameters against the model and the KV pool.

        Raises:
            InvalidRequestError (a ValueError): a bad prompt or bad parameters.
            ContextLengthError (one): a request that cannot fit in the model's context
                or the KV pool (``room``).
            RequestLimitError: the request asks for more than ``limits`` allow.
        """
        if not isinstance(request, GenerateRequest):
            raise InvalidRequestError(f"expected a GenerateRequest, got {type(request).__name__}")
        params = request.sampling_params
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError(
                f"sampling_params must be a SamplingParams, got {type(params).__name__}"
            )
        logprob = logprob_spec(
            request.return_logprob,
            request.logprob_start_len,
            request.top_logprobs_num,
            self.vocab_size,
        )
        check_request(request, self.limits)
        prompt_ids = self._prompt_ids(request)
        check_bool("stream", request.stream)
        check_bool("log_metrics", request.log_metrics)
        if request.request_id is not None and not is_request_id(request.request_id):
            raise InvalidRequestError(
                f"request_id must be 1-128 visible ASCII characters, got {request.request_id!r}"
            )
        if params.n > self.max_n:
            raise InvalidRequestError(f"n {params.n} exceeds this engine's max_n {self.max_n}")
        if params.max_reasoning_tokens is not None and self.reasoning is None:
            raise InvalidSamplingParamsError(
                "max_reasoning_tokens",
                "this engine has no reasoning parser (start it with --reasoning-parser NAME)",
            )
        self._check_fits(params, len(prompt_ids))
        spec = params.grammar
        return CheckedRequest(
            request,
            prompt_ids,
            logprob,
            None if spec is None else self.grammars.backend_for(spec, params.grammar_backend),
            spec,
        )

    def start_grammar(self, checked: CheckedRequest) -> PendingGrammar | None:
        """Starts (or finds cached) the compile of the request's constraint, if any."""
        if checked.grammar is None or checked.grammar_backend is None:
            return None
        return self.grammars.start(checked.grammar, checked.grammar_backend)

    def build(
        self,
        checked: CheckedRequest,
        grammar: CompiledGrammar | None,
        new_rid: Callable[[], str],
        first_index: int = 0,
    ) -> list[TokenizedRequest]:
        """The request's samples (``n`` of them) with their constraint ``grammar`` (what
        its ``start_grammar`` compiled), ids from ``new_rid`` and output indices from
        ``first_index`` on (each prefixed with the request's ``request_id``, if any).
        Raises nothing: ``check`` checked it all."""
        request = checked.request
        if request.request_id is not None:
            new_rid = _prefixed(request.request_id, new_rid)
        # Built once, shared by all samples: the stop strings' automaton, the regexes.
        stops = StopStrings(request.sampling_params.stop)
        regexes = StopRegexes(request.sampling_params.stop_regex)
        phase = self._opening_phase(checked, grammar)
        return [
            self._build_sample(
                new_rid(), first_index + i, checked, p, grammar, stops, regexes, phase
            )
            for i, p in enumerate(self.expand_samples(request.sampling_params))
        ]

    def _opening_phase(
        self, checked: CheckedRequest, grammar: CompiledGrammar | None
    ) -> Phase | None:
        """Where the reply starts in its reasoning, for a request whose samples get a
        ``ReasoningMatcher`` (a constraint or a reasoning budget); else None."""
        budget = checked.request.sampling_params.max_reasoning_tokens
        if self.reasoning is None or (grammar is None and budget is None):
            return None
        return self.reasoning.opening_phase(checked.prompt_ids)

    def check_call(self, samples: Sequence[TokenizedRequest]) -> None:
        """The limits on one call as a whole (its samples' logprob entries together).

        Raises:
            RequestLimitError: the call's outputs could hold too many logprob entries.
        """
        entries = (
            logprob_entries(s.logprob, len(s.prompt_ids), s.params.max_new_tokens) for s in samples
        )
        check_logprob_entries(entries, self.limits)

    def _prompt_ids(self, request: GenerateRequest) -> tuple[int, ...]:
        if (request.text is None) == (request.input_ids is None):
            raise InvalidRequestError("set exactly one of `text` and `input_ids`")
        if request.text is not None:
            (text,) = check_texts(request.text)
            self._refuse_unfitting(text, request.sampling_params)
            ids = tuple(self.tokenizer(text)["input_ids"])
            if not ids:  # nothing to compute a first token from
                raise InvalidRequestError(
                    "the prompt encodes to no tokens (the tokenizer drops all of its text)"
                )
            return ids
        (ids,), _ = check_ids(request.input_ids, self.vocab_size)
        return ids

    @cached_property
    def token_bound(self) -> TokenBound:
        """The tokenizer's lower bound on a text's tokens (read from it once, when first
        needed)."""
        return TokenBound.from_tokenizer(self.tokenizer)

    @cached_property
    def room(self) -> ContextRoom:
        """What one request may hold, prompt plus output (the context-fit rule)."""
        return ContextRoom(self.context_len, self.kv_capacity)

    def _refuse_unfitting(self, text: str, params: SamplingParams) -> None:
        """Refuses, untokenized, a text that cannot fit with its ``max_new_tokens``
        whatever it tokenizes to: tokenizing megabytes takes seconds and gigabytes."""
        self.room.num_new_tokens(
            self.token_bound.at_least(text), params.max_new_tokens, at_least=True
        )

    @staticmethod
    def expand_samples(params: SamplingParams) -> Iterator[SamplingParams]:
        """n > 1 becomes n requests; seeded ones get seeds seed, seed+1, ... so they differ."""
        for i in range(params.n):
            seed = None if params.seed is None else params.seed + i
            yield params.for_sample(seed)

    def _check_fits(self, params: SamplingParams, num_prompt_tokens: int) -> None:
        params.validate_for_model(self.vocab_size)
        self.room.num_new_tokens(num_prompt_tokens, params.max_new_tokens)

    @cached_property
    def _special_tokens(self) -> dict[str, int]:
        """The tokenizer's special tokens, content -> id (read once, when first needed)."""
        return special_tokens(self.tokenizer)

    def _skipped_ids(self, params: SamplingParams) -> frozenset[int] | None:
        """The ids the output text leaves out when the request reads some special tokens
        as text (all the other special ones); None: ``skip_special_tokens`` decides."""
        if not params.skip_special_tokens or not params.special_tokens_as_text:
            return None
        special = self._special_tokens
        kept = {special[t] for t in params.special_tokens_as_text if t in special}
        if not kept:
            return None
        return frozenset(special.values()) - kept

    def _build_sample(
        self,
        rid: str,
        index: int,
        checked: CheckedRequest,
        params: SamplingParams,
        compiled: CompiledGrammar | None,
        stops: StopStrings,
        regexes: StopRegexes,
        phase: Phase | None = None,
    ) -> TokenizedRequest:
        grammar = compiled.new_matcher() if compiled is not None else None
        if phase is not None:
            assert self.reasoning is not None
            grammar = ReasoningMatcher(self.reasoning, grammar, phase, params.max_reasoning_tokens)
        stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids |= self.eos_token_ids
        detok = IncrementalDetokenizer(
            self.tokenizer,
            checked.prompt_ids,
            params.skip_special_tokens,
            params.spaces_between_special_tokens,
            stops,
            params.no_stop_trim,
            regexes,
            self._skipped_ids(params),
        )
        # Jumped tokens are not sampled, so they have no logprobs: logprob requests decode.
        jump = params.jump_forward if params.jump_forward is not None else self.jump_forward
        logprob = checked.logprob
        return TokenizedRequest(
            rid,
            index,
            checked.prompt_ids,
            params,
            frozenset(stop_ids),
            detok,
            logprob,
            checked.request.stream,
            grammar=grammar,
            jump_forward=grammar is not None and jump and not logprob.enabled,
            grammar_warnings=compiled.warnings if compiled is not None else (),
            log_metrics=checked.request.log_metrics,
        )


@dataclass(frozen=True)
class CheckedRequest:
    """A request that passed every check but its constraint's compile (``check``)."""

    request: GenerateRequest
    prompt_ids: tuple[int, ...]
    logprob: LogprobSpec
    grammar_backend: str | None  # the backend its constraint compiles with
    grammar: GrammarSpec | None  # its constraint


def is_request_id(value: object) -> bool:
    """Whether ``value`` may be a request id: 1-128 visible ASCII characters."""
    return isinstance(value, str) and _REQUEST_ID.fullmatch(value) is not None


def _prefixed(prefix: str, new_rid: Callable[[], str]) -> Callable[[], str]:
    return lambda: f"{prefix}-{new_rid()}"
