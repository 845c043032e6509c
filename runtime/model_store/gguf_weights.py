"""A GGUF's weight matrices as they are stored: the quantized ones as codes,
scales and zero points read straight from their blocks, the others as float values.

llama.cpp's 4-bit types all describe groups of 32 weights by a 4-bit code each and
an affine map, which is exactly radixlm's int4 layout (w = (code - 8) * scale +
zero, groups of 32; radixlm.runtime.layers.quantization)::

    Q4_0  block of 32: d (f16), 16 bytes of codes    w = d * (q - 8)
    Q4_1  block of 32: d, m (f16), 16 bytes          w = d * q + m
    Q4_K  super-block of 256: d, dmin (f16), 12 bytes of eight 6-bit (scale, min)
          pairs, 128 bytes of codes                   w = d * sc_j * q - dmin * m_j

so their codes are kept as they are (``Int4Codes``) and their scales and zero points
computed in float32 from the file's (torch's kernel then holds those in bfloat16). Codes sit
low nibble first: in Q4_0/Q4_1 byte i holds weights i and i + 16 of its block; in
Q4_K each 32 bytes hold 64 weights, the low nibbles the first 32.

The 5-, 6- and 8-bit types are radixlm's int8 groups (w = code * scale + zero,
``Int8Codes``), their codes widened to a byte and their scales and zero points
computed in float32 from the file's, which holds them exactly (an f16 times a 6- or
8-bit integer)::

    Q8_0  block of 32: d, 32 int8                     w = d * q
    Q5_0  block of 32: d, 4 bytes of high bits, 16 of nibbles   w = d * (q - 16)
    Q5_1  block of 32: d, m, high bits, nibbles        w = d * q + m
    Q5_K  super-block of 256 as Q4_K, plus a fifth bit per weight
                                                      w = d * sc_j * q - dmin * m_j
    Q6_K  super-block of 256: 128 bytes of low nibbles, 64 of 2-bit highs, sixteen
          int8 scales (one per 16 weights), d          w = d * sc_j * (q - 32)

Every other type (Q2_K, Q3_K, the IQ types, ...) is dequantized by ``gguf`` itself;
float matrices (F32, F16, BF16) are read as they are. A loader reads a matrix a block of
rows at a time (``GGUFMatrix.row_blocks``): a vocabulary's codes or an F16 matrix's
float32 values are never decoded whole. Each tensor is renamed, split
and corrected as ``gguf_arch.plan_tensor`` says: q/k rows of a llama file un-permuted
(``unpermute_rotary_rows``, codes and group values alike), stacked experts split into
one matrix each, Gemma's norms given back as HF's ``w``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch

from radixlm.runtime.layers.quantization import Codes, Int4Codes, Int8Codes, RowBlocks
from radixlm.runtime.model_store.gguf_arch import (
    GGUFFile,
    open_gguf,
    plan_tensor,
    unpermute_rotary_rows,
)

__all__ = [
    "EIGHT_BIT_TYPES",
    "FLOAT_TYPES",
    "FOUR_BIT_TYPES",
    "GGUFMatrix",
    "read_gguf_matrices",
]

GROUP = 32
FOUR_BIT_TYPES = ("Q4_0", "Q4_1", "Q4_K")
EIGHT_BIT_TYPES = {"Q8_0": 32, "Q5_0": 32, "Q5_1": 32, "Q5_K": 32, "Q6_K": 16}  # and group
FLOAT_TYPES = ("F32", "F16", "BF16")


# (codes (rows, cols), scale and zero (rows, cols / group) float32); codes are uint8 in
# 0..15 for the 4-bit types, int8 for the others
Groups = tuple[np.ndarray, np.ndarray, np.ndarray]


@dataclass(frozen=True)
class GGUFMatrix:
    """One Hugging Face tensor of the file (a stacked experts tensor gives one per
    expert): its name, ggml type and numpy shape ((rows, cols), or (n,))."""

    name: str
    ggml_type: str
    shape: tuple[int, ...]
    _data: np.ndarray  # as stored: float values, or (rows, bytes) of blocks
    _rotary_heads: int | None  # q/k: heads whose rows llama.cpp permuted
    _offset: float  # subtracted from the values (Gemma's norms: 1 + w)

    @property
    def four_bit(self) -> bool:
        return self.ggml_type in FOUR_BIT_TYPES

    @property
    def code_group(self) -> int | None:
        """The group of the codes ``codes`` gives (None: a type without them)."""
        if self._offset:
            return None
        return 32 if self.four_bit else EIGHT_BIT_TYPES.get(self.ggml_type)

    def codes(self) -> Codes:
        """The codes and group values of a tensor with them (``code_group``): int4
        codes for the 4-bit types, int8 ones for the 5-8-bit types."""
        return self._codes(0, self.shape[0])

    def dequantize(self) -> np.ndarray:
        """The float32 values as ``gguf`` dequantizes them."""
        return self._values(0, self.shape[0])

    def row_blocks(self) -> RowBlocks:
        """A matrix read a block of rows at a time: its codes where it has them
        (``code_group``), else its float32 values (a q/k matrix's blocks hold whole
        heads, whose rows llama.cpp permuted within each)."""
        rows, cols = self.shape
        head_rows = rows // self._rotary_heads if self._rotary_heads else 1
        read = self._codes if self.code_group is not None else self._float_rows
        return RowBlocks.chunked((rows, cols), read, head_rows)

    def _codes(self, start: int, stop: int) -> Codes:
        """Rows [start, stop)'s codes and group values."""
        blocks = np.asarray(self._data).reshape(self.shape[0], -1)[start:stop]  # (rows, bytes)
        groups = _DECODERS[self.ggml_type](blocks, self.shape[1])
        if self._rotary_heads is not None:
            groups = tuple(unpermute_rotary_rows(a, self._heads(start, stop)) for a in groups)
        kind = Int4Codes if self.four_bit else Int8Codes
        return kind(*(torch.from_numpy(np.ascontiguousarray(a)) for a in groups))

    def _float_rows(self, start: int, stop: int) -> torch.Tensor:
        return torch.from_numpy(self._values(start, stop))

    def _values(self, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop)'s float32 values."""
        data = np.asarray(self._data)[start:stop]
        values = gguf.quants.dequantize(data, gguf.GGMLQuantizationType[self.ggml_type])
        values = np.asarray(values, dtype=np.float32).reshape(stop - start, *self.shape[1:])
        if self._rotary_heads is not None:
            values = unpermute_rotary_rows(values, self._heads(start, stop))
        if self._offset:
            values = values - np.float32(self._offset)
        return np.require(values, requirements=("C", "W"))  # a float tensor's are the mapped file

    def _heads(self, start: int, stop: int) -> int:
        """The rotary heads rows [start, stop) hold (whole ones)."""
        return self._rotary_heads * (stop - start) // self.shape[0]  # type: ignore[operator]


