"""Penalties and min_new_tokens: where one step changes which logits, built on the host.

Penalties are the HF/vLLM ones: repetition divides a positive logit (multiplies
a negative one) by the penalty for every token seen in prompt or output;
frequency/presence subtract ``count * frequency + presence`` for tokens in the
output (OpenAI/SGLang semantics); a row short of min_new_tokens has its stop ids
at -inf. Their cost is O(tokens seen), not O(V).

Every entry (batch row, token id, value) is known on the host from the rows alone,
so it is computed there, counts included (``torch.unique`` on a GPU would wait for
the device to learn how many keys it found), and crosses with the rest of the step's
tensors in one copy (``radixlm.runtime.device.to_device_packed``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from radixlm.runtime.sampling.sampler import SamplingRow

__all__ = ["Penalties"]


@dataclass(frozen=True)
class Penalties:
    """The logits one step's penalties and min_new_tokens change (entries may be empty).

    Attributes:
        repetition_at: (2, T) int64 (batch row, token id) of every prompt and output
            token of rows with a repetition penalty, repeats included.
        repetition: (T,) float32 the penalty of each of those entries.
        additive_at: (2, U) int64 (batch row, token id), each output token of rows with
            a frequency or presence penalty once.
        additive: (U,) float32 ``count * frequency_penalty + presence_penalty`` there.
        stop_at: (2, S) int64 (batch row, stop id) of rows short of min_new_tokens.
    """

    repetition_at: torch.Tensor
    repetition: torch.Tensor
    additive_at: torch.Tensor
    additive: torch.Tensor
    stop_at: torch.Tensor

    @classmethod
    def of(cls, rows: Sequence[SamplingRow], vocab_size: int) -> Penalties | None:
        """The host entries of ``rows`` (in batch order); None when no row needs any."""
        repeating = [i for i, r in enumerate(rows) if r.params.repetition_penalty != 1.0]
        counting = [
            i
            for i, r in enumerate(rows)
            if r.params.frequency_penalty != 0 or r.params.presence_penalty != 0
        ]
        short = [
            i
            for i, r in enumerate(rows)
            if r.num_output < r.params.min_new_tokens and r.stop_token_ids
        ]
        if not (repeating or counting or short):
            return None
        repetition_at, repetition = _repetition_entries(rows, repeating)
        additive_at, additive = _additive_entries(rows, counting, vocab_size)
        return cls(repetition_at, repetition, additive_at, additive, _stop_entries(rows, short))

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """A copy of (B, V) ``logits`` with every entry applied (rows in batch order):
        repetition, then frequency/presence, then stop ids to -inf."""
        out = logits.clone()  # the raw logits stay intact for logprobs
        if self.repetition.numel():
            rows, tokens = self.repetition_at
            values = out[rows, tokens]
            # Duplicates write the same value (computed from the unpenalised logit), so
            # a token seen many times is still penalised exactly once.
            penalty = self.repetition
            out[rows, tokens] = torch.where(values > 0, values / penalty, values * penalty)
        if self.additive.numel():
            rows, tokens = self.additive_at
            out[rows, tokens] -= self.additive
        if self.stop_at.numel():
            rows, tokens = self.stop_at
            out[rows, tokens] = -torch.inf
        return out


def _repetition_entries(
    rows: Sequence[SamplingRow], idx: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every prompt and output token of rows ``idx``, with its row's penalty."""
    seqs = [_ids_tensor(rows[i].prompt_ids, rows[i].output_ids) for i in idx]
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)
    at = torch.stack((_repeat(idx, lengths), _cat(seqs)))
    penalties = _values([rows[i].params.repetition_penalty for i in idx])
    return at, torch.repeat_interleave(penalties, lengths)


def _additive_entries(
    rows: Sequence[SamplingRow], idx: list[int], vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each distinct output token of rows ``idx`` once, with count * frequency + presence."""
    seqs = [_ids_tensor(rows[i].output_ids) for i in idx]
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)
    local = torch.repeat_interleave(torch.arange(len(idx)), lengths)
    keys, counts = torch.unique(local * vocab_size + _cat(seqs), return_counts=True)
    local, tokens = keys // vocab_size, keys % vocab_size
    frequency = _values([rows[i].params.frequency_penalty for i in idx])[local]
    presence = _values([rows[i].params.presence_penalty for i in idx])[local]
    batch_rows = torch.tensor(idx, dtype=torch.long)[local]
    return torch.stack((batch_rows, tokens)), counts.to(torch.float32) * frequency + presence


def _stop_entries(rows: Sequence[SamplingRow], idx: list[int]) -> torch.Tensor:
    """(2, S) every stop id of rows ``idx``."""
    pairs = [(i, t) for i in idx for t in rows[i].stop_token_ids]
    return torch.tensor(pairs, dtype=torch.long).reshape(-1, 2).T.contiguous()


def _ids_tensor(*parts: Sequence[int]) -> torch.Tensor:
    return torch.cat([torch.as_tensor(p, dtype=torch.long).reshape(-1) for p in parts])


def _cat(seqs: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(seqs) if seqs else torch.empty(0, dtype=torch.long)


def _repeat(idx: list[int], lengths: torch.Tensor) -> torch.Tensor:
    return torch.repeat_interleave(torch.tensor(idx, dtype=torch.long), lengths)


def _values(values: list[float]) -> torch.Tensor:
    """(n,) float32, each value rounded as the stages read it."""
    return torch.tensor(values, dtype=torch.float32)
