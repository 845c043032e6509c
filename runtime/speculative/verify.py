"""Verifying K proposed tokens per row against the target model, for a batch of rows.

A verifying row with K proposals x_0 .. x_{K-1} runs as an extend of 1 + K tokens
(its pending token, then the proposals) with logits kept at every position, so
position j holds the target's logits for the token after ``all_ids + x[:j]``. The
rows' positions lie back to back in one logits tensor::

    logits   | row 0: K = 2   | row 1: K = 0 | row 2: K = 3        |
             |  P0   P1   P2  |  P0          |  P0   P1   P2   P3  |
    offset      0               3              4

    a row emits  x_0 .. x_{m-1}, y_m      m accepted proposals (0 <= m <= K) and
                                          one token y_m from the target at position m

Every emitted token follows the target's distribution exactly as without
speculation. p_j is the sampler's processed distribution at position j: its
penalties and min_new_tokens see ``output_ids + x[:j]``, then the grammar mask,
temperature, top-k, top-p, min-p. Two ways to decide m:

- **deterministic proposals** (n-gram and radix: q_j is one-hot on x_j) and every
  greedy row: the ``Sampler`` itself draws y_j ~ p_j at every position, as it would
  without speculation (same stages, same grammar masks, a seeded row's stream keyed
  by (seed, step)), and m is the first j with y_j != x_j. That *is* rejection
  sampling with a one-hot q: x_j is accepted with probability p_j(x_j) =
  min(1, p_j(x_j) / q_j(x_j)), and a rejected y_j follows p_j without x_j,
  renormalised, which is normalize(max(0, p_j - q_j)). Greedy rows accept while
  x_j == argmax and then emit the argmax; a seeded row emits, token for token,
  what it emits without speculation.
- **draft distributions** (a draft model gives q_j; x_j was drawn from it):
  rejection sampling (Leviathan et al. 2023; Chen et al. 2023): accept x_j when
  u * q_j(x_j) < p_j(x_j), u ~ U[0, 1); at the first rejection draw y_j from
  normalize(max(0, p_j - q_j)); after K acceptances draw the bonus y_K from p_K.
  A seeded row's u and draw come from its own generator keyed by (seed, step).

p for the draft path is built from the sampler's own stages (``adjust_logits``,
``scale_logits``, ``nucleus``, its grouping), so it is the distribution the sampler
draws from by construction, not a second implementation (the sampler module exports
its stages for this; its grouping, ``Sampler._group_key``, is still private).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from radixlm.kernels.bitmask import apply_token_bitmask
from radixlm.runtime.device import to_host
from radixlm.runtime.sampling.sampler import (
    SampleOutput,
    Sampler,
    SamplingRow,
    adjust_logits,
    draw,
    mix_seed,
    nucleus,
    scale_logits,
    with_logprobs,
)

__all__ = ["VerifyOutput", "VerifyRow", "Verifier"]


@dataclass(frozen=True)
class VerifyRow:
    """One row of a verify step.

    Attributes:
        sampling: the row's sampling state before this step (``output_ids``: the
            tokens emitted so far, without the proposals).
        proposal: the K proposed token ids (K = 0: an ordinary decode step).
        draft_probs: (K, V) the draft's distribution q at each proposal (x_j was
            drawn from row j), or None for a deterministic proposer (q one-hot).
    """

    sampling: SamplingRow
    proposal: Sequence[int]
    draft_probs: torch.Tensor | None = None

    @property
    def num_positions(self) -> int:
        """Logits rows this row occupies: one per proposal, plus the bonus position."""
        return len(self.proposal) + 1


@dataclass(frozen=True)
class VerifyOutput:
    """What one verify step returns.

    Attributes:
        token_ids: per row, the tokens to append: its accepted proposals, then one
            token from the target (1 to K + 1 tokens).
        logprobs: the emitted tokens' logprobs (as ``Sampler.sample`` returns them:
            the raw distribution at each token's position), flat in row order;
            None unless requested.
    """

    token_ids: list[list[int]]
    logprobs: SampleOutput | None = None

    @property
    def num_accepted(self) -> list[int]:
        """Accepted proposals per row."""
        return [len(ids) - 1 for ids in self.token_ids]


class Verifier:
    """Decides which proposals a batch of rows keeps (see the module docstring).

    Args:
        sampler: the engine's sampler; deterministic proposals are verified with
            its draws, so its shared stream advances by one draw per position.
        seed: seeds the stream that unseeded draft-distribution rows draw from.
    """

    def __init__(self, sampler: Sampler, seed: int = 0) -> None:
        self._sampler = sampler
        self._seed = seed
        self._generators: dict[str, torch.Generator] = {}

    def verify(
        self,
        logits: torch.Tensor,
        rows: Sequence[VerifyRow],
        return_logprobs: bool = False,
        grammar_bitmask: torch.Tensor | None = None,
        grammar_rows: torch.Tensor | None = None,
    ) -> VerifyOutput:
        """Accepts a prefix of each row's proposals and draws one more token.

        Args:
            logits: (N, V) raw logits, N = sum of ``row.num_positions``, laid out
                row after row as drawn in the module docstring; not modified.
            rows: the rows, in the logits' order.
            return_logprobs: also return the emitted tokens' logprobs.
            grammar_bitmask: (G, W) int32 allowed-token masks for logits rows
                ``grammar_rows`` (G,), one per constrained position (None: all N
                rows in order).

        Raises:
            ValueError: logits do not have shape (N, V), a proposed token is out of
                the vocabulary, or a row's draft_probs is not (K, V).
        """
        self._check_inputs(logits, rows)
        offsets = _offsets(rows)
        position_rows = [_at_position(row, j) for row in rows for j in range(row.num_positions)]
        direct = [i for i, r in enumerate(rows) if _is_direct(r)]
        drafted = [i for i, r in enumerate(rows) if not _is_direct(r)]
        emitted: list[list[int]] = [[] for _ in rows]
        masks = (grammar_bitmask, grammar_rows)
        if direct:
            positions = _positions(rows, offsets, direct)
            subset = [position_rows[p] for p in positions]
            bitmask, index = _select_masks(masks, positions, len(logits))
            drawn = self._sampler.sample(logits[positions], subset, False, bitmask, index)
            (drawn_ids,) = to_host(drawn.next_token_ids)  # the step's one wait
            _split_matching(drawn_ids.tolist(), rows, direct, emitted)
        if drafted:
            positions = _positions(rows, offsets, drafted)
            subset = [position_rows[p] for p in positions]
            bitmask, index = _select_masks(masks, positions, len(logits))
            probs = self.target_probs(logits[positions], subset, bitmask, index)
            start = 0
            for i in drafted:
                n = rows[i].num_positions
                emitted[i] = self._reject_sample(rows[i], probs[start : start + n])
                start += n
        if not return_logprobs:
            return VerifyOutput(emitted)
        return VerifyOutput(emitted, _emitted_logprobs(logits, position_rows, offsets, emitted))

    def target_probs(
        self,
        logits: torch.Tensor,
        rows: Sequence[SamplingRow],
        grammar_bitmask: torch.Tensor | None = None,
        grammar_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(n, V) raw logits -> (n, V) float32 distributions the sampler draws from,
        each summing to 1 (greedy rows: one-hot on the argmax)."""
        logits = logits.float()
        adjusted = adjust_logits(logits, rows)
        if grammar_bitmask is not None:
            adjusted = adjusted.clone() if adjusted is logits else adjusted
            apply_token_bitmask(adjusted, grammar_bitmask.to(logits.device), grammar_rows)
        probs = torch.zeros_like(adjusted)
        for (kind, k), idx in self._groups(rows).items():
            index = torch.tensor(idx, dtype=torch.long, device=logits.device)
            sub = adjusted.index_select(0, index)
            probs.index_copy_(0, index, self._processed(sub, [rows[i] for i in idx], kind, k))
        return probs / probs.sum(dim=-1, keepdim=True)

    def _groups(self, rows: Sequence[SamplingRow]) -> dict[tuple[str, int], list[int]]:
        """Rows by how the sampler finds their candidates (``Sampler._group_key``);
        greedy rows under ("greedy", 0)."""
        groups: dict[tuple[str, int], list[int]] = {}
        for i, row in enumerate(rows):
            greedy = row.params.is_greedy
            key = ("greedy", 0) if greedy else self._sampler._group_key(row.params)
            groups.setdefault(key, []).append(i)
        return groups

    def _processed(
        self, adjusted: torch.Tensor, rows: list[SamplingRow], kind: str, k: int
    ) -> torch.Tensor:
        """(n, V) adjusted logits of one group -> (n, V) unnormalised weights: the
        sampler's candidates (its k best, or all V sorted) after top_p / min_p."""
        if kind == "greedy":
            one_hot = torch.zeros_like(adjusted)
            return one_hot.scatter_(1, adjusted.argmax(dim=-1, keepdim=True), 1.0)
        scaled = scale_logits(adjusted, rows)
        if kind == "top_k":
            cand, ids = scaled.topk(k, dim=-1)  # (n, k), as Sampler._sample_top_k
            weights = cand.softmax(dim=-1)
        else:  # "plain" and "top_p": the same kept set as the sampler's top-256 shortcut
            weights, ids = scaled.softmax(dim=-1).sort(dim=-1, descending=True, stable=True)
        return torch.zeros_like(scaled).scatter_(1, ids, nucleus(weights, rows))

    def _reject_sample(self, row: VerifyRow, probs: torch.Tensor) -> list[int]:
        """Rejection sampling over one row's (K + 1, V) target distributions."""
        assert row.draft_probs is not None
        q = row.draft_probs.to(device=probs.device, dtype=torch.float32)
        accepted: list[int] = []
        for j, token in enumerate(row.proposal):
            generator = self._generator(row.sampling, j, probs.device)
            u = float(torch.rand(1, generator=generator, dtype=torch.float64, device=probs.device))
            if u * float(q[j, token]) < float(probs[j, token]):
                accepted.append(int(token))
                continue
            residual = (probs[j] - q[j]).clamp_min(0.0)
            if not float(residual.sum()) > 0.0:  # p == q up to rounding: nothing to correct
                residual = probs[j]
            return accepted + [self._draw_one(residual, row.sampling, generator)]
        k = len(row.proposal)
        generator = self._generator(row.sampling, k, probs.device)
        return accepted + [self._draw_one(probs[k], row.sampling, generator)]

    def _draw_one(self, weights: torch.Tensor, row: SamplingRow, gen: torch.Generator) -> int:
        """A token drawn with probability ~ ``weights`` (V,): an exponential race for
        seeded rows (as the sampler's), the inverse CDF for the others."""
        device = weights.device
        if row.params.seed is None:
            u = torch.rand(1, generator=gen, dtype=torch.float64, device=device)
            return int(draw(weights[None], u)[0])
        u = torch.rand(weights.shape[0], generator=gen, dtype=torch.float64, device=device)
        score = torch.where(weights > 0, weights.double() / u.log_().neg_(), -1.0)
        return int(score.argmax())

    def _generator(self, row: SamplingRow, position: int, device: torch.device) -> torch.Generator:
        """A seeded row's own stream for output step len(output_ids) + position; else
        the verifier's shared stream."""
        if row.params.seed is not None:
            generator = torch.Generator(device=device)
            generator.manual_seed(mix_seed(row.params.seed, len(row.output_ids) + position))
            return generator
        key = str(device)
        if key not in self._generators:
            self._generators[key] = torch.Generator(device=device).manual_seed(self._seed)
        return self._generators[key]

    def _check_inputs(self, logits: torch.Tensor, rows: Sequence[VerifyRow]) -> None:
        vocab = self._sampler.vocab_size
        expected = (sum(r.num_positions for r in rows), vocab)
        if logits.dim() != 2 or tuple(logits.shape) != expected:
            raise ValueError(f"expected logits of shape {expected}, got {tuple(logits.shape)}")
        for row in rows:
            if any(not 0 <= t < vocab for t in row.proposal):
                raise ValueError(f"proposed tokens must lie in [0, {vocab}): {row.proposal}")
            q = row.draft_probs
            if q is not None and tuple(q.shape) != (len(row.proposal), vocab):
                shape = (len(row.proposal), vocab)
                raise ValueError(f"expected draft_probs of shape {shape}, got {tuple(q.shape)}")


