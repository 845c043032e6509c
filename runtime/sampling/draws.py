"""The staged path's draws, after the logits are adjusted (penalties, grammar masks):
greedy, plain, top-k and top-p groups, each drawn by inverse CDF (unseeded rows, from
the sampler's shared stream) or by an exponential race (seeded rows); see
``radixlm.runtime.sampling.sampler`` for the stages and why seeded rows race.

The stateless stages (``scale_logits``, ``nucleus``, ``draw``, ``mix_seed``) are shared
with speculative verification and drafting (``radixlm.runtime.speculative``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from radixlm.runtime.device import to_host
from radixlm.runtime.sampling.plan import RowGroup, RowParams, SamplingPlan

if TYPE_CHECKING:
    from radixlm.runtime.sampling.sampler import SamplingRow

__all__ = ["SharedStream", "StagedDraws", "draw", "mix_seed", "nucleus", "scale_logits"]

_MASK64 = (1 << 64) - 1
# How many of the most likely tokens a top_p row looks at before sorting all V.
_NUCLEUS_CANDIDATES = 256
# Columns per block of the two-level inverse CDF (see draw).
_CDF_BLOCK = 256
_GroupSampler = Callable[[torch.Tensor, Sequence["SamplingRow"], RowParams, int], torch.Tensor]


class SharedStream:
    """The random stream of rows without a seed: one generator per device, seeded once."""

    def __init__(self, seed: int) -> None:
        self._seed = seed
        self._generators: dict[str, torch.Generator] = {}

    def generator(self, device: torch.device) -> torch.Generator:
        key = str(device)
        if key not in self._generators:
            generator = torch.Generator(device=device)
            generator.manual_seed(self._seed)
            self._generators[key] = generator
        return self._generators[key]

    def uniforms(self, n: int, device: torch.device) -> torch.Tensor:
        """(n,) float64 in [0, 1)."""
        return torch.rand(n, generator=self.generator(device), dtype=torch.float64, device=device)


class StagedDraws:
    """Draws the next token of each row group of a ``SamplingPlan`` (its adjusted logits).

    Args:
        vocab_size: the logits' width V (a seeded row draws V uniforms per step).
        stream: the shared stream of unseeded rows.
    """

    def __init__(self, vocab_size: int, stream: SharedStream) -> None:
        self.vocab_size = vocab_size
        self._stream = stream
        # One draw per sampled group kind (plan.group_key):
        # (scaled logits, the group's rows, their parameters, top_k) -> token ids.
        self._samplers: dict[str, _GroupSampler] = {
            "plain": self._sample_plain,
            "top_k": self._sample_top_k,
            "top_p": self._sample_top_p,
        }

    def choose(self, logits: torch.Tensor, plan: SamplingPlan) -> torch.Tensor:
        """(B, V) adjusted logits -> (B,) token ids, one group (a slice of the plan's
        order) at a time."""
        if plan.all_greedy:
            return logits.argmax(dim=-1)
        ordered = plan.ordered(logits)  # (B, V), groups back to back
        picks = [self._choose_group(ordered[g.span], g, plan) for g in plan.groups]
        return plan.restored(torch.cat(picks))

    def _choose_group(
        self, logits: torch.Tensor, group: RowGroup, plan: SamplingPlan
    ) -> torch.Tensor:
        if group.kind == "greedy":
            return logits.argmax(dim=-1)
        params = plan.params(group)
        scaled = scale_logits(logits, group.rows, params)  # (n, V)
        return self._samplers[group.kind](scaled, group.rows, params, group.top_k)

    def _sample_plain(
        self, scaled: torch.Tensor, rows: Sequence[SamplingRow], params: RowParams, _: int
    ) -> torch.Tensor:
        """All V tokens are candidates (min_p aside): no sorting needed."""
        probs = scaled.softmax(dim=-1)  # (n, V)
        if any(r.params.min_p > 0 for r in rows):
            min_p = params.min_p[:, None]
            probs = probs.masked_fill(probs < min_p * probs.amax(dim=-1, keepdim=True), 0.0)
        return self._draw(probs, None, rows)

    def _sample_top_k(
        self, scaled: torch.Tensor, rows: Sequence[SamplingRow], params: RowParams, k: int
    ) -> torch.Tensor:
        """Candidates: the k most likely tokens, renormalised (as HF), then top_p / min_p."""
        cand, ids = scaled.topk(k, dim=-1)  # (n, k), sorted descending
        probs = nucleus(cand.softmax(dim=-1), params)
        return ids.gather(1, self._draw(probs, ids, rows)[:, None]).squeeze(1)

    def _sample_top_p(
        self, scaled: torch.Tensor, rows: Sequence[SamplingRow], params: RowParams, _: int
    ) -> torch.Tensor:
        """Nucleus over all V tokens without a full sort where the top candidates suffice.

        Sorting the whole vocabulary costs far more than a top-256; the nucleus almost
        always lies inside the top 256, and a row whose does not is sorted fully.
        Either way the kept set and its order are the same, and so is the draw.
        Which rows need the sort is read back once (one ``to_host``): a branch on the
        data, kept for its speed on the CPU. On CUDA ``masked_sample`` samples instead
        (no sort, no read back), unless the sampler is built with ``fused=False``.
        """
        probs = scaled.softmax(dim=-1)  # (n, V)
        width = min(_NUCLEUS_CANDIDATES, probs.shape[1])
        cand, ids = probs.topk(width, dim=-1)  # (n, C)
        if width == probs.shape[1]:
            return self._pick(cand, ids, rows, params)
        covered = cand.cumsum(dim=-1)[:, -1] >= params.top_p  # (n,)
        (covered_host,) = to_host(covered)
        if bool(covered_host.all()):
            return self._pick(cand, ids, rows, params)
        return self._pick_split(probs, cand, ids, rows, params, covered, covered_host.tolist())

    def _pick_split(
        self,
        probs: torch.Tensor,
        cand: torch.Tensor,
        ids: torch.Tensor,
        rows: Sequence[SamplingRow],
        params: RowParams,
        covered: torch.Tensor,
        covered_host: list[bool],
    ) -> torch.Tensor:
        """The draw of top_p rows of which some nuclei lie beyond the candidates: those
        rows draw from all V sorted, after the covered ones (each part keeps the rows'
        order, so both stay unseeded first)."""
        inside = [r for r, c in zip(rows, covered_host) if c]
        outside = [r for r, c in zip(rows, covered_host) if not c]
        # covered rows first, each part in order: the index never leaves the device
        order = torch.argsort((~covered).to(torch.uint8), stable=True)
        picks = []
        if inside:
            at = order[: len(inside)]
            picks.append(self._pick(cand[at], ids[at], inside, params.take(at)))
        at = order[len(inside) :]
        full, full_ids = probs[at].sort(dim=-1, descending=True, stable=True)
        picks.append(self._pick(full, full_ids, outside, params.take(at)))
        out = torch.empty(len(rows), dtype=torch.long, device=probs.device)
        out[order] = torch.cat(picks)
        return out

    def _pick(
        self,
        cand: torch.Tensor,
        ids: torch.Tensor,
        rows: Sequence[SamplingRow],
        params: RowParams,
    ) -> torch.Tensor:
        """Draw from (n, C) sorted candidate probabilities after top_p / min_p."""
        probs = nucleus(cand, params)
        return ids.gather(1, self._draw(probs, ids, rows)[:, None]).squeeze(1)

    def _draw(
        self, weights: torch.Tensor, ids: torch.Tensor | None, rows: Sequence[SamplingRow]
    ) -> torch.Tensor:
        """(n, C) non-negative weights of candidates ``ids`` (n, C) (None: column j
        is token j) -> (n,) column drawn with probability ~ weight: by inverse CDF
        for unseeded rows, by an exponential race for seeded ones. ``rows``: unseeded
        first (as a plan orders each group), so each part is a slice."""
        num_unseeded = sum(r.params.seed is None for r in rows)
        assert all(r.params.seed is not None for r in rows[num_unseeded:]), "unseeded first"
        if num_unseeded == len(rows):
            return draw(weights, self._stream.uniforms(len(rows), weights.device))
        columns = []
        if num_unseeded:
            u = self._stream.uniforms(num_unseeded, weights.device)
            columns.append(draw(weights[:num_unseeded], u))
        seeded_ids = None if ids is None else ids[num_unseeded:]
        columns.append(self._race(weights[num_unseeded:], seeded_ids, rows[num_unseeded:]))
        return torch.cat(columns)

    def _race(
        self, weights: torch.Tensor, ids: torch.Tensor | None, rows: Sequence[SamplingRow]
    ) -> torch.Tensor:
        """(n,) the column maximising weight / E per row, E = -log(u) ~ Exp(1) with u
        drawn per token id from the row's (seed, step) stream: column j wins with
        probability w_j / sum(w), and the token's noise does not depend on which
        candidates a row has or where they sit."""
        device = weights.device
        u = torch.empty(len(rows), self.vocab_size, dtype=torch.float64, device=device)
        for j, row in enumerate(rows):
            torch.rand(self.vocab_size, generator=_seeded_generator(row, device), out=u[j])
        if ids is not None:
            u = u.gather(1, ids)
        exponential = u.log_().neg_()  # (n, C); u = 0 gives inf, so that token loses
        score = torch.where(weights > 0, weights.double() / exponential, -1.0)
        return score.argmax(dim=1)


def _seeded_generator(row: SamplingRow, device: torch.device) -> torch.Generator:
    """The row's own stream at this step: seeded from (its seed, its outputs so far)."""
    assert row.params.seed is not None
    generator = torch.Generator(device=device)
    generator.manual_seed(mix_seed(row.params.seed, row.num_output))
    return generator


