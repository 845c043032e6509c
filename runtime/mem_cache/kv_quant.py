"""How the KV pool stores a token's keys and values: the model's float dtype, or codes
of one byte with a float32 scale per token and head.

    format      code dtype            code range      a token-head's scale
    int8        int8                  -127 .. 127     amax / 127
    fp8_e4m3    float8_e4m3fn         +-448           amax / 448
    fp8_e5m2    float8_e5m2           +-57344         amax / 57344

``kivi4`` and ``kivi2`` are KIVI's 4- and 2-bit codes (keys per channel over groups of
positions, values per token, the newest positions in float): their layout and
reading are ``radixlm.runtime.mem_cache.kivi``'s.

A value is ``code * scale`` (the code widened to float32); a head vector of zeros has
scale 0 and codes 0. Scales are per token and head (a (slots, Hkv) float32 tensor per
layer beside the codes), so a token's K and V are fixed the moment they are written:
a cached prefix reads the same values whoever wrote it, and the radix cache shares
quantized prefixes as it shares float ones.

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
        scale = 4 if self.quantized else 0  # one float32 per token and head
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
    """x: (..., D) float -> (codes (..., D) in ``fmt.code_dtype``, scales (...) float32),
    one scale per vector of the last dim (a token's head)."""
    x = x.float()
    scale = x.abs().amax(dim=-1) / fmt.max_code
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))[..., None]
    scaled = x / safe
    if fmt.code_dtype == torch.int8:
        codes = torch.round(scaled).clamp_(-fmt.max_code, fmt.max_code).to(torch.int8)
    else:  # scaled is within the format's range: a plain cast rounds to nearest even
        codes = scaled.clamp_(-fmt.max_code, fmt.max_code).to(fmt.code_dtype)
    return codes, scale


def dequantize(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """codes (..., D), scales (...) -> (..., D) in ``dtype``: computed in float32 (a
    code is exact there), rounded once."""
    return (codes.float() * scales.float()[..., None]).to(dtype)
