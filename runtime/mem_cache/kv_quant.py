"""How the KV pool stores a token's keys and values: the model's float dtype, or codes
of one byte with a bfloat16 scale per token and head.

    format      code dtype            code range      a token-head's scale
    int8        int8                  -127 .. 127     amax / 127
    fp8_e4m3    float8_e4m3fn         +-448           amax / 448
    fp8_e5m2    float8_e5m2           +-57344         amax / 57344

``kivi4`` and ``kivi2`` are KIVI's 4- and 2-bit codes (keys per channel over groups of
positions, values per token, the newest positions in float): their layout and
reading are ``radixlm.runtime.mem_cache.kivi``'s.

A scale is ``amax / max_code`` computed in float32, rounded to bfloat16 (to nearest
even); the codes are the values over that rounded scale, clamped to the code range (a
scale rounded down cannot overflow them). A value is ``code * scale`` in float32, exact
(a code's 7 significant bits at most times the scale's 8), rounded once to the model's
dtype; a head vector of zeros has scale 0 and codes 0.

Coding against the rounded scale keeps each value within half a code step of what it
stands for, as a float32 scale would (the largest magnitude, up to 2^-8 of itself past
the top code where the scale is a normal bfloat16, clamps to it), and the scale costs 2
bytes rather than 4: at head dim 64 a token-head takes 64 + 2 bytes against bfloat16's
128, 1.94x the tokens (1.88x with a float32 scale). Scales are per token and head (a
(slots, Hkv) bfloat16 tensor per layer beside the codes), so a token's K and V are
fixed the moment they are written: a cached prefix reads the same values whoever wrote
it, and the radix cache shares quantized prefixes as it shares float ones.

Every attention backend reads the same layout: ``KVPool.k[layer]`` holds the codes
(slots, Hkv, D), ``KVPool.k_scale[layer]`` the scales (slots, Hkv) (None for a float
pool); ``dequantize`` is the reference every backend's reading equals.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixlm.runtime.mem_cache.kivi import KiviLayout

__all__ = [
    "KV_CACHE_DTYPES",
    "KVCacheDtypeError",
    "KVFormat",
    "bfloat16_rounded",
    "dequantize",
    "kv_format",
    "quantize",
]

KV_CACHE_DTYPES = ("auto", "int8", "fp8_e4m3", "fp8_e5m2", "kivi4", "kivi2")


class KVCacheDtypeError(ValueError):
    """A KV cache dtype radixlm does not store."""


@dataclass(frozen=True)
class KVFormat:
    """name: as the user asks for it ("int8", ..., or the model dtype's name for a
    float pool); code_dtype: what ``KVPool.k``/``v`` hold; max_code: the largest code
    magnitude a scale maps a head vector's largest value to (0 for a float pool and a
    KIVI one); kivi: a KIVI pool's layout (None for the others)."""

    name: str
    code_dtype: torch.dtype
    max_code: float
    kivi: KiviLayout | None = None

    @property
    def quantized(self) -> bool:
        """Codes with a scale per token and head (int8, fp8); KIVI's are ``kivi``."""
        return self.max_code > 0

    def bytes_per_value(self) -> int:
        return self.code_dtype.itemsize

    def bytes_per_token(self, num_layers: int, num_kv_heads: int, head_dim: int) -> int:
        """K and V of one token in every layer, scales included (a KIVI pool's
        float windows, per request row, are not: ``KiviLayout.window_bytes``)."""
        if self.kivi is not None:
            return self.kivi.bytes_per_token(num_layers, num_kv_heads, head_dim)
        scale = 2 if self.quantized else 0  # one bfloat16 per token and head
        return 2 * num_layers * num_kv_heads * (head_dim * self.bytes_per_value() + scale)


_QUANTIZED = {
    "int8": (torch.int8, 127.0),
    "fp8_e4m3": (torch.float8_e4m3fn, float(torch.finfo(torch.float8_e4m3fn).max)),
    "fp8_e5m2": (torch.float8_e5m2, float(torch.finfo(torch.float8_e5m2).max)),
}


_KIVI_BITS = {"kivi4": 4, "kivi2": 2}


def kv_format(name: str, model_dtype: torch.dtype) -> KVFormat:
    """The format ``--kv-cache-dtype`` names; "auto" is the model's dtype, unquantized.

    Raises:
        KVCacheDtypeError: a name not in ``KV_CACHE_DTYPES``.
    """
    if name == "auto":
        return KVFormat(str(model_dtype).removeprefix("torch."), model_dtype, 0.0)
    if name in _KIVI_BITS:
        return KVFormat(name, torch.uint8, 0.0, KiviLayout(_KIVI_BITS[name]))
    if name not in _QUANTIZED:
        raise KVCacheDtypeError(
            f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {name!r}"
        )
    code_dtype, max_code = _QUANTIZED[name]
    return KVFormat(name, code_dtype, max_code)


def quantize(x: torch.Tensor, fmt: KVFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """x: (..., D) float -> (codes (..., D) in ``fmt.code_dtype``, scales (...) bfloat16),
    one scale per vector of the last dim (a token's head): its largest magnitude over
    ``fmt.max_code`` in float32, rounded to bfloat16 (nearest even); the codes are x
    over that rounded scale, clamped to the code range."""
    x = x.float()
    scale = bfloat16_rounded(x.abs().amax(dim=-1) / fmt.max_code)  # float32
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))[..., None]
    scaled = x / safe
    if fmt.code_dtype == torch.int8:
        codes = torch.round(scaled).clamp_(-fmt.max_code, fmt.max_code).to(torch.int8)
    else:  # clamped into the format's range, a plain cast rounds to nearest even
        codes = scaled.clamp_(-fmt.max_code, fmt.max_code).to(fmt.code_dtype)
    return codes, scale.to(torch.bfloat16)  # exact


def bfloat16_rounded(x: torch.Tensor) -> torch.Tensor:
    """float32 x rounded to the nearest bfloat16 (ties to even), still float32: the
    value ``x.to(torch.bfloat16)`` holds, rounded on the bits so that a compiled graph
    rounds too (inductor drops a float32 -> bfloat16 -> float32 round trip within a
    kernel, and the codes would then come from the unrounded scale)."""
    bits = x.view(torch.int32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & -0x10000  # the low 16 bits to zero
    return torch.where(x.isnan(), x, rounded.view(torch.float32))


def dequantize(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """codes (..., D), scales (...) bfloat16 -> (..., D) in ``dtype``: computed in float32
    (a code and a bfloat16 scale are exact there), rounded once."""
    return (codes.float() * scales.float()[..., None]).to(dtype)
