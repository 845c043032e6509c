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

Penalties are the HF/vLLM ones: repetition divides a positive logit (multiplies
a negative one) by the penalty for every token seen in prompt or output;
frequency/presence subtract ``count * frequency + presence`` for tokens in the
output (OpenAI/SGLang semantics). Their cost is O(tokens seen), not O(V).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from radixlm.kernels.bitmask import apply_token_bitmask
from radixlm.kernels.cpu.token_bitmask import TokenBitmaskKernel
from radixlm.kernels.sampling import masked_sample
from radixlm.runtime.io.sampling_params import SamplingParams

__all__ = [
    "SamplingRow",
    "SampleOutput",
    "Sampler",
    # the sampler's stages, public for speculative verification (runtime/speculative)
    "adjust_logits",
    "draw",
    "mix_seed",
    "nucleus",
    "scale_logits",
    "with_logprobs",
]

_MASK64 = (1 << 64) - 1
# How many of the most likely tokens a top_p row looks at before sorting all V.
_NUCLEUS_CANDIDATES = 256
# Columns per block of the two-level inverse CDF (see draw).
_CDF_BLOCK = 256


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
            temperature, top-k, top-p and the draw in one pass per row: one Triton
            launch on a GPU) whenever no row uses min_p. None: on CUDA only. The
            fused draw walks the vocabulary in id order, the staged path in
            probability order: the same distribution, other tokens for the same u.
        cpu_bitmask: the C++ pass that applies grammar masks to CPU logits (the torch
            ops without it: the same result, ~10x the time).
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
        self._seed = seed
        self._fused = fused
        self._cpu_bitmask = cpu_bitmask
        self._generators: dict[str, torch.Generator] = {}
        # One draw per group kind (see _groups): (scaled logits, rows, top_k) -> token ids.
        self._samplers: dict[str, Callable[[torch.Tensor, list[SamplingRow], int], torch.Tensor]]
        self._samplers = {
            "plain": self._sample_plain,
            "top_k": self._sample_top_k,
            "top_p": self._sample_top_p,
        }

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
                (G,); tokens whose bit is 0 are never sampled.

        Raises:
            ValueError: logits do not have shape (len(rows), vocab_size), or a
                row asks for a negative number of top logprobs.
        """
        self._check_inputs(logits, rows)
        logits = logits.float()  # (B, V)
        adjusted = adjust_logits(logits, rows)
        if self._fuses(logits, rows):
            next_ids = self._sample_fused(adjusted, rows, grammar_bitmask, grammar_rows)
        else:
            next_ids = self._sample_staged(adjusted, logits, rows, grammar_bitmask, grammar_rows)
        if not return_logprobs:
            return SampleOutput(next_ids)
        return with_logprobs(logits, rows, next_ids)

    def _fuses(self, logits: torch.Tensor, rows: Sequence[SamplingRow]) -> bool:
        """The fused kernel draws by inverse CDF: not for min_p, nor for seeded rows
        (their exponential race keeps them batch-invariant)."""
        wanted = logits.is_cuda if self._fused is None else self._fused
        return wanted and all(r.params.min_p == 0 and r.params.seed is None for r in rows)

    def _sample_fused(
        self,
        logits: torch.Tensor,
        rows: Sequence[SamplingRow],
        grammar_bitmask: torch.Tensor | None,
        grammar_rows: torch.Tensor | None,
    ) -> torch.Tensor:
        """One masked_sample call; unconstrained rows get an all-ones bitmask row."""
        device = logits.device
        bitmask = None
        if grammar_bitmask is not None:
            width = grammar_bitmask.shape[1]
            bitmask = torch.full((len(rows), width), -1, dtype=torch.int32, device=device)
            index = grammar_rows if grammar_rows is not None else torch.arange(len(rows))
            bitmask[index.to(device)] = grammar_bitmask.to(device)
        temperatures = [0.0 if r.params.is_greedy else r.params.temperature for r in rows]
        return masked_sample(
            logits,
            bitmask,
            torch.tensor(temperatures, device=device),
            torch.tensor([max(r.params.top_k, 0) for r in rows], device=device),
            _row_values(rows, "top_p", device),
            self._shared_uniforms(len(rows), device).float(),
        )

    def _sample_staged(
        self,
        adjusted: torch.Tensor,
        logits: torch.Tensor,
        rows: Sequence[SamplingRow],
        grammar_bitmask: torch.Tensor | None,
        grammar_rows: torch.Tensor | None,
    ) -> torch.Tensor:
        """The grammar mask, then the greedy / plain / top-k / top-p groups."""
        if grammar_bitmask is not None:
            if adjusted is logits:
                adjusted = logits.clone()  # the raw logits stay intact for logprobs
            index = _row_index(grammar_rows, len(rows))
            if self._cpu_bitmask is not None and adjusted.device.type == "cpu":
                self._cpu_bitmask.apply(adjusted, grammar_bitmask, index)
            else:
                apply_token_bitmask(adjusted, grammar_bitmask.to(logits.device), index)
        return self._choose(adjusted, rows)

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
        for (kind, top_k), idx in self._groups(rows).items():
            sub_rows = [rows[i] for i in idx]
            scaled = scale_logits(_take(logits, idx), sub_rows)  # (n, V)
            next_ids[_index(idx, logits)] = self._samplers[kind](scaled, sub_rows, top_k)
        return next_ids

    def _groups(self, rows: Sequence[SamplingRow]) -> dict[tuple[str, int], list[int]]:
        """Sampled (non-greedy) rows by how their candidates are found.

        "top_k": the row's own k most likely tokens (grouped by k, not padded
        to the batch's largest k, so a row's arithmetic never depends on its
        neighbours); "top_p": the nucleus over all V; "plain": all V tokens.
        """
        groups: dict[tuple[str, int], list[int]] = {}
        for i, row in enumerate(rows):
            if not row.params.is_greedy:
                groups.setdefault(self._group_key(row.params), []).append(i)
        return groups

    def _group_key(self, params: SamplingParams) -> tuple[str, int]:
        if 1 < params.top_k < self.vocab_size:
            return ("top_k", params.top_k)
        return ("top_p", 0) if params.top_p < 1.0 else ("plain", 0)

    def _sample_plain(self, scaled: torch.Tensor, rows: list[SamplingRow], _: int) -> torch.Tensor:
        """All V tokens are candidates (min_p aside): no sorting needed."""
        probs = scaled.softmax(dim=-1)  # (n, V)
        if any(r.params.min_p > 0 for r in rows):
            min_p = _row_values(rows, "min_p", probs.device)[:, None]
            probs = probs.masked_fill(probs < min_p * probs.amax(dim=-1, keepdim=True), 0.0)
        return self._draw(probs, None, rows)

    def _sample_top_k(self, scaled: torch.Tensor, rows: list[SamplingRow], k: int) -> torch.Tensor:
        """Candidates: the k most likely tokens, renormalised (as HF), then top_p / min_p."""
        cand, ids = scaled.topk(k, dim=-1)  # (n, k), sorted descending
        probs = nucleus(cand.softmax(dim=-1), rows)
        return ids.gather(1, self._draw(probs, ids, rows)[:, None]).squeeze(1)

    def _sample_top_p(self, scaled: torch.Tensor, rows: list[SamplingRow], _: int) -> torch.Tensor:
        """Nucleus over all V tokens without a full sort where the top candidates suffice.

        Sorting 32 x 49k floats costs ~100x a top-256; the nucleus almost
        always lies inside the top 256, and a row whose does not is sorted fully.
        Either way the kept set and its order are the same, and so is the draw.
        """
        probs = scaled.softmax(dim=-1)  # (n, V)
        width = min(_NUCLEUS_CANDIDATES, probs.shape[1])
        cand, ids = probs.topk(width, dim=-1)  # (n, C)
        top_p = _row_values(rows, "top_p", probs.device)
        covered = cand.cumsum(dim=-1)[:, -1] >= top_p
        if width == probs.shape[1] or bool(covered.all()):
            return self._pick(cand, ids, rows)
        out = torch.empty(len(rows), dtype=torch.long, device=probs.device)
        inside = covered.nonzero().squeeze(1).tolist()
        outside = (~covered).nonzero().squeeze(1).tolist()
        if inside:
            sub = [rows[j] for j in inside]
            out[_index(inside, out)] = self._pick(_take(cand, inside), _take(ids, inside), sub)
        full, full_ids = _take(probs, outside).sort(dim=-1, descending=True, stable=True)
        out[_index(outside, out)] = self._pick(full, full_ids, [rows[j] for j in outside])
        return out

    def _pick(self, cand: torch.Tensor, ids: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
        """Draw from (n, C) sorted candidate probabilities after top_p / min_p."""
        probs = nucleus(cand, rows)
        return ids.gather(1, self._draw(probs, ids, rows)[:, None]).squeeze(1)

    def _draw(
        self, weights: torch.Tensor, ids: torch.Tensor | None, rows: Sequence[SamplingRow]
    ) -> torch.Tensor:
        """(n, C) non-negative weights of candidates ``ids`` (n, C) (None: column j
        is token j) -> (n,) column drawn with probability ~ weight: by inverse CDF
        for unseeded rows, by an exponential race for seeded ones."""
        seeded = _indices(rows, lambda r: r.params.seed is not None)
        if not seeded:
            return draw(weights, self._shared_uniforms(len(rows), weights.device))
        columns = torch.empty(len(rows), dtype=torch.long, device=weights.device)
        unseeded = [j for j in range(len(rows)) if rows[j].params.seed is None]
        if unseeded:
            u = self._shared_uniforms(len(unseeded), weights.device)
            columns[_index(unseeded, columns)] = draw(_take(weights, unseeded), u)
        sub_ids = None if ids is None else _take(ids, seeded)
        races = self._race(_take(weights, seeded), sub_ids, [rows[j] for j in seeded])
        columns[_index(seeded, columns)] = races
        return columns

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
            torch.rand(self.vocab_size, generator=self._seeded_generator(row, device), out=u[j])
        if ids is not None:
            u = u.gather(1, ids)
        exponential = u.log_().neg_()  # (n, C); u = 0 gives inf, so that token loses
        score = torch.where(weights > 0, weights.double() / exponential, -1.0)
        return score.argmax(dim=1)

    def _shared_uniforms(self, n: int, device: torch.device) -> torch.Tensor:
        """(n,) float64 in [0, 1) from the sampler's shared stream (unseeded rows)."""
        generator = self._shared_generator(device)
        return torch.rand(n, generator=generator, dtype=torch.float64, device=device)

    def _seeded_generator(self, row: SamplingRow, device: torch.device) -> torch.Generator:
        assert row.params.seed is not None
        generator = torch.Generator(device=device)
        generator.manual_seed(mix_seed(row.params.seed, row.num_output))
        return generator

    def _shared_generator(self, device: torch.device) -> torch.Generator:
        key = str(device)
        if key not in self._generators:
            generator = torch.Generator(device=device)
            generator.manual_seed(self._seed)
            self._generators[key] = generator
        return self._generators[key]


