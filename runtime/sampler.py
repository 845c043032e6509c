"""Batched sampling: one call per engine step picks the next token of every row.

Each stage touches only the rows that need it, as tensors over those rows::

    logits (B, V), raw from the model
      -> repetition penalty          rows with repetition_penalty != 1 (prompt + output tokens)
      -> frequency/presence penalty  rows with either != 0               (output tokens only)
      -> stop ids = -inf             rows with fewer than min_new_tokens outputs
      -> argmax                      greedy rows (temperature 0 or top_k 1)
      -> / temperature, then
           plain rows:    argmax(logits + Gumbel)                over all V tokens
           filtered rows: top-k (or full sort when top_k is off) candidates, sorted;
                          drop by top_p then min_p; argmax(candidates + Gumbel)

Gumbel-max: ``argmax(l + G)`` with ``G = -log(E)``, ``E ~ Exp(1)`` i.i.d. is an
exact sample from ``softmax(l)``. Sampling this way lets a seeded row draw its
noise per token id from its own ``torch.Generator`` seeded from
``(seed, len(output_ids))``: its draw depends on nothing else in the batch, so
the same seed and prompt give the same output whatever runs beside it (exact
ties between logits aside). Unseeded rows share the sampler's generator.

Penalties are the HF/vLLM ones: repetition divides a positive logit (multiplies
a negative one) by the penalty for every token seen in prompt or output;
frequency/presence subtract ``count * frequency + presence`` for tokens in the
output (OpenAI/SGLang semantics). Their cost is O(tokens seen), not O(V).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from radixlm.runtime.sampling_params import SamplingParams

__all__ = ["SamplingRow", "SampleOutput", "Sampler"]

_MASK64 = (1 << 64) - 1


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
    """

    params: SamplingParams
    output_ids: Sequence[int]
    stop_token_ids: frozenset[int]
    prompt_ids: Sequence[int] = ()
    top_logprobs_num: int = 0


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
    """

    def __init__(self, vocab_size: int, seed: int = 0) -> None:
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        self.vocab_size = vocab_size
        self._seed = seed
        self._generators: dict[str, torch.Generator] = {}

    def sample(
        self, logits: torch.Tensor, rows: Sequence[SamplingRow], return_logprobs: bool
    ) -> SampleOutput:
        """Sample one token per row.

        Args:
            logits: (B, V) raw logits, row i belonging to ``rows[i]``; not modified.
            rows: one SamplingRow per logits row.
            return_logprobs: also return chosen-token and top-k logprobs.

        Raises:
            ValueError: logits do not have shape (len(rows), vocab_size), or a
                row asks for a negative number of top logprobs.
        """
        self._check_inputs(logits, rows)
        logits = logits.float()  # (B, V)
        next_ids = self._choose(_adjust_logits(logits, rows), rows)
        if not return_logprobs:
            return SampleOutput(next_ids)
        return _with_logprobs(logits, rows, next_ids)

    def _check_inputs(self, logits: torch.Tensor, rows: Sequence[SamplingRow]) -> None:
        expected = (len(rows), self.vocab_size)
        if logits.dim() != 2 or tuple(logits.shape) != expected:
            raise ValueError(f"expected logits of shape {expected}, got {tuple(logits.shape)}")
        for row in rows:
            if row.top_logprobs_num < 0:
                raise ValueError(f"top_logprobs_num must be >= 0, got {row.top_logprobs_num}")

    def _choose(self, logits: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
        """(B, V) adjusted logits -> (B,) token ids."""
        greedy = _indices(rows, lambda r: r.params.is_greedy)
        if len(greedy) == len(rows):
            return logits.argmax(dim=-1)
        next_ids = torch.empty(len(rows), dtype=torch.long, device=logits.device)
        if greedy:
            next_ids[_index(greedy, logits)] = _take(logits, greedy).argmax(dim=-1)
        for width, idx in self._candidate_groups(rows).items():
            next_ids[_index(idx, logits)] = self._sample_rows(logits, rows, idx, width)
        return next_ids

    def _candidate_groups(self, rows: Sequence[SamplingRow]) -> dict[int, list[int]]:
        """Sampled rows grouped by candidate width: V (all tokens) or their own top_k.

        Grouping by the row's own top_k (not the batch maximum) keeps a row's
        computation identical whatever else is in the batch.
        """
        groups: dict[int, list[int]] = {}
        for i, row in enumerate(rows):
            if not row.params.is_greedy:
                groups.setdefault(self._candidate_width(row.params), []).append(i)
        return groups

    def _candidate_width(self, params: SamplingParams) -> int:
        if params.top_k == -1:
            return self.vocab_size
        return min(params.top_k, self.vocab_size)

    def _sample_rows(
        self, logits: torch.Tensor, rows: Sequence[SamplingRow], idx: list[int], width: int
    ) -> torch.Tensor:
        """Sample rows ``idx`` whose candidates are their ``width`` most likely tokens."""
        sub_rows = [rows[i] for i in idx]
        scaled = _take(logits, idx) / _row_values(sub_rows, "temperature", logits.device)[:, None]
        if width == self.vocab_size and not any(_needs_filter(r.params) for r in sub_rows):
            return (scaled + self._gumbel(sub_rows, None, width, logits.device)).argmax(dim=-1)
        if width == self.vocab_size:
            cand, ids = scaled.sort(dim=-1, descending=True, stable=True)  # (n, V)
        else:
            cand, ids = scaled.topk(width, dim=-1)  # (n, k), sorted descending
        cand = _filter_sorted_candidates(cand, sub_rows)
        pick = (cand + self._gumbel(sub_rows, ids, width, logits.device)).argmax(dim=-1)
        return ids.gather(1, pick[:, None]).squeeze(1)

    def _gumbel(
        self,
        rows: Sequence[SamplingRow],
        ids: torch.Tensor | None,
        width: int,
        device: torch.device,
    ) -> torch.Tensor:
        """(n, width) Gumbel noise; a seeded row's noise for token t is its own draw at t.

        ``ids``: (n, width) token id of each candidate column, or None when the
        columns are the token ids themselves.
        """
        exp = torch.empty(len(rows), width, device=device)
        unseeded = [j for j, r in enumerate(rows) if r.params.seed is None]
        if unseeded:
            shared = self._shared_generator(device)
            drawn = torch.empty(len(unseeded), width, device=device).exponential_(generator=shared)
            if len(unseeded) == len(rows):
                exp = drawn
            else:
                exp[_index(unseeded, exp)] = drawn
        for j, row in enumerate(rows):
            if row.params.seed is not None:
                per_token = self._seeded_exponential(row, device)  # (V,)
                exp[j] = per_token if ids is None else per_token[ids[j]]
        # Exp(1) can return exactly 0 in float32; clamping keeps -log finite.
        return -exp.clamp_min_(torch.finfo(exp.dtype).tiny).log_()

    def _seeded_exponential(self, row: SamplingRow, device: torch.device) -> torch.Tensor:
        assert row.params.seed is not None
        generator = torch.Generator(device=device)
        generator.manual_seed(_mix_seed(row.params.seed, len(row.output_ids)))
        return torch.empty(self.vocab_size, device=device).exponential_(generator=generator)

    def _shared_generator(self, device: torch.device) -> torch.Generator:
        key = str(device)
        if key not in self._generators:
            generator = torch.Generator(device=device)
            generator.manual_seed(self._seed)
            self._generators[key] = generator
        return self._generators[key]


def _needs_filter(params: SamplingParams) -> bool:
    return params.top_p < 1.0 or params.min_p > 0.0


def _filter_sorted_candidates(cand: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
    """Apply top_p then min_p to (n, C) candidates sorted descending; dropped -> -inf.

    top_p keeps the smallest prefix whose mass reaches top_p (the first
    candidate always survives); min_p keeps p >= min_p * p_max. Both read the
    distribution renormalised over the candidates (after top-k), like HF.
    """
    device = cand.device
    probs = cand.softmax(dim=-1)
    # top_p = 1 must keep everything even where rounding lets the cumsum pass 1.
    top_p = _row_values(rows, "top_p", device)
    top_p = torch.where(top_p < 1.0, top_p, torch.inf)[:, None]
    drop = (probs.cumsum(dim=-1) - probs) >= top_p
    min_p = _row_values(rows, "min_p", device)[:, None]
    drop |= probs < min_p * probs[:, :1]
    return cand.masked_fill(drop, -torch.inf)


def _adjust_logits(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
    """Penalties and min_new_tokens; returns ``logits`` itself when no row needs them."""
    rep = _indices(rows, lambda r: r.params.repetition_penalty != 1.0)
    add = _indices(
        rows, lambda r: r.params.frequency_penalty != 0 or r.params.presence_penalty != 0
    )
    suppress = _indices(rows, lambda r: len(r.output_ids) < r.params.min_new_tokens)
    suppress = [i for i in suppress if rows[i].stop_token_ids]
    if not (rep or add or suppress):
        return logits
    out = logits.clone()  # the raw logits stay intact for logprobs
    if rep:
        _apply_repetition_penalty(out, rows, rep)
    if add:
        _apply_additive_penalties(out, rows, add)
    if suppress:
        _suppress_stop_tokens(out, rows, suppress)
    return out


def _apply_repetition_penalty(
    out: torch.Tensor, rows: Sequence[SamplingRow], idx: list[int]
) -> None:
    """In place on ``out`` rows ``idx``: every token in prompt or output is penalised once."""
    local, tokens = _flatten(
        [_ids_tensor(rows[i].prompt_ids, rows[i].output_ids) for i in idx], out
    )
    penalty = _row_values([rows[i] for i in idx], "repetition_penalty", out.device)[local]
    batch_rows = _index(idx, out)[local]
    values = out[batch_rows, tokens]
    # Duplicates write the same value (computed from the unpenalised logit), so
    # a token seen many times is still penalised exactly once.
    out[batch_rows, tokens] = torch.where(values > 0, values / penalty, values * penalty)


def _apply_additive_penalties(
    out: torch.Tensor, rows: Sequence[SamplingRow], idx: list[int]
) -> None:
    """In place: logit -= count * frequency_penalty + presence_penalty, output tokens only."""
    local, tokens = _flatten([_ids_tensor(rows[i].output_ids) for i in idx], out)
    width = out.shape[1]
    keys, counts = torch.unique(local * width + tokens, return_counts=True)
    local, tokens = keys // width, keys % width
    sub_rows = [rows[i] for i in idx]
    freq = _row_values(sub_rows, "frequency_penalty", out.device)[local]
    presence = _row_values(sub_rows, "presence_penalty", out.device)[local]
    out[_index(idx, out)[local], tokens] -= counts.to(out.dtype) * freq + presence


def _suppress_stop_tokens(out: torch.Tensor, rows: Sequence[SamplingRow], idx: list[int]) -> None:
    """In place: stop tokens of rows still short of min_new_tokens become -inf."""
    row_ids = [i for i in idx for _ in rows[i].stop_token_ids]
    token_ids = [t for i in idx for t in rows[i].stop_token_ids]
    out[
        torch.tensor(row_ids, device=out.device), torch.tensor(token_ids, device=out.device)
    ] = -torch.inf


def _with_logprobs(
    raw: torch.Tensor, rows: Sequence[SamplingRow], next_ids: torch.Tensor
) -> SampleOutput:
    logprobs = torch.log_softmax(raw, dim=-1)  # (B, V)
    chosen = logprobs.gather(1, next_ids[:, None]).squeeze(1)
    k = min(max((r.top_logprobs_num for r in rows), default=0), raw.shape[1])
    if k == 0:
        return SampleOutput(next_ids, chosen)
    values, ids = logprobs.topk(k, dim=-1)
    return SampleOutput(next_ids, chosen, (values, ids))


def _indices(rows: Sequence[SamplingRow], wanted: Callable[[SamplingRow], bool]) -> list[int]:
    return [i for i, row in enumerate(rows) if wanted(row)]


def _index(idx: list[int], like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(idx, dtype=torch.long, device=like.device)


def _take(t: torch.Tensor, idx: list[int]) -> torch.Tensor:
    """Rows ``idx`` (ascending, unique) of ``t``; ``t`` itself when that is every row."""
    return t if len(idx) == t.shape[0] else t[_index(idx, t)]


def _row_values(rows: Sequence[SamplingRow], name: str, device: torch.device) -> torch.Tensor:
    """(n,) float32 tensor of one sampling parameter over ``rows``."""
    return torch.tensor([getattr(r.params, name) for r in rows], device=device)


def _ids_tensor(*parts: Sequence[int]) -> torch.Tensor:
    return torch.cat([torch.as_tensor(p, dtype=torch.long).reshape(-1) for p in parts])


def _flatten(seqs: list[torch.Tensor], like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """All tokens of ``seqs`` as (T,) tensors: which sequence each came from, and its id."""
    lengths = torch.tensor([len(s) for s in seqs], device=like.device)
    local = torch.repeat_interleave(torch.arange(len(seqs), device=like.device), lengths)
    return local, torch.cat(seqs).to(like.device)


def _mix_seed(seed: int, step: int) -> int:
    """A 63-bit generator seed from (seed, step): splitmix64, so nearby pairs differ widely."""
    x = (seed * 0x9E3779B97F4A7C15 + step + 0x632BE59BD9B4E019) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) >> 1