def _is_direct(row: VerifyRow) -> bool:
    """Verified by the sampler's own draws: deterministic proposals and greedy rows."""
    return row.draft_probs is None or row.sampling.params.is_greedy


def _at_position(row: VerifyRow, j: int) -> SamplingRow:
    """The sampling row at position j: as if proposals x[:j] were already emitted."""
    if j == 0:
        return row.sampling
    outputs = row.sampling.output_ids
    if isinstance(outputs, torch.Tensor):
        more = torch.tensor(list(row.proposal[:j]), dtype=outputs.dtype, device=outputs.device)
        return dataclasses.replace(row.sampling, output_ids=torch.cat([outputs, more]))
    return dataclasses.replace(row.sampling, output_ids=[*outputs, *row.proposal[:j]])


def _offsets(rows: Sequence[VerifyRow]) -> list[int]:
    """Each row's first logits row."""
    offsets, total = [], 0
    for row in rows:
        offsets.append(total)
        total += row.num_positions
    return offsets


def _positions(rows: Sequence[VerifyRow], offsets: list[int], which: list[int]) -> list[int]:
    """The logits rows of rows ``which``, in order."""
    return [p for i in which for p in range(offsets[i], offsets[i] + rows[i].num_positions)]


def _select_masks(
    masks: tuple[torch.Tensor | None, torch.Tensor | None], positions: list[int], num_rows: int
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The bitmask rows that apply to ``positions``, re-indexed to the subset's rows."""
    bitmask, rows = masks
    if bitmask is None:
        return None, None
    targets = list(range(num_rows)) if rows is None else rows.tolist()
    local = {p: i for i, p in enumerate(positions)}
    keep = [g for g, p in enumerate(targets) if p in local]
    if not keep:
        return None, None
    index = torch.tensor([local[targets[g]] for g in keep], dtype=torch.long)
    return bitmask[torch.tensor(keep, device=bitmask.device)], index


def _split_matching(
    drawn: list[int], rows: Sequence[VerifyRow], which: list[int], emitted: list[list[int]]
) -> None:
    """Fills ``emitted[i]`` for rows ``which`` from their draws at every position: the
    draws up to and including the first that differs from the proposal."""
    start = 0
    for i in which:
        proposal, n = rows[i].proposal, rows[i].num_positions
        m = 0
        while m < len(proposal) and drawn[start + m] == proposal[m]:
            m += 1
        emitted[i] = drawn[start : start + m + 1]
        start += n


def _emitted_logprobs(
    logits: torch.Tensor,
    position_rows: list[SamplingRow],
    offsets: list[int],
    emitted: list[list[int]],
) -> SampleOutput:
    """Logprobs of the emitted tokens from the raw logits at their positions."""
    positions = [offsets[i] + t for i, ids in enumerate(emitted) for t in range(len(ids))]
    tokens = torch.tensor([t for ids in emitted for t in ids], device=logits.device)
    return with_logprobs(logits[positions].float(), [position_rows[p] for p in positions], tokens)