def scale_logits(
    logits: torch.Tensor, rows: Sequence[SamplingRow], params: RowParams
) -> torch.Tensor:
    """logits / temperature per row (``params``: the rows' own, on the logits' device);
    rows all at temperature 1 skip the pass."""
    if all(r.params.temperature == 1.0 for r in rows):
        return logits
    return logits / params.temperature[:, None]


def draw(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse CDF: the first column of (n, C) ``weights`` whose running total passes u * total.

    A zero-weight column is never drawn. A running sum over C is sequential
    and costs far more than a plain sum, so it is done in two levels: sums of
    blocks of ``_CDF_BLOCK`` columns pick a block, then a running sum inside
    that block alone picks the column::

        weights   [ block 0 | block 1 | ... | block nb-1 ]    (n, nb * blk)
        block_cdf [  s0     | s0+s1   | ... |  total     ]    (n, nb)
    """
    n = weights.shape[0]
    blocks = _as_blocks(weights)  # (n, nb, blk)
    # Block sums in float32 (a float64 sum would convert all of ``weights``); the
    # running totals in float64: near 1, float32 cannot resolve the tail's tiny weights.
    block_cdf = blocks.sum(dim=-1).double().cumsum(dim=-1)  # (n, nb)
    target = _below(u[:, None] * block_cdf[:, -1:], block_cdf[:, -1:])  # (n, 1)
    block = torch.searchsorted(block_cdf, target, right=True).clamp_max_(blocks.shape[1] - 1)
    before = (block_cdf.gather(1, (block - 1).clamp_min(0)) * (block > 0)).squeeze(1)
    inner = blocks.gather(1, block[:, :, None].expand(n, 1, blocks.shape[2])).squeeze(1)
    inner_cdf = inner.to(torch.float64).cumsum(dim=-1)  # (n, blk)
    inner_target = _below((target.squeeze(1) - before)[:, None], inner_cdf[:, -1:])
    column = torch.searchsorted(inner_cdf, inner_target, right=True).squeeze(1)
    return block.squeeze(1) * blocks.shape[2] + column


def _as_blocks(weights: torch.Tensor) -> torch.Tensor:
    """(n, C) -> (n, nb, blk), zero-padded on the right when C is not a multiple of blk."""
    n, width = weights.shape
    blk = min(_CDF_BLOCK, width)
    pad = -width % blk
    if pad:
        weights = torch.nn.functional.pad(weights, (0, pad))
    return weights.view(n, -1, blk)


def _below(target: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """Clamp strictly below ``total``: u < 1, but u * total (or rounding) can reach it."""
    return torch.minimum(target, torch.nextafter(total, torch.zeros_like(total)))


def nucleus(probs: torch.Tensor, params: RowParams) -> torch.Tensor:
    """Zero out what top_p and min_p drop from (n, C) probabilities sorted descending.

    top_p keeps the smallest prefix whose mass reaches top_p; min_p keeps p >=
    min_p * p_max; the first candidate always survives (a top_p that rounds to 0 in
    float32, e.g. 1e-46, keeps exactly the most likely token). ``params``: the rows'
    own, on the probabilities' device.
    """
    # top_p = 1 must keep everything even where rounding lets the cumsum pass 1.
    top_p = torch.where(params.top_p < 1.0, params.top_p, torch.inf)[:, None]
    drop = (probs.cumsum(dim=-1) - probs) >= top_p
    min_p = params.min_p[:, None]
    drop |= probs < min_p * probs[:, :1]
    drop[:, 0] = False
    return probs.masked_fill(drop, 0.0)


def mix_seed(seed: int, step: int) -> int:
    """A 63-bit generator seed from (seed, step): splitmix64, so nearby pairs differ widely."""
    x = (seed * 0x9E3779B97F4A7C15 + step + 0x632BE59BD9B4E019) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) >> 1
