"""Constrained sampling: bitmask, temperature, top-k, top-p, min-p, then one draw per row.

Row i, with l = logits[i] and every token the bitmask disallows set to -inf:

    no token left (max l == -inf)      -> -1
    temperature < 1e-6 or top_k == 1   -> argmax l, the lowest index among exact ties
    otherwise z = l / temperature and
      top-k  (1 < top_k < V)           keep z >= the k-th largest z (boundary ties kept)
      e      = exp(z - max z) over the kept tokens, 0 elsewhere (unnormalised p)
      top-p  (top_p < 1)               keep e >= tau, the largest element value whose
                                       mass {e >= tau} is >= top_p * sum(e)
                                       (top_p <= 0 keeps only the most likely tokens)
      min-p  (min_p > 0)               keep e >= min_p (max e is 1: p >= min_p * p_max)
      draw                             token j of the kept set K with probability
                                       e_j / sum(e over K)

Every kept set is "all tokens whose z reaches a threshold", ties included. The
reference draws by inverse CDF with one uniform per row: the first j in vocab order
with e_j > 0 whose running sum of kept e exceeds u * (kept mass). The Triton kernel
(``radixlm.kernels.triton.sampling``) draws from the same distribution by an
exponential race over Philox noise keyed by a per-row seed and step, without
sorting; the two agree on greedy rows and on K, not on which token a given random
number picks. ``masked_sample`` takes seeds (a seeded row's draw depends on its
(seed, offset) alone) and on CPU turns them into the reference's uniforms.

Numerics both implementations share:

* z is a correctly rounded float32 division (``div_rn`` in Triton); the top-k
  threshold is an exact order statistic of z (a sort here, a radix select there).
* e is float32(exp(float64(z - max z))). float32 exp differs between libraries
  by 1-2 ulp; float64 exp rounded to float32 agrees but for ~1e-9 of inputs.
* Masses and running sums are float64, summed in different orders, so the kept
  sets can still differ where top_p * mass lies within ~1e-16 (relative) of a
  partial sum: a measure-zero boundary.
* u = 1 (outside [0, 1)) or a rounding miss gives the last kept token.

Logits must not hold NaN or +inf. This module is the plain-torch reference and the
dispatcher (it imports only torch); the kernel is ``radixlm.kernels.triton.sampling``.
"""

from __future__ import annotations

import torch

from radixlm.kernels.bitmask import apply_token_bitmask_reference, check_bitmask

__all__ = [
    "GREEDY_TEMPERATURE",
    "masked_sample",
    "masked_sample_reference",
    "row_uniforms",
]

# Temperatures below this mean greedy, everywhere (SamplingParams.is_greedy reads it):
# dividing logits by a smaller one can overflow float32 (as SGLang).
GREEDY_TEMPERATURE = 1e-6

# ---- plain torch ------------------------------------------------------------------------


def _top_k_mask(z: torch.Tensor, top_ks: torch.Tensor) -> torch.Tensor:
    """(S, V) z, (S,) k -> (S, V) bool: z >= the row's k-th largest z (all if k is off)."""
    vocab_size = z.shape[1]
    active = (top_ks > 1) & (top_ks < vocab_size)  # (S,)
    kth_pos = (top_ks.clamp(1, vocab_size) - 1).long().unsqueeze(1)  # (S, 1)
    kth = z.sort(dim=1, descending=True).values.gather(1, kth_pos)  # (S, 1)
    return (z >= kth) | ~active.unsqueeze(1)


def _top_p_filter(e: torch.Tensor, top_ps: torch.Tensor) -> torch.Tensor:
    """(S, V) float32 e >= 0 -> e with 0 outside each row's nucleus (all kept if top_p >= 1).

    tau is the first sorted value whose descending cumulative mass reaches
    top_p * mass: the largest value with mass {e >= tau} >= top_p * mass.
    """
    sorted_e = e.sort(dim=1, descending=True).values  # (S, V)
    cum = sorted_e.double().cumsum(dim=1)  # (S, V)
    target = top_ps.double() * e.double().sum(dim=1)  # (S,)
    pos = (cum < target.unsqueeze(1)).sum(dim=1).clamp(max=e.shape[1] - 1)  # (S,)
    tau = sorted_e.gather(1, pos.unsqueeze(1))  # (S, 1)
    keep = (e >= tau) | (top_ps >= 1).unsqueeze(1)  # (S, V)
    return torch.where(keep, e, 0.0)