def read_gguf_matrices(source: Path | GGUFFile) -> Iterator[GGUFMatrix]:
    """Every weight of a GGUF (a path, or a file ``open_gguf`` opened), named as in its
    family's Hugging Face checkpoints; RoPE tables (which the config carries) are left out.

    Raises:
        ModelNotFoundError / ModelLoadError: as ``open_gguf``; an unknown tensor.
    """
    file = source if isinstance(source, GGUFFile) else open_gguf(Path(source))
    for tensor in file.tensors.values():
        plan = plan_tensor(file, tensor.name)
        if plan is None:
            continue
        shape = tuple(int(d) for d in reversed(tensor.shape))  # GGUF lists fastest first
        # a stacked tensor: one part an expert, each (rows, cols)
        parts, shape = (tensor.data, shape[1:]) if plan.stacked else ([tensor.data], shape)
        for name, data in zip(plan.hf_names, parts, strict=True):
            kind = tensor.tensor_type.name
            yield GGUFMatrix(name, kind, shape, data, plan.rotary_heads, plan.offset)


# ---- block decoders: (rows, bytes) -> Groups ----------------------------------------------


def _f16(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The f16 at ``offset`` of every block, as float32: (rows, blocks)."""
    return blocks[..., offset : offset + 2].copy().view(np.float16)[..., 0].astype(np.float32)


def _nibbles_by_halves(qs: np.ndarray) -> np.ndarray:
    """(..., 16) bytes -> (..., 32) codes: low nibbles first, then high ones."""
    return np.concatenate((qs & 0xF, qs >> 4), axis=-1)


def _q4_0(blocks: np.ndarray, cols: int) -> Groups:
    rows = blocks.shape[0]
    blocks = blocks.reshape(rows, cols // GROUP, 18)
    d = _f16(blocks, 0)
    codes = _nibbles_by_halves(blocks[..., 2:]).reshape(rows, cols)
    return codes, d, np.zeros_like(d)


def _q4_1(blocks: np.ndarray, cols: int) -> Groups:
    rows = blocks.shape[0]
    blocks = blocks.reshape(rows, cols // GROUP, 20)
    d, m = _f16(blocks, 0), _f16(blocks, 2)
    codes = _nibbles_by_halves(blocks[..., 4:]).reshape(rows, cols)
    return codes, d, m + 8 * d


def _q4_k(blocks: np.ndarray, cols: int) -> Groups:
    rows = blocks.shape[0]
    blocks = blocks.reshape(rows, cols // 256, 144)
    d, dmin = _f16(blocks, 0), _f16(blocks, 2)  # (rows, S)
    sc, mins = _k_scales(blocks[..., 4:16].astype(np.uint32))  # (rows, S, 8) each
    qs = blocks[..., 16:].reshape(rows, cols // 256, 4, 32)  # 4 chunks of 64 weights
    codes = np.stack((qs & 0xF, qs >> 4), axis=3).reshape(rows, cols)  # low 32, then high 32
    scale = d[..., None] * sc
    zero = 8 * scale - dmin[..., None] * mins
    return codes, scale.reshape(rows, -1), zero.reshape(rows, -1)


def _k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's 12 bytes -> eight 6-bit scales and eight 6-bit mins (llama.cpp's
    get_scale_min_k4): sub-blocks 0-3 in the low 6 bits of bytes 0-3 and 4-7;
    sub-blocks 4-7 in the nibbles of bytes 8-11 with their top 2 bits in the top
    bits of bytes 0-3 (scales) and 4-7 (mins)."""
    low_sc, low_m, rest = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    sc = np.concatenate((low_sc & 63, (rest & 0xF) | ((low_sc >> 6) << 4)), axis=-1)
    mins = np.concatenate((low_m & 63, (rest >> 4) | ((low_m >> 6) << 4)), axis=-1)
    return sc.astype(np.float32), mins.astype(np.float32)


def _q8_0(blocks: np.ndarray, cols: int) -> Groups:
    rows = blocks.shape[0]
    blocks = blocks.reshape(rows, cols // GROUP, 34)
    d = _f16(blocks, 0)
    return blocks[..., 2:].view(np.int8).reshape(rows, cols), d, np.zeros_like(d)


def _five_bit_codes(qh: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1: (..., 4) bytes of high bits (bit j for weight j) and (..., 16) of
    nibbles -> (..., 32) codes in 0..31."""
    high = np.unpackbits(qh, axis=-1, bitorder="little")  # (..., 32): bit j of the u32
    return _nibbles_by_halves(qs) | (high << 4)


def _q5_0(blocks: np.ndarray, cols: int) -> Groups:
    rows = blocks.shape[0]
    blocks = blocks.reshape(rows, cols // GROUP, 22)
    d = _f16(blocks, 0)
    codes = _five_bit_codes(blocks[..., 2:6], blocks[..., 6:]).astype(np.int8) - 16
    return codes.reshape(rows, cols), d, np.zeros_like(d)


def _q5_1(blocks: np.ndarray, cols: int) -> Groups:
    rows = blocks.shape[0]
    blocks = blocks.reshape(rows, cols // GROUP, 24)
    d, m = _f16(blocks, 0), _f16(blocks, 2)
    codes = _five_bit_codes(blocks[..., 4:8], blocks[..., 8:]).astype(np.int8)
    return codes.reshape(rows, cols), d, m


def _q5_k(blocks: np.ndarray, cols: int) -> Groups:
    """Q4_K's layout (d, dmin, 12 bytes of scales and mins, 128 of nibbles) with 32
    bytes of fifth bits between scales and nibbles: weight l of 64-weight chunk c
    takes bit 2c (low nibbles, l < 32) or 2c + 1 (high ones) of byte l % 32."""
    rows = blocks.shape[0]
    blocks = blocks.reshape(rows, cols // 256, 176)
    d, dmin = _f16(blocks, 0), _f16(blocks, 2)
    sc, mins = _k_scales(blocks[..., 4:16].astype(np.uint32))
    qh = blocks[..., 16:48][..., None, None, :]  # (rows, S, 1, 1, 32)
    shifts = (2 * np.arange(4)[:, None] + np.arange(2)).astype(np.uint8)  # (4 chunks, 2 halves)
    high = (qh >> shifts[..., None]) & 1  # (rows, S, 4, 2, 32)
    qs = blocks[..., 48:].reshape(rows, cols // 256, 4, 32)
    low = np.stack((qs & 0xF, qs >> 4), axis=3)  # (rows, S, 4, 2, 32)
    codes = (low | (high << 4)).astype(np.int8).reshape(rows, cols)
    scale = d[..., None] * sc
    zero = -(dmin[..., None] * mins)
    return codes, scale.reshape(rows, -1), zero.reshape(rows, -1)


def _q6_k(blocks: np.ndarray, cols: int) -> Groups:
    """Per half of 128 weights: 64 bytes of low nibbles (ql), 32 bytes of 2-bit highs
    (qh); weight 32i + l (i < 4, l < 32) takes the low (i < 2) or high nibble of ql
    byte l + 32 (i % 2) and bits 2i, 2i + 1 of qh byte l."""
    rows = blocks.shape[0]
    blocks = blocks.reshape(rows, cols // 256, 210)
    ql = blocks[..., :128].reshape(rows, -1, 2, 2, 32)  # (rows, S, half, l + 32 j, 32)
    qh = blocks[..., 128:192].reshape(rows, -1, 2, 1, 32)  # (rows, S, half, 1, 32)
    low = np.concatenate((ql & 0xF, ql >> 4), axis=3)  # (rows, S, half, 4, 32)
    high = (qh >> (2 * np.arange(4, dtype=np.uint8))[:, None]) & 3  # (rows, S, half, 4, 32)
    codes = ((low | (high << 4)).astype(np.int16) - 32).astype(np.int8).reshape(rows, cols)
    sc = blocks[..., 192:208].view(np.int8).astype(np.float32)  # (rows, S, 16)
    d = blocks[..., 208:210].copy().view(np.float16)[..., 0].astype(np.float32)
    scale = d[..., None] * sc
    return codes, scale.reshape(rows, -1), np.zeros_like(scale).reshape(rows, -1)


_DECODERS = {
    "Q4_0": _q4_0,
    "Q4_1": _q4_1,
    "Q4_K": _q4_k,
    "Q8_0": _q8_0,
    "Q5_0": _q5_0,
    "Q5_1": _q5_1,
    "Q5_K": _q5_k,
    "Q6_K": _q6_k,
}
assert set(_DECODERS) == {*FOUR_BIT_TYPES, *EIGHT_BIT_TYPES}
