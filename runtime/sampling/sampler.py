"""Batched sampling: one call per engine step picks the next token of every row.

Each stage touches only the rows that need it, as tensors over those rows::

    logits (B, V), raw from the model
      -> grammar bitmask             constrained rows: disallowed tokens = -inf
      -> repetition penalty          rows with repetition_penalty != 1 (prompt + output tokens)
      -> frequency/presence penalty  rows with either != 0               (output tokens only)
      -> stop ids = -inf             rows with fewer than min_new_tokens outputs
      -> argmax                      greedy rows (temperature 0 or top_k 1)
      -> softmax(logits / temperature), then by group:
           plain: all V tokens (min_p masks in place)         no sort
           top_k: the row's k best, renormalised, top_p/min_p  topk(k)
           top_p: the nucleus over V, top_p/min_p              topk(256), full sort if needed
      -> the draw: unseeded rows by inverse CDF (the first candidate whose running
         total passes u * total, u from the sampler's shared stream); seeded rows
         by an exponential race (below)

A seeded row's draw must not depend on the batch. Every stage is computed per
row (groups are keyed by the row's own top_k, never padded to a batch maximum),
but the logits themselves are not bit-identical across batches: the model's
matrix products round differently for other pass shapes (~1e-5). An inverse
CDF moves its boundaries by the noise summed before them: with 2e-5 noise it
changed 1 in 250 plain draws and 1 in 20 top_p draws (tests/runtime/sampling).
A seeded row instead draws
one float64 uniform u_t per token id t from its own ``torch.Generator``, seeded
from ``(seed, len(output_ids))``, and takes the candidate maximising
w_t / E_t with E_t = -log(u_t), an exponential race: exactly the same
distribution, and noise in the logits changes the token only when the two best
candidates' scores lie within it of each other. The race costs a draw of V
uniforms per seeded row and step.

On CUDA (``fused``), everything after the penalties is one kernel,
``kernels.sampling.masked_sample``: the same kept sets, and the same race for every
row, its noise from Philox keyed by the row's seed and step (seeded rows) or by a
seed the shared generator draws on the device (the others): no sort, no read back.

Host and device: every row parameter, index list and penalty entry a step reads is
built on the host and crosses to the logits' device in one copy per step (its plan:
``radixlm.runtime.sampling.plan``; penalties: ``radixlm.runtime.sampling.penalties``).
Nothing is read back, except whether the top-256 candidates of top_p rows hold their
nucleus (one ``to_host`` per step with such rows; ``StagedDraws._sample_top_p``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from radixlm.kernels.bitmask import apply_token_bitmask
from radixlm.kernels.cpu.token_bitmask import TokenBitmaskKernel
from radixlm.kernels.sampling import masked_sample
from radixlm.runtime.device import to_device_packed
from radixlm.runtime.io.sampling_params import SamplingParams
from radixlm.runtime.sampling.draws import (
    SharedStream,
    StagedDraws,
    draw,
    mix_seed,
    nucleus,
    scale_logits,
)
from radixlm.runtime.sampling.penalties import Penalties
from radixlm.runtime.sampling.plan import SamplingPlan

__all__ = [
    "SamplingRow",
    "SampleOutput",
    "Sampler",
    # the sampler's stages, public for speculative verification (runtime/speculative)
    "draw",
    "mix_seed",
    "nucleus",
    "scale_logits",
    "with_logprobs",
]


@dataclass(frozen=True)
class SamplingRow:
    """One request's view of a sampling step; the scheduler builds it each step.

    Attributes:
        params: the request's sampling parameters.
        output_ids: tokens generated so far (penalties, min_new_tokens, seed step).
        stop_token_ids: EOS ids + params.stop_token_ids; set to -inf while
            ``len(output_ids) < params.min_new_tokens``. With ignore_eos the
            caller leaves EOS out.
        prompt_ids: the prompt; only the repetition penalty reads it (as HF).
        top_logprobs_num: how many top logprobs this row wants (0 = none).
        num_unseen: output tokens sampled by passes still in flight, not yet in
            ``output_ids`` (overlap scheduling): they count for min_new_tokens and the
            seed's step. A row with a penalty never has any (penalties read the ids).

    ``output_ids`` and ``prompt_ids`` may also be 1-D int64 tensors; penalised
    rows then skip a list -> tensor conversion each step.
    """

    params: SamplingParams
    output_ids: Sequence[int]
    stop_token_ids: frozenset[int]
    prompt_ids: Sequence[int] = ()
    top_logprobs_num: int = 0
    num_unseen: int = 0

    @property
    def num_output(self) -> int:
        """How many tokens the request has generated before this one."""
        return len(self.output_ids) + self.num_unseen


@dataclass(frozen=True)
class SampleOutput:
    """What one sampling step returns.

    Attributes:
        next_token_ids: (B,) int64, on the logits' device.
        logprobs: (B,) float32 log-prob of each chosen token under the model's raw
            distribution (log_softmax of the logits before penalties, temperature
            and filtering), so a score does not depend on how it was sampled;
            None unless requested.
        top_logprobs: (values, ids), each (B, K) with K = the largest
            top_logprobs_num in the batch, from the same raw distribution and
            sorted descending; rows that asked for fewer slice their own. None
            unless requested with K > 0.
    """

    next_token_ids: torch.Tensor
    logprobs: torch.Tensor | None = None
    top_logprobs: tuple[torch.Tensor, torch.Tensor] | None = None


class Sampler:
    """Picks the next token for a batch of rows (see the module docstring).

    Args:
        vocab_size: the logits' width V.
        seed: seeds the generator shared by rows without their own seed.
        fused: sample with ``kernels.sampling.masked_sample`` (grammar mask,
            temperature, top-k, top-p, min-p and the draw: one Triton launch on a GPU,
            no sort). None: on CUDA only. The kernel draws by an exponential race over
            Philox noise keyed by (seed, step) for seeded rows, by a seed from the
            shared generator for the others: the staged path's distribution, other
            tokens for the same seed.
        cpu_bitmask: the C++ pass that applies grammar masks to CPU logits (the torch
            ops without it: the same result, far slower; benchmarks/README.md, "CPU
            engine choices").
    """

    def __init__(
        self,
        vocab_size: int,
        seed: int = 0,
        fused: bool | None = None,
        cpu_bitmask: TokenBitmaskKernel | None = None,
    ) -> None:
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        self.vocab_size = vocab_size
        self._fused = fused
        self._cpu_bitmask = cpu_bitmask
        self._stream = SharedStream(seed)
        self._staged = StagedDraws(vocab_size, self._stream)

    def sample(
        self,
        logits: torch.Tensor,
        rows: Sequence[SamplingRow],
        return_logprobs: bool,
        grammar_bitmask: torch.Tensor | None = None,
        grammar_rows: torch.Tensor | None = None,
    ) -> SampleOutput:
        """Sample one token per row.

        Args:
            logits: (B, V) raw logits, row i belonging to ``rows[i]``; not modified.
            rows: one SamplingRow per logits row.
            return_logprobs: also return chosen-token and top-k logprobs (from the
                raw logits: a constraint does not change how a token is scored).
            grammar_bitmask: (G, W) int32 allowed-token bitmask for rows ``grammar_rows``
                (G,), both on the logits' device; tokens whose bit is 0 are never
                sampled.

        Returns:
            the sampled ids on the logits' device; the host learns them with one
            ``to_host`` (the caller's).

        Raises:
            ValueError: logits do not have shape (len(rows), vocab_size), or a
                row asks for a negative number of top logprobs.
        """
        self._check_inputs(logits, rows)
        logits = logits.float()  # (B, V)
        if self._fuses(logits):
            next_ids = self._sample_fused(logits, rows, grammar_bitmask, grammar_rows)
        else:
            next_ids = self._sample_staged(logits, rows, grammar_bitmask, grammar_rows)
        if not return_logprobs:
            return SampleOutput(next_ids)
        return with_logprobs(logits, rows, next_ids)

    def _fuses(self, logits: torch.Tensor) -> bool:
        """Every row can take the fused path: it honours min_p, and a seeded row's draw
        there depends on its (seed, step) alone, as on the staged path."""
        return logits.is_cuda if self._fused is None else self._fused

    def apply_grammar(
        self, logits: torch.Tensor, grammar_bitmask: torch.Tensor, grammar_rows: torch.Tensor | None
    ) -> None:
        """Sets every token the bitmask forbids to -inf, in place (see ``sample``): the
        C++ pass on CPU logits when the sampler has it, else ``apply_token_bitmask``."""
        index = _row_index(grammar_rows, len(logits))
        if self._cpu_bitmask is not None and logits.device.type == "cpu":
            self._cpu_bitmask.apply(logits, grammar_bitmask, index)
        else:
            apply_token_bitmask(logits, grammar_bitmask, index)

    def _sample_fused(
        self,
        logits: torch.Tensor,
        rows: Sequence[SamplingRow],
        grammar_bitmask: torch.Tensor | None,
        grammar_rows: torch.Tensor | None,
    ) -> torch.Tensor:
        """One masked_sample call; unconstrained rows get an all-ones bitmask row.
        Seeded rows draw from (their seed, their step); the others from a seed the
        shared generator draws on the device."""
        device = logits.device
        host = (Penalties.of(rows, self.vocab_size), _FusedParams.of(rows))
        penalties, params = to_device_packed(host, device)  # the step's one copy
        adjusted = logits if penalties is None else penalties.apply(logits)
        bitmask = None
        if grammar_bitmask is not None:
            width = grammar_bitmask.shape[1]
            bitmask = torch.full((len(rows), width), -1, dtype=torch.int32, device=device)
            index = grammar_rows
            if index is None:
                index = torch.arange(len(rows), device=device)
            bitmask[index] = grammar_bitmask
        shared = torch.randint(
            0, 2**62, (len(rows),), generator=self._stream.generator(device), device=device
        )
        return masked_sample(
            adjusted,
            bitmask,
            params.temperature,
            params.top_k,
            params.top_p,
            torch.where(params.seeded, params.seed, shared),
            params.offset,
            params.min_p,
        )

    def _sample_staged(
        self,
        logits: torch.Tensor,
        rows: Sequence[SamplingRow],
        grammar_bitmask: torch.Tensor | None,
        grammar_rows: torch.Tensor | None,
    ) -> torch.Tensor:
        """Penalties, the grammar mask, then the greedy / plain / top-k / top-p groups."""
        plan = SamplingPlan.of(rows, self.vocab_size).to(logits.device)  # the step's one copy
        adjusted = plan.adjust(logits)
        if grammar_bitmask is not None:
            if adjusted is logits:
                adjusted = logits.clone()  # the raw logits stay intact for logprobs
            self.apply_grammar(adjusted, grammar_bitmask, grammar_rows)
        return self._staged.choose(adjusted, plan)

    def _check_inputs(self, logits: torch.Tensor, rows: Sequence[SamplingRow]) -> None:
        expected = (len(rows), self.vocab_size)
        if logits.dim() != 2 or tuple(logits.shape) != expected:
            raise ValueError(f"expected logits of shape {expected}, got {tuple(logits.shape)}")
        for row in rows:
            if row.top_logprobs_num < 0:
                raise ValueError(f"top_logprobs_num must be >= 0, got {row.top_logprobs_num}")


def with_logprobs(
    raw: torch.Tensor, rows: Sequence[SamplingRow], next_ids: torch.Tensor
) -> SampleOutput:
    logprobs = torch.log_softmax(raw, dim=-1)  # (B, V)
    chosen = logprobs.gather(1, next_ids[:, None]).squeeze(1)
    k = min(max((r.top_logprobs_num for r in rows), default=0), raw.shape[1])
    if k == 0:
        return SampleOutput(next_ids, chosen)
    values, ids = logprobs.topk(k, dim=-1)
    return SampleOutput(next_ids, chosen, (values, ids))


def _row_index(rows: torch.Tensor | None, num_rows: int) -> torch.Tensor | None:
    """None when the bitmask covers every row in order: the CPU kernels then mask in
    place instead of gathering and scattering rows (half the work). Rows on a GPU are
    not read (that would wait for the device); its kernel takes the index at no cost."""
    if rows is None or rows.device.type != "cpu":
        return rows
    if len(rows) == num_rows and bool((rows == torch.arange(num_rows)).all()):
        return None
    return rows


@dataclass(frozen=True)
class _FusedParams:
    """``masked_sample``'s per-row arguments (B,) each: temperature (0 for greedy rows),
    top_k (<= 0: off), top_p, min_p; seeded rows' Philox key and step (0 elsewhere)."""

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor
    seeded: torch.Tensor
    seed: torch.Tensor
    offset: torch.Tensor

    @classmethod
    def of(cls, rows: Sequence[SamplingRow]) -> _FusedParams:
        seeds = [r.params.seed for r in rows]
        return cls(
            torch.tensor(
                [0.0 if r.params.is_greedy else r.params.temperature for r in rows],
                dtype=torch.float32,
            ),
            torch.tensor([max(r.params.top_k, 0) for r in rows], dtype=torch.long),
            torch.tensor([r.params.top_p for r in rows], dtype=torch.float32),
            torch.tensor([r.params.min_p for r in rows], dtype=torch.float32),
            torch.tensor([s is not None for s in seeds], dtype=torch.bool),
            torch.tensor([0 if s is None else mix_seed(s, 0) for s in seeds], dtype=torch.long),
            torch.tensor(
                [0 if s is None else r.num_output for s, r in zip(seeds, rows)], dtype=torch.long
            ),
        )