def scale_logits(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
    """logits / temperature per row; rows all at temperature 1 skip the pass."""
    if all(r.params.temperature == 1.0 for r in rows):
        return logits
    return logits / _row_values(rows, "temperature", logits.device)[:, None]


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


def nucleus(probs: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
    """Zero out what top_p and min_p drop from (n, C) probabilities sorted descending.

    top_p keeps the smallest prefix whose mass reaches top_p; min_p keeps p >=
    min_p * p_max; the first candidate always survives (a top_p that rounds to 0 in
    float32, e.g. 1e-46, keeps exactly the most likely token).
    """
    device = probs.device
    # top_p = 1 must keep everything even where rounding lets the cumsum pass 1.
    top_p = _row_values(rows, "top_p", device)
    top_p = torch.where(top_p < 1.0, top_p, torch.inf)[:, None]
    drop = (probs.cumsum(dim=-1) - probs) >= top_p
    min_p = _row_values(rows, "min_p", device)[:, None]
    drop |= probs < min_p * probs[:, :1]
    drop[:, 0] = False
    return probs.masked_fill(drop, 0.0)


def adjust_logits(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
    """Penalties and min_new_tokens; returns ``logits`` itself when no row needs them."""
    rep = _indices(rows, lambda r: r.params.repetition_penalty != 1.0)
    add = _indices(
        rows, lambda r: r.params.frequency_penalty != 0 or r.params.presence_penalty != 0
    )
    suppress = _indices(rows, lambda r: r.num_output < r.params.min_new_tokens)
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


def _indices(rows: Sequence[SamplingRow], wanted: Callable[[SamplingRow], bool]) -> list[int]:
    return [i for i, row in enumerate(rows) if wanted(row)]


def _row_index(rows: torch.Tensor | None, num_rows: int) -> torch.Tensor | None:
    """None when the bitmask covers every row in order: the kernel then masks in place
    instead of gathering and scattering rows (half the work)."""
    if rows is None or (len(rows) == num_rows and bool((rows == torch.arange(num_rows)).all())):
        return None
    return rows


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


def mix_seed(seed: int, step: int) -> int:
    """A 63-bit generator seed from (seed, step): splitmix64, so nearby pairs differ widely."""
    x = (seed * 0x9E3779B97F4A7C15 + step + 0x632BE59BD9B4E019) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) >> 1
