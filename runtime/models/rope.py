"""Rotary position embedding, neox style (``rotate_half``) like HF Llama.

cos/sin are precomputed once for every position the model serves and looked up
by position, so a batch mixing many requests at different positions costs one
gather per forward pass::

    inv_freq: (D/2,)   angle[p, i] = p * inv_freq[i]
    cache:    cos, sin (L, D/2), already multiplied by the attention factor
    x = [x1 | x2] (halves of D)  ->  [x1 cos - x2 sin | x2 cos + x1 sin]

Scaling types and how each sets inv_freq (all match transformers'
``ROPE_INIT_FUNCTIONS``):

- ``default``: ``theta ** (-2i/D)``.
- ``linear``: default / factor (positions interpolated by ``factor``).
- ``dynamic`` (NTK): HF recomputes the base every forward from the longest
  sequence in that batch, so a token's rotation depends on its batch-mates and
  on when its keys were cached. A server needs one rotation per position, so
  radixlm (like vLLM) computes the NTK base once for the extended length
  ``L = max_position_embeddings * factor`` and serves up to ``L`` tokens. It
  equals HF exactly for a sequence of length ``L``; shorter ones see slightly
  lower frequencies than HF's unscaled ones.
- ``llama3``: Llama 3.1's per-band frequency scaling.
- ``yarn``: per-dim blend of interpolated and extrapolated frequencies, plus
  an attention factor (mscale) multiplied into cos and sin, i.e. q.k scaled by
  its square, as HF does.
- ``longrope`` (Phi-3): ``theta ** (-2i/D)`` divided per frequency by
  ``short_factor`` or ``long_factor``, and an attention factor
  ``sqrt(1 + ln(factor) / ln(original))``. HF picks the long factors for a whole
  forward pass once its longest sequence passes ``original_max_position_embeddings``
  (recomputing nothing already cached). A server needs one rotation per position,
  so radixlm rotates positions below the original length with the short factors
  and the rest with the long ones: equal to HF for every sequence within the
  original length (4k tokens of Phi-3-mini-128k), and each cached key keeps the
  rotation it was computed with, as in HF.

Partial rotary (Phi-4-mini, ``partial_rotary_factor``): D above is the rotated
dims, the leading ``ArchConfig.rotary_dims`` of each head.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from radixlm.runtime.errors import ModelLoadError
from radixlm.runtime.models.config import ArchConfig, RopeScaling

__all__ = ["RopeFrequencies", "compute_rope_frequencies", "RotaryEmbedding", "apply_rope"]


@dataclass(frozen=True)
class RopeFrequencies:
    """inv_freq: (D/2,) float32; attention_factor multiplies cos and sin.
    long_inv_freq, long_from: the frequencies of positions from ``long_from`` on
    (longrope's long factors); None: inv_freq serves every position."""

    inv_freq: torch.Tensor
    attention_factor: float
    long_inv_freq: torch.Tensor | None = None
    long_from: int = 0


def _base_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    return 1.0 / (theta**exponents)  # (D/2,)


def _default(head_dim: int, theta: float, s: RopeScaling, max_pos: int) -> RopeFrequencies:
    return RopeFrequencies(_base_inv_freq(head_dim, theta), 1.0)


def _linear(head_dim: int, theta: float, s: RopeScaling, max_pos: int) -> RopeFrequencies:
    return RopeFrequencies(_base_inv_freq(head_dim, theta) / s.factor, 1.0)


def _dynamic(head_dim: int, theta: float, s: RopeScaling, max_pos: int) -> RopeFrequencies:
    seq_len = max_pos * s.factor  # the extended length, see the module docstring
    ratio = s.factor * seq_len / max_pos - (s.factor - 1)
    base = theta * ratio ** (head_dim / (head_dim - 2))
    return RopeFrequencies(_base_inv_freq(head_dim, base), 1.0)


def _llama3(head_dim: int, theta: float, s: RopeScaling, max_pos: int) -> RopeFrequencies:
    inv_freq = _base_inv_freq(head_dim, theta)
    old_len = s.original_max_position_embeddings or max_pos
    low_freq_wavelen = old_len / s.low_freq_factor
    high_freq_wavelen = old_len / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths are interpolated, short ones kept; the band between blends.
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return RopeFrequencies(torch.where(is_medium, smoothed, scaled), 1.0)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_attention_factor(s: RopeScaling) -> float:
    if s.attention_factor is not None:
        return s.attention_factor
    if s.mscale and s.mscale_all_dim:
        return _yarn_mscale(s.factor, s.mscale) / _yarn_mscale(s.factor, s.mscale_all_dim)
    return _yarn_mscale(s.factor)


def _yarn_correction_range(
    s: RopeScaling, dim: int, theta: float, max_pos: int
) -> tuple[float, float]:
    """Dims (of D/2) below ``low`` extrapolate, above ``high`` interpolate."""

    def dim_of(num_rotations: float) -> float:
        return dim * math.log(max_pos / (num_rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_of(s.beta_fast), dim_of(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def _yarn(head_dim: int, theta: float, s: RopeScaling, max_pos: int) -> RopeFrequencies:
    original = s.original_max_position_embeddings or max_pos
    extrapolated = _base_inv_freq(head_dim, theta)
    interpolated = extrapolated / s.factor
    low, high = _yarn_correction_range(s, head_dim, theta, original)
    if low == high:
        high += 0.001  # avoids a zero-width ramp
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation_weight = 1 - ramp  # (D/2,)
    inv_freq = interpolated * (1 - extrapolation_weight) + extrapolated * extrapolation_weight
    return RopeFrequencies(inv_freq, _yarn_attention_factor(s))


def _longrope(head_dim: int, theta: float, s: RopeScaling, max_pos: int) -> RopeFrequencies:
    original = s.original_max_position_embeddings or max_pos
    for name, factors in (("short_factor", s.short_factor), ("long_factor", s.long_factor)):
        if len(factors) != head_dim // 2:
            raise ModelLoadError(
                f"longrope {name} has {len(factors)} values; the rotary dims need {head_dim // 2}"
            )
    base = _base_inv_freq(head_dim, theta)
    attention_factor = s.attention_factor
    if attention_factor is None:
        attention_factor = (
            1.0 if s.factor <= 1 else math.sqrt(1 + math.log(s.factor) / math.log(original))
        )
    short = base / torch.tensor(s.short_factor, dtype=torch.float32)
    long = base / torch.tensor(s.long_factor, dtype=torch.float32)
    return RopeFrequencies(short, attention_factor, long, original)


_FREQUENCY_FUNCTIONS: dict[str, Callable[[int, float, RopeScaling, int], RopeFrequencies]] = {
    "default": _default,
    "linear": _linear,
    "dynamic": _dynamic,
    "llama3": _llama3,
    "yarn": _yarn,
    "longrope": _longrope,
}


def compute_rope_frequencies(
    head_dim: int, theta: float, scaling: RopeScaling, max_position_embeddings: int
) -> RopeFrequencies:
    """inv_freq and attention factor for a rope scaling type (see the module docstring)."""
    fn = _FREQUENCY_FUNCTIONS[scaling.rope_type]
    return fn(head_dim, theta, scaling, max_position_embeddings)


class RotaryEmbedding(nn.Module):
    """cos/sin cache for positions ``0 .. max_len - 1``; ``forward`` looks positions up."""

    def __init__(
        self,
        freqs: RopeFrequencies,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> None:
        super().__init__()
        positions = torch.arange(max_len, dtype=torch.int64).float()
        angles = positions[:, None] * freqs.inv_freq[None, :]  # (L, D/2) float32
        if freqs.long_inv_freq is not None:
            tail = positions[freqs.long_from :, None] * freqs.long_inv_freq[None, :]
            angles[freqs.long_from :] = tail
        scale = freqs.attention_factor
        self.cos: torch.Tensor
        self.sin: torch.Tensor
        self.register_buffer("cos", (angles.cos() * scale).to(device, dtype), persistent=False)
        self.register_buffer("sin", (angles.sin() * scale).to(device, dtype), persistent=False)

    @classmethod
    def from_config(
        cls,
        config: ArchConfig,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        local: bool = False,
    ) -> RotaryEmbedding:
        """The model's rotation over its rotary dims; ``local``: its sliding layers'
        (``ArchConfig.local_rope_theta``, unscaled)."""
        dims, max_pos = config.rotary_dims, config.max_position_embeddings
        if local:
            assert config.local_rope_theta is not None
            freqs = compute_rope_frequencies(dims, config.local_rope_theta, RopeScaling(), max_pos)
        else:
            freqs = compute_rope_frequencies(dims, config.rope_theta, config.rope_scaling, max_pos)
        return cls(freqs, config.rope_context_len, dtype, device)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: (T,) int64 -> cos, sin: (T, D/2) in the cache dtype."""
        return self.cos[positions], self.sin[positions]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotates x: (T, H, D) by cos/sin: (T, D/2). Returns a new (T, H, D) tensor."""
    x1, x2 = x.chunk(2, dim=-1)  # (T, H, D/2) each
    cos, sin = cos[:, None], sin[:, None]  # (T, 1, D/2)
    if torch.compiler.is_compiling():  # the compiler fuses this; out= would break its graph
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    out1, out2 = out.chunk(2, dim=-1)
    torch.mul(x1, cos, out=out1)
    out1.addcmul_(x2, sin, value=-1)
    torch.mul(x2, cos, out=out2)
    out2.addcmul_(x1, sin)
    return out