def _draw(w: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """(S, V) kept weights, (S,) u -> (S,) first j, w_j > 0, whose running sum > u * mass.

    If there is none (u = 1, or u within ~1e-16 of 1 and rounding), the last j with w_j > 0.
    """
    w64 = w.double()  # (S, V)
    x = uniforms.double() * w64.sum(dim=1)  # (S,)
    hit = (w64.cumsum(dim=1) > x.unsqueeze(1)) & (w > 0)  # (S, V)
    first = hit.int().argmax(dim=1)  # (S,) first True
    positions = torch.arange(w.shape[1], device=w.device)
    last = torch.where(w > 0, positions, -1).max(dim=1).values  # (S,)
    return torch.where(hit.any(dim=1), first, last)


def _sample_rows(
    masked: torch.Tensor,
    temperatures: torch.Tensor,
    top_ks: torch.Tensor,
    top_ps: torch.Tensor,
    min_ps: torch.Tensor,
    uniforms: torch.Tensor,
) -> torch.Tensor:
    """(S, V) masked logits of rows that sample (T >= 1e-6, top_k != 1, some token
    allowed) -> (S,) token ids."""
    z = masked / temperatures.unsqueeze(1)  # (S, V)
    z_max = z.max(dim=1, keepdim=True).values  # (S, 1)
    e = torch.exp((z - z_max).double()).float()  # (S, V)
    e = torch.where(_top_k_mask(z, top_ks), e, 0.0)
    e = _top_p_filter(e, top_ps)
    e = torch.where(e >= min_ps.unsqueeze(1), e, 0.0)  # max e is exactly 1
    return _draw(e, uniforms)


def masked_sample_reference(
    logits: torch.Tensor,
    bitmask: torch.Tensor | None,
    temperatures: torch.Tensor,
    top_ks: torch.Tensor,
    top_ps: torch.Tensor,
    uniforms: torch.Tensor,
    min_ps: torch.Tensor | None = None,
) -> torch.Tensor:
    """One token per row under a bitmask, temperature, top-k, top-p and min-p (plain torch).

    Args:
        logits: (B, V) float logits (computed in float32); not modified.
        bitmask: (B, ceil(V / 32)) int32 allowed-token bits, or None (all allowed).
        temperatures: (B,) float; < 1e-6 means greedy.
        top_ks: (B,) int; 1 means greedy, <= 0 or >= V means off.
        top_ps: (B,) float in (0, 1]; >= 1 means off, <= 0 keeps only the top ties.
        uniforms: (B,) float in [0, 1), one per row, for the draw (1 draws the
            last kept token).
        min_ps: (B,) float in [0, 1], or None (all 0: off).

    Returns:
        (B,) int64 token ids; -1 for a row with no allowed token.

    Raises:
        ValueError: shapes do not fit together.
    """
    check_sample_args(
        logits, bitmask, temperatures=temperatures, top_ks=top_ks, top_ps=top_ps,
        uniforms=uniforms, min_ps=min_ps,
    )  # fmt: skip
    num_rows, vocab_size = logits.shape
    if num_rows == 0 or vocab_size == 0:
        return torch.full((num_rows,), -1, dtype=torch.int64, device=logits.device)
    device = logits.device
    if min_ps is None:
        min_ps = torch.zeros(num_rows)
    temperatures = per_row(temperatures, torch.float32, device)
    top_ks = per_row(top_ks, torch.int32, device)
    top_ps = per_row(top_ps, torch.float32, device)
    min_ps = per_row(min_ps, torch.float32, device)
    uniforms = per_row(uniforms, torch.float32, device)
    masked = logits.float().clone()  # (B, V)
    if bitmask is not None:
        apply_token_bitmask_reference(masked, bitmask)
    l_max, greedy_ids = masked.max(dim=1)  # (B,) first index among ties
    alive = l_max > float("-inf")  # (B,)
    ids = torch.where(alive, greedy_ids, -1)  # (B,)
    sampled = alive & (temperatures >= GREEDY_TEMPERATURE) & (top_ks != 1)  # (B,)
    rows = sampled.nonzero().squeeze(1)  # (S,)
    if rows.numel():
        ids[rows] = _sample_rows(
            masked[rows], temperatures[rows], top_ks[rows], top_ps[rows], min_ps[rows],
            uniforms[rows],
        )  # fmt: skip
    return ids


def masked_sample(
    logits: torch.Tensor,
    bitmask: torch.Tensor | None,
    temperatures: torch.Tensor,
    top_ks: torch.Tensor,
    top_ps: torch.Tensor,
    seeds: torch.Tensor,
    offsets: torch.Tensor | None = None,
    min_ps: torch.Tensor | None = None,
) -> torch.Tensor:
    """Samples one token per row: Triton on CUDA, the reference elsewhere.

    Args:
        seeds: (B,) int, each row's random stream (its low 64 bits).
        offsets: (B,) int >= 0, each row's step (None: all 0). A row's draw
            depends on its own (seed, offset) and logits alone.
        the others: see :func:`masked_sample_reference`.

    Returns and raises as :func:`masked_sample_reference`.
    """
    if logits.is_cuda:
        from radixlm.kernels.triton.sampling import masked_sample_triton

        return masked_sample_triton(
            logits, bitmask, temperatures, top_ks, top_ps, seeds, offsets, min_ps
        )
    uniforms = row_uniforms(seeds, offsets)
    return masked_sample_reference(
        logits, bitmask, temperatures, top_ks, top_ps, uniforms.to(logits.device), min_ps
    )


def row_uniforms(seeds: torch.Tensor, offsets: torch.Tensor | None = None) -> torch.Tensor:
    """(B,) float64 uniforms in [0, 1), row i's a function of (seeds[i], offsets[i]) alone
    (the CPU stand-in for the kernel's Philox stream; reads the seeds on the host)."""
    if seeds.is_floating_point() or (offsets is not None and offsets.is_floating_point()):
        raise ValueError(f"expected integer seeds and offsets, got {seeds.dtype}")
    steps = [0] * len(seeds) if offsets is None else offsets.tolist()
    out = torch.empty(len(seeds), dtype=torch.float64)
    for i, (seed, step) in enumerate(zip(seeds.tolist(), steps)):
        generator = torch.Generator().manual_seed(_mix(seed, step))
        out[i] = torch.rand((), generator=generator, dtype=torch.float64)
    return out


def _mix(seed: int, step: int) -> int:
    """A 63-bit generator seed from (seed, step): splitmix64."""
    mask = (1 << 64) - 1
    x = (seed * 0x9E3779B97F4A7C15 + step + 0x632BE59BD9B4E019) & mask
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
    return (x ^ (x >> 31)) >> 1


# ---- argument checks --------------------------------------------------------------------


def per_row(values: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return values.to(device=device, dtype=dtype).contiguous()


def check_sample_args(
    logits: torch.Tensor, bitmask: torch.Tensor | None, **rows: torch.Tensor | None
) -> None:
    """Raises ValueError unless logits are (B, V) float, the bitmask fits them and every
    per-row tensor in ``rows`` (None: absent) has shape (B,)."""
    if logits.dim() != 2 or not logits.is_floating_point():
        raise ValueError(f"expected float logits (B, V), got {logits.dtype} {tuple(logits.shape)}")
    num_rows, vocab_size = logits.shape
    if bitmask is not None:
        check_bitmask(bitmask, vocab_size, num_rows)
    for name, values in rows.items():
        if values is not None and tuple(values.shape) != (num_rows,):
            raise ValueError(f"expected {name} of shape ({num_rows},), got {tuple(values.shape)}")
