"""Weight-only quantized linear layers: int8 per output channel, int4 group-wise.

A decode step reads every weight once per token, so its time is weight bytes over
memory bandwidth: int8 weights are half of bfloat16's bytes, int4 about a quarter.
The products are torch's own packed CPU kernels, chosen by measurement over every
layer matrix of two model shapes (``benchmarks/bench_quant_kernels.py``;
benchmarks/README.md, "Quantized weights"):

  int8   ``torch._weight_int8pack_mm``: int8 weights (out, in), one scale per
         output channel; w = q * scale (symmetric, q in [-127, 127]).
  int4   ``torch._weight_int4pack_mm_for_cpu``: 4-bit codes packed by
         ``torch._convert_weight_to_int4pack_for_cpu``, a scale and a zero point
         per group of ``group_size`` inputs; w = (code - 8) * scale + zero
         (asymmetric: code 0 is the group's minimum, 15 its maximum).

Both take bfloat16 activations (float32 ones run far slower through them): on a CPU
the weights' scales are bfloat16 (``kernel_dtype``) and a float32 model's activations
are rounded to bfloat16 on their way into a product and widened after it, so its
norms, RoPE and SwiGLU keep running as single C++ passes in float32. The kernels
beat the bfloat16 product for the rows of a decode pass but lose from a few dozen rows
up (benchmarks/README.md, "Quantized weights"), so passes of more than
``FEW_ROWS_MAX`` rows (prefill chunks) dequantize the weight and run the float GEMM
(``gemm_dtype``): one extra pass over the weight, spread over hundreds of rows. Where
radixlm's own quantized product reads the weight (``QuantizedLinear.use_small_batch``)
it takes passes up to ``quant_kernel_max_rows`` instead: more rows of a larger int4
weight, whose dequantized copy no longer fits the caches. On a
GPU the weight is dequantized for every product (the memory saving without the
speed: no GPU kernel has been timed yet).

Rows are quantized independently (a row's scale, or its groups' scales, depend on
that row alone), so a weight is filled row range by row range from float tensors
(``rows``): the fused q/k/v and gate/up projections take their checkpoint parts one
by one, and a tensor-parallel shard takes its rows, as a float weight's slices do.

A third storage, ``int8g`` (int8 codes with a float32 scale and zero point per group
of 16 or 32 inputs: w = q * scale + zero), is the exact home of llama.cpp's 5-, 6- and
8-bit blocks (radixlm.runtime.models.gguf_loader); torch has no kernel for it, so its
products are radixlm's own (radixlm.kernels.cpu.int8_group), attached at assembly like
the int4 dequantizer (a float GEMM on the weight dequantized per product until then).

The LM head is quantized to int8 in both methods (a 4-bit head costs quality where
it shows most, as llama.cpp's Q4 files keep theirs at 6-8 bits), and the embedding
reads its rows from the same int8 storage when the two are tied, so no float copy of
the vocabulary matrix is kept.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.kernels.cpu.dequant import DequantKernels
from radixlm.kernels.cpu.int8_group import Int8GroupKernels
from radixlm.kernels.cpu.small_batch import INT4, INT8, QuantizedMatrix, SmallBatchKernels
from radixlm.runtime.layers.linear import gemm_dtype

__all__ = [
    "FEW_ROWS_MAX",
    "QUANTIZATION_METHODS",
    "Int4Codes",
    "Int4Weight",
    "Int8Codes",
    "Int8GroupWeight",
    "Int8Weight",
    "Quantization",
    "QuantizationError",
    "QuantizedEmbedding",
    "QuantizedLinear",
    "QuantizedWeight",
    "RowBlocks",
    "RowSlot",
    "kernel_dtype",
    "kernel_matrix",
    "quant_kernel_max_rows",
    "same_order",
    "use_dequant_kernels",
]

QUANTIZATION_METHODS = ("int8", "int4")  # what a user asks for at load
STORAGE_METHODS = (*QUANTIZATION_METHODS, "int8g")  # and what a GGUF file's blocks take
INT4_GROUP_SIZES = (32, 64, 128)
INT8G_GROUP_SIZES = (16, 32)
# Rows up to which torch's packed kernels beat dequantize + GEMM (over every layer matrix
# of the default and a Llama-1B shape: benchmarks/README.md, "Quantized weights"), and
# the whole quantized decode step's rows; radixlm's product: quant_kernel_max_rows.
FEW_ROWS_MAX = 32
_INT8_MAX = 127
_INT4_LEVELS = 15
INT4_ROWS_MULTIPLE = 16
_DEQUANT_DTYPES = (torch.float32, torch.bfloat16)  # what the C++ dequantizer writes
# Weights a float tensor is quantized (and int4 codes are packed, a file's blocks decoded:
# RowBlocks) a row range at a time: a whole vocabulary's float32 temporaries would be
# several times its quantized bytes. Filling a 2048 x 8192 int4 weight (8 MB) took 120-150
# MB above it at 4M weights a range, 46 MB at 1M, in the same CPU time.
ROWS_CHUNK_WEIGHTS = 1 << 20


def kernel_dtype(dtype: torch.dtype, device: torch.device | str) -> torch.dtype:
    """The activation dtype a quantized product runs in for a model of ``dtype``:
    bfloat16 on a CPU (torch's packed kernels are fast only there), else ``dtype``."""
    return torch.bfloat16 if torch.device(device).type == "cpu" else dtype


class QuantizationError(ValueError):
    """A weight cannot be quantized as asked (its width is no multiple of the group)."""


@dataclass(frozen=True)
class Quantization:
    """How a model's linear layers store their weights.

    method: "int8" (per output channel), "int4" (group-wise with zero points) or
        "int8g" (int8 group-wise with zero points: GGUF's 5-8-bit blocks).
    group_size: inputs per group (int4: 32, 64 or 128; int8g: 16 or 32); every
        quantized layer's input width must be a multiple of it. Unused by int8.
    """

    method: Literal["int8", "int4", "int8g"]
    group_size: int = 32

    def __post_init__(self) -> None:
        if self.method not in STORAGE_METHODS:
            raise QuantizationError(
                f"quantization must be one of {QUANTIZATION_METHODS}, got {self.method!r}"
            )
        sizes = {"int4": INT4_GROUP_SIZES, "int8g": INT8G_GROUP_SIZES}.get(self.method)
        if sizes is not None and self.group_size not in sizes:
            raise QuantizationError(
                f"{self.method} group size must be one of {sizes}, got {self.group_size!r}"
            )

    def weight(
        self, out_features: int, in_features: int, dtype: torch.dtype, device: torch.device | str
    ) -> QuantizedWeight:
        """An empty weight of this method for a layer (fill it through ``rows``); its
        scales in ``dtype``, the activation dtype its kernel takes (``kernel_dtype``)."""
        if self.method == "int8":
            return Int8Weight(out_features, in_features, dtype, device)
        if self.method == "int8g":
            return Int8GroupWeight(out_features, in_features, self.group_size, dtype, device)
        return Int4Weight(out_features, in_features, self.group_size, dtype, device)

    def vocabulary(self) -> Quantization:
        """How the embedding and LM head store theirs: int8 per channel, except that
        int8 groups (a GGUF's 8-bit vocabulary) stay as they are."""
        return self if self.method == "int8g" else Quantization("int8")

    def describe(self) -> str:
        if self.method == "int8":
            return "int8"
        return f"{self.method} (group {self.group_size})"


@dataclass(frozen=True)
class Int4Codes:
    """Weights already in int4 form (a GGUF file's 4-bit blocks): codes (rows, cols)
    uint8 in 0..15, scale and zero (rows, cols / group) float32, w = (code - 8) *
    scale + zero over each group of ``cols / scale.shape[1]`` columns."""

    codes: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor
    order: torch.Tensor | None = None  # see Int8Codes

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    @property
    def group_size(self) -> int:
        return self.codes.shape[1] // self.scale.shape[1]

    def row_range(self, start: int, stop: int) -> Int4Codes:
        """Rows [start, stop) (views)."""
        return Int4Codes(*_row_range((self.codes, self.scale, self.zero), start, stop), self.order)

    def regrouped(self, group_size: int) -> Int4Codes:
        """The same weights described by groups of ``group_size`` (see Int8Codes)."""
        if group_size == self.group_size:
            return self
        held = Int8Codes(self.codes, self.scale, self.zero).regrouped(group_size)
        return Int4Codes(self.codes, held.scale, held.zero, self.order)

    def dequantize(self) -> torch.Tensor:
        """(rows, cols) float32: the int8 form's formula (code - 8 is exact in int8)."""
        return Int8Codes.of(self).dequantize()


@dataclass(frozen=True)
class Int8Codes:
    """Weights already in int8 groups (a GGUF file's 5-, 6- or 8-bit blocks): codes
    (rows, cols) int8, scale and zero (rows, cols / group) float32, w = code * scale +
    zero over each group of ``cols / scale.shape[1]`` columns.

    order: the input column each stored column holds (a GPTQ checkpoint's act-order
    layers group their columns out of order: stored sorted by group, the layer takes
    its input in this order, ``QuantizedWeight.input_order``); None: in order."""

    codes: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor
    order: torch.Tensor | None = None

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    @property
    def group_size(self) -> int:
        return self.codes.shape[1] // self.scale.shape[1]

    @staticmethod
    def of(codes: Int4Codes) -> Int8Codes:
        """The same weights: (code - 8) is exact in int8."""
        shifted = (codes.codes.to(torch.int16) - 8).to(torch.int8)
        return Int8Codes(shifted, codes.scale, codes.zero, codes.order)

    def row_range(self, start: int, stop: int) -> Int8Codes:
        """Rows [start, stop) (views)."""
        return Int8Codes(*_row_range((self.codes, self.scale, self.zero), start, stop), self.order)

    def regrouped(self, group_size: int) -> Int8Codes:
        """The same weights described by groups of ``group_size`` (a divisor of this
        one's group: each group's scale and zero repeated; itself when it is this one)."""
        if group_size == self.group_size:
            return self
        repeat = self.group_size // group_size
        scale, zero = (t.repeat_interleave(repeat, dim=1) for t in (self.scale, self.zero))
        return Int8Codes(self.codes, scale, zero, self.order)

    def dequantize(self) -> torch.Tensor:
        """(rows, cols) float32, columns in input order."""
        rows, cols = self.codes.shape
        grouped = self.codes.reshape(rows, -1, self.group_size).float()
        stored = (grouped * self.scale[..., None] + self.zero[..., None]).reshape(rows, cols)
        if self.order is None:
            return stored
        return torch.empty_like(stored).index_copy_(1, self.order, stored)


Codes = Int4Codes | Int8Codes  # a weight kept in the form a file stores it


@dataclass(frozen=True)
class RowBlocks:
    """A matrix a loader reads a block of rows at a time (a GGUF file's blocks decoded,
    a packed checkpoint's codes unpacked): what a load holds beyond the weight it fills
    is one block's values, never the whole matrix widened.

    ``read(start, stop)`` gives rows [start, stop) as float values or codes; rows are
    read independently, so the blocks of a matrix are its rows read whole, bit for bit.
    """

    shape: torch.Size
    read: Callable[[int, int], torch.Tensor | Codes]
    rows_per_block: int

    @staticmethod
    def chunked(
        shape: tuple[int, int], read: Callable[[int, int], torch.Tensor | Codes], multiple: int = 1
    ) -> RowBlocks:
        """Blocks of about ``ROWS_CHUNK_WEIGHTS`` weights, a multiple of ``multiple`` rows."""
        rows_per_block = row_chunks(shape[0], shape[1], multiple)[0][1]
        return RowBlocks(torch.Size(shape), read, rows_per_block)

    def blocks(self) -> Iterator[tuple[int, torch.Tensor | Codes]]:
        """(first row, rows) of each block, in order."""
        rows = self.shape[0]
        for start in range(0, rows, self.rows_per_block):
            yield start, self.read(start, min(start + self.rows_per_block, rows))

    def whole(self) -> torch.Tensor | Codes:
        """Every row in one read (for a consumer that cuts columns: a shard's)."""
        return self.read(0, self.shape[0])


def _row_range(
    tensors: tuple[torch.Tensor, ...], start: int, stop: int
) -> tuple[torch.Tensor, ...]:
    return tuple(t[start:stop] for t in tensors)


def row_chunks(rows: int, in_features: int, multiple: int = 1) -> list[tuple[int, int]]:
    """The (start, stop) row ranges a (rows, in_features) weight is converted in: about
    ``ROWS_CHUNK_WEIGHTS`` weights each, a multiple of ``multiple`` rows (the last may
    be shorter)."""
    step = max(multiple, ROWS_CHUNK_WEIGHTS // max(in_features, 1) // multiple * multiple)
    return [(start, min(start + step, rows)) for start in range(0, rows, step)]


def _check_groups(kind: str, group_size: int, in_features: int) -> None:
    if in_features % group_size:
        raise QuantizationError(
            f"{kind} group size {group_size} does not divide a layer's input width "
            f"{in_features}; choose a group size that divides every layer's"
        )


class RowSlot:
    """Rows ``[start, stop)`` of a quantized weight, filled once from a float tensor.

    Quacks like the tensor slice a float weight's loader copies into: ``shape`` and
    ``copy_(src)``, which quantizes ``src`` into those rows (or, for codes the weight
    holds exactly, keeps them as they are: ``takes_codes``). A float source is widened
    and quantized a range of rows at a time (``row_chunks``; rows are quantized
    independently, so the result is the same), and a ``RowBlocks`` source is read a
    block at a time, so what a large tensor costs beyond its source is a chunk's
    temporaries.
    """

    def __init__(self, weight: QuantizedWeight, start: int, stop: int) -> None:
        self.weight, self.start, self.stop = weight, start, stop
        self.shape = torch.Size((stop - start, weight.in_features))

    def takes_codes(self, codes: Codes) -> bool:
        """int4 codes into int4 groups that divide theirs; int4 or int8 codes into int8
        groups that divide theirs."""
        weight = self.weight
        if isinstance(weight, Int4Weight) and not isinstance(codes, Int4Codes):
            return False
        held = isinstance(weight, Int4Weight | Int8GroupWeight)
        return held and codes.group_size % weight.group_size == 0  # type: ignore[union-attr]

    def copy_(self, src: torch.Tensor | Codes | RowBlocks) -> None:
        if src.shape != self.shape:
            raise ValueError(f"rows of shape {tuple(self.shape)} got {tuple(src.shape)}")
        blocks = src.blocks() if isinstance(src, RowBlocks) else iter([(0, src)])
        for start, rows in blocks:
            self._copy_rows(self.start + start, rows, first=start == 0)

    def _copy_rows(self, start: int, src: torch.Tensor | Codes, first: bool) -> None:
        """Rows [start, start + len(src)) of the weight; the first block of a source
        says the order its columns come in (every block of one source shares it)."""
        takes = isinstance(src, Int4Codes | Int8Codes) and self.takes_codes(src)
        if first:
            self.weight.take_order(src.order if takes else None)  # type: ignore[union-attr]
        if takes:
            self.weight.set_codes(start, src)  # type: ignore[union-attr]
            return
        for begin, stop in row_chunks(src.shape[0], self.weight.in_features):
            if isinstance(src, Int4Codes | Int8Codes):
                rows = src.row_range(begin, stop).dequantize()
            else:
                rows = src[begin:stop].float()
            self.weight.quantize_rows(start + begin, rows)


def same_order(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Whether two column orders (``Int8Codes.order``; None: in order) are the same."""
    if a is None or b is None:
        return a is None and b is None
    return torch.equal(a.to(torch.int64), b.to(torch.int64))


class OrderedInputs(nn.Module):
    """What every quantized weight shares: the order it takes its inputs in
    (``input_order``, (in,) int64: stored column j multiplies input column
    ``input_order[j]``; None: in order), set by the codes that fill it
    (``Int8Codes.order``). Every part of a fused layer must agree."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("input_order", None)
        self._parts_filled = 0

    def take_order(self, order: torch.Tensor | None) -> None:
        """Rows filled from a part in this column order (None: in order, as a float
        part always is). Raises QuantizationError when the parts disagree."""
        self._parts_filled += 1
        if self._parts_filled == 1:
            self.input_order = None if order is None else order.to(torch.int64)
            return
        if not same_order(self.input_order, order):
            raise QuantizationError(
                "the parts of a fused layer order their input columns differently"
            )


class QuantizedWeight(Protocol):
    """A weight matrix (out, in) stored quantized; see the module doc."""

    out_features: int
    in_features: int
    input_order: torch.Tensor | None

    def rows(self, start: int, stop: int) -> RowSlot: ...

    def take_order(self, order: torch.Tensor | None) -> None: ...

    def quantize_rows(self, start: int, rows: torch.Tensor) -> None: ...

    def pack(self) -> None: ...

    def matmul(self, x: torch.Tensor) -> torch.Tensor: ...

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor: ...

    def can_dequantize(self) -> bool: ...

    def nbytes(self) -> int: ...


class Int8Weight(OrderedInputs):
    """int8 weights (out, in) with one scale per output channel: w = q * scale."""

    def __init__(
        self, out_features: int, in_features: int, dtype: torch.dtype, device: torch.device | str
    ) -> None:
        super().__init__()
        self.out_features, self.in_features, self.dtype = out_features, in_features, dtype
        # uninitialised, as a float weight is: every row is filled before use
        self.register_buffer(
            "qweight", torch.empty(out_features, in_features, dtype=torch.int8, device=device)
        )
        self.register_buffer("scales", torch.empty(out_features, dtype=dtype, device=device))

    def rows(self, start: int, stop: int) -> RowSlot:
        return RowSlot(self, start, stop)

    def quantize_rows(self, start: int, rows: torch.Tensor) -> None:
        """rows: (n, in) float32 -> rows [start, start + n), symmetric per row."""
        scale = (rows.abs().amax(dim=1) / _INT8_MAX).clamp(min=torch.finfo(torch.float32).tiny)
        scale = scale.to(self.dtype).float()  # round first: q is computed for the stored scale
        q = torch.round(rows / scale[:, None]).clamp(-_INT8_MAX, _INT8_MAX)
        self.qweight[start : start + rows.shape[0]] = q.to(torch.int8)
        self.scales[start : start + rows.shape[0]] = scale.to(self.dtype)

    def pack(self) -> None:
        """Nothing to do: torch's int8 kernel reads the plain layout."""

    def can_dequantize(self) -> bool:
        return True

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x: (rows, in) in the activation dtype -> (rows, out)."""
        return torch._weight_int8pack_mm(x, self.qweight, self.scales)

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        """(out, in) in ``dtype``: q is exact in any float dtype and the scales are
        ``self.dtype`` values, so one multiply in ``dtype`` rounds the exact product once."""
        return self.qweight.to(dtype) * self.scales.to(dtype)[:, None]

    def dequantize_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The float rows ``ids`` (an embedding lookup): (*ids.shape, in)."""
        return self.qweight[ids].to(self.dtype) * self.scales[ids].unsqueeze(-1)

    def nbytes(self) -> int:
        return self.qweight.nbytes + self.scales.nbytes


class Int4Weight(OrderedInputs):
    """4-bit codes with a scale and a zero point per group of ``group_size`` inputs:
    w = (code - 8) * scale + zero.

    On a CPU whose torch int4 layout is known (``cpu_int4_block``) the codes go into
    that layout (two per byte) as their rows arrive, a block of rows at a time
    (``_Int4Packer``): no one-byte-a-code copy of the weight is ever held. Elsewhere
    they are kept one per byte while the weight is filled and ``pack`` lays them out
    and drops them (a loader packs each weight as soon as its last rows arrive:
    ``load_weights``)."""

    def __init__(
        self,
        out_features: int,
        in_features: int,
        group_size: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        super().__init__()
        if out_features % INT4_ROWS_MULTIPLE:
            raise QuantizationError(
                f"int4 needs a layer's output width to be a multiple of {INT4_ROWS_MULTIPLE} "
                f"(torch's CPU kernel), got {out_features}"
            )
        _check_groups("int4", group_size, in_features)
        self.out_features, self.in_features, self.dtype = out_features, in_features, dtype
        self.group_size = group_size
        groups = in_features // group_size
        streamed = torch.device(device).type == "cpu" and cpu_int4_block() > 0
        # uninitialised, as a float weight is: every row is filled before use (the
        # pages are then touched only as their rows arrive)
        self.register_buffer(
            "codes",
            None
            if streamed
            else torch.empty(out_features, in_features, dtype=torch.uint8, device=device),
        )
        # torch's layout: (in / group, out, 2) holding (scale, zero) pairs
        self.register_buffer(
            "scales_zeros", torch.empty(groups, out_features, 2, dtype=dtype, device=device)
        )
        self.register_buffer(
            "packed",
            torch.empty(out_features, in_features // 2, dtype=torch.uint8) if streamed else None,
        )
        self._packer = _Int4Packer(self.packed, cpu_int4_block()) if streamed else None
        self.dequantizer: DequantKernels | None = None  # see use_dequant_kernels

    def rows(self, start: int, stop: int) -> RowSlot:
        return RowSlot(self, start, stop)

    def quantize_rows(self, start: int, rows: torch.Tensor) -> None:
        """rows: (n, in) float32 -> rows [start, start + n), min-max per group."""
        n = rows.shape[0]
        grouped = rows.reshape(n, -1, self.group_size)  # (n, G, g)
        low, high = grouped.amin(dim=-1), grouped.amax(dim=-1)  # (n, G)
        scale = ((high - low) / _INT4_LEVELS).clamp(min=torch.finfo(torch.float32).tiny)
        scale = scale.to(self.dtype).float()
        zero = (low + 8 * scale).to(self.dtype).float()  # code 8 sits at the zero point
        codes = torch.round((grouped - zero[..., None]) / scale[..., None] + 8).clamp(0, 15)
        self.set_codes(start, Int4Codes(codes.reshape(n, -1).to(torch.uint8), scale, zero))

    def set_codes(self, start: int, codes: Int4Codes) -> None:
        """Rows [start, start + n) from codes whose group this one's divides (scale and
        zero are rounded to the activation dtype, as torch's kernel reads them)."""
        codes = codes.regrouped(self.group_size)
        n = codes.shape[0]
        if self._packer is not None:
            self._packer.write(start, codes.codes)
        else:
            self.codes[start : start + n] = codes.codes
        self.scales_zeros[:, start : start + n, 0] = codes.scale.t().to(self.dtype)
        self.scales_zeros[:, start : start + n, 1] = codes.zero.t().to(self.dtype)

    def pack(self) -> None:
        if self._packer is not None:  # the codes went into the layout as they came
            self._packer.flush()
            self._packer = None
            return
        if self.codes is None:
            return
        if self.codes.device.type == "cpu":
            self.packed = _pack_cpu_int4(self.codes)
        else:  # dequantized per product: two codes per byte, low nibble first
            self.packed = self.codes[:, 0::2] | (self.codes[:, 1::2] << 4)
        self.codes = None

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x: (rows, in) in the activation dtype -> (rows, out)."""
        return torch._weight_int4pack_mm_for_cpu(x, self.packed, self.group_size, self.scales_zeros)

    def can_dequantize(self) -> bool:
        """Whether ``dequantize`` can read the packed layout (see unpack_cpu_int4)."""
        return self.packed is None or self.packed.device.type != "cpu" or cpu_int4_block() > 0

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        """(out, in) in ``dtype``: computed in float32 (exact), rounded once; in one C++
        pass over the packed weight where the kernels are attached."""
        packed_on_cpu = self.packed is not None and self.packed.device.type == "cpu"
        kernel = self.dequantizer is not None and packed_on_cpu and cpu_int4_block() > 0
        if kernel and dtype in _DEQUANT_DTYPES:
            return self.dequantizer.int4(  # type: ignore[union-attr]
                self.packed, self.scales_zeros, self.out_features, self.in_features,
                self.group_size, cpu_int4_block(), dtype,
            )  # fmt: skip
        scale, zero = self.scales_zeros.float().permute(2, 1, 0)  # (out, G) each
        return Int4Codes(self._unpacked_codes(), scale, zero).dequantize().to(dtype)

    def _unpacked_codes(self) -> torch.Tensor:
        """The codes (out, in), one per byte, from whichever layout holds them."""
        if self.codes is not None:
            return self.codes
        if self.packed.device.type == "cpu":
            return unpack_cpu_int4(self.packed, self.out_features, self.in_features)
        low, high = self.packed & 0xF, self.packed >> 4
        return torch.stack((low, high), dim=-1).reshape(self.out_features, self.in_features)

    def nbytes(self) -> int:
        codes = self.packed if self.packed is not None else self.codes
        return codes.nbytes + self.scales_zeros.nbytes


class Int8GroupWeight(OrderedInputs):
    """int8 codes with a float32 scale and zero point per group of ``group_size``
    inputs: w = code * scale + zero. Holds GGUF's 5-, 6- and 8-bit blocks (and int4
    codes) exactly; a float row is quantized symmetrically per group (zero 0)."""

    def __init__(
        self,
        out_features: int,
        in_features: int,
        group_size: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        super().__init__()
        _check_groups("int8", group_size, in_features)
        self.out_features, self.in_features, self.dtype = out_features, in_features, dtype
        self.group_size = group_size
        groups = in_features // group_size
        # uninitialised, as a float weight is: every row is filled before use
        self.register_buffer(
            "codes", torch.empty(out_features, in_features, dtype=torch.int8, device=device)
        )
        self.register_buffer("scales", torch.empty(out_features, groups, device=device))
        self.register_buffer("zeros", torch.empty(out_features, groups, device=device))
        self.kernels: Int8GroupKernels | None = None  # see use_dequant_kernels

    def rows(self, start: int, stop: int) -> RowSlot:
        return RowSlot(self, start, stop)

    def quantize_rows(self, start: int, rows: torch.Tensor) -> None:
        """rows: (n, in) float32 -> rows [start, start + n), symmetric per group."""
        n = rows.shape[0]
        grouped = rows.reshape(n, -1, self.group_size)
        scale = (grouped.abs().amax(dim=-1) / _INT8_MAX).clamp(min=torch.finfo(torch.float32).tiny)
        codes = torch.round(grouped / scale[..., None]).clamp(-_INT8_MAX, _INT8_MAX)
        zero = torch.zeros_like(scale)
        self.set_codes(start, Int8Codes(codes.reshape(n, -1).to(torch.int8), scale, zero))

    def set_codes(self, start: int, codes: Codes) -> None:
        """Rows [start, start + n) from codes whose group this one's divides."""
        held = (codes if isinstance(codes, Int8Codes) else Int8Codes.of(codes)).regrouped(
            self.group_size
        )
        n = held.shape[0]
        self.codes[start : start + n] = held.codes
        self.scales[start : start + n] = held.scale
        self.zeros[start : start + n] = held.zero

    def pack(self) -> None:
        """Drops the zero points when all are 0 (Q8_0, Q5_0, Q6_K): 4 bytes a group."""
        if self.zeros is not None and not self.zeros.any():
            self.zeros = None

    def can_dequantize(self) -> bool:
        return True

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x: (rows, in) in the activation dtype -> (rows, out)."""
        if self._kernel_ready(x.dtype):
            return self.kernels.matmul(x, self.codes, self.scales, self.zeros)  # type: ignore[union-attr]
        return F.linear(x, self.dequantize(x.dtype))

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        """(out, in) in ``dtype``: computed in float32, rounded once."""
        if self._kernel_ready(dtype):
            return self.kernels.dequantize(self.codes, self.scales, self.zeros, dtype)  # type: ignore[union-attr]
        return self._held(self.codes, self.scales, self.zeros).dequantize().to(dtype)

    def dequantize_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The float rows ``ids`` (an embedding lookup): (*ids.shape, in)."""
        flat = ids.reshape(-1)
        zeros = None if self.zeros is None else self.zeros[flat]
        rows = self._held(self.codes[flat], self.scales[flat], zeros).dequantize()
        return rows.to(self.dtype).view(*ids.shape, self.in_features)

    @staticmethod
    def _held(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None) -> Int8Codes:
        return Int8Codes(codes, scales, torch.zeros_like(scales) if zeros is None else zeros)

    def _kernel_ready(self, dtype: torch.dtype) -> bool:
        return (
            self.kernels is not None
            and self.codes.device.type == "cpu"
            and dtype in _DEQUANT_DTYPES
            and self.kernels.supports(self.group_size)
        )

    def nbytes(self) -> int:
        zeros = 0 if self.zeros is None else self.zeros.nbytes
        return self.codes.nbytes + self.scales.nbytes + zeros


# How many rows of a pass radixlm's quantized product takes over a weight
# (quant_kernel_max_rows), where the alternative is the weight dequantized for the
# pass and a GEMM (benchmarks/bench_quant_prompt.py; benchmarks/README.md, "Quantized
# prompt passes", a layer's four matrices of the default model, Qwen2.5-0.5B and
# Llama-3.2-1B). The dequantized weight is written and read back each pass: a cost per
# element that grows once the matrix outgrows the caches, while the product's grows
# with the rows.
# - int4: the product wins up to a row count that grows with the weight's output rows
#   (one matrix at a time): 100-115 rows at 576 outputs (the default model's o and
#   down), ~160 at 960, 280-330 at 2,048, 350-380 at 3,072, ~700 at 16,384 (the 1B's
#   gate_up). It takes up to a ninth of the output rows, never fewer than FEW_ROWS_MAX
#   nor more than 512: inside every measured crossover.
# - int8 groups: the product's VNNI tiles convert and scale every dot product; the GEMM
#   wins from 11-20 rows on all three: up to 12 rows.
_INT4_OUTPUTS_PER_ROW = 9
_INT4_KERNEL_ROWS_MAX = 512
_INT8G_KERNEL_ROWS_MAX = 12


def quant_kernel_max_rows(weight: QuantizedWeight) -> int:
    """The most rows of a pass that radixlm's quantized product takes over ``weight``
    (see _INT4_OUTPUTS_PER_ROW); FEW_ROWS_MAX for the storages not measured."""
    if isinstance(weight, Int4Weight):
        rows = weight.out_features // _INT4_OUTPUTS_PER_ROW
        return max(FEW_ROWS_MAX, min(_INT4_KERNEL_ROWS_MAX, rows))
    if isinstance(weight, Int8GroupWeight):
        return _INT8G_KERNEL_ROWS_MAX
    return FEW_ROWS_MAX


class QuantizedLinear(nn.Module):
    """y = x W^T + b with W stored quantized (``QuantizedWeight``), x, y and b in the
    model's dtype (the weight's kernel may take another: ``kernel_dtype``). Call
    ``prepare()`` once the weight is filled."""

    def __init__(
        self, weight: QuantizedWeight, bias: bool, dtype: torch.dtype, device: torch.device | str
    ) -> None:
        super().__init__()
        self.qweight = weight
        self.in_features, self.out_features = weight.in_features, weight.out_features
        self.bias = (
            nn.Parameter(torch.empty(weight.out_features, dtype=dtype, device=device))
            if bias
            else None
        )
        self.dtype = dtype
        # what a prompt pass's GEMM runs in on the dequantized weight
        self.gemm_dtype = gemm_dtype(dtype) if torch.device(device).type == "cpu" else dtype
        # radixlm's own product (use_small_batch) and the most rows of a pass it takes
        self.small_batch: tuple[SmallBatchKernels, QuantizedMatrix] | None = None
        self.small_batch_max_rows = FEW_ROWS_MAX

    def prepare(self) -> None:
        self.qweight.pack()

    def use_small_batch(self, kernels: SmallBatchKernels) -> bool:
        """Runs passes of up to ``quant_kernel_max_rows`` rows through radixlm's
        quantized product (``SmallBatchKernels.quant_product``: the decode step's,
        float32 inputs, VNNI dot products where the CPU has them) instead of torch's
        packed kernels or a dequantized weight, when it reads the weight (after
        ``prepare``). Returns whether it does."""
        matrix = kernel_matrix(self.qweight)
        bias_ok = self.bias is None or (
            self.bias.dtype in (torch.float32, torch.bfloat16) and self.bias.is_contiguous()
        )
        if matrix is None or matrix.problems("weight", kernels.lanes) or not bias_ok:
            return False
        self.small_batch = (kernels, matrix)
        self.small_batch_max_rows = quant_kernel_max_rows(self.qweight)
        return True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., in) -> (..., out), in the model's dtype."""
        rows = x.numel() // x.shape[-1]
        flat = x.reshape(rows, x.shape[-1])
        if self.qweight.input_order is not None:  # act-order codes: inputs as stored
            flat = flat.index_select(1, self.qweight.input_order)
        on_cpu = flat.device.type == "cpu"
        kernel = self.small_batch if on_cpu else None
        if kernel is not None and rows <= self.small_batch_max_rows:
            kernels, matrix = kernel
            y = kernels.quant_product(flat.float().contiguous(), matrix, self.bias).to(self.dtype)
        elif on_cpu and (
            (kernel is None and rows <= FEW_ROWS_MAX) or not self.qweight.can_dequantize()
        ):  # torch's packed kernels where radixlm's product does not read the weight
            y = self.qweight.matmul(flat.to(self.qweight.dtype).contiguous()).to(self.dtype)
            if self.bias is not None:
                y = y + self.bias
        else:
            compute = self.gemm_dtype
            bias = None if self.bias is None else self.bias.to(compute)
            y = F.linear(flat.to(compute), self.qweight.dequantize(compute), bias).to(self.dtype)
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        kind = type(self.qweight).__name__
        return (
            f"in={self.in_features}, out={self.out_features}, bias={self.bias is not None}, {kind}"
        )


def use_dequant_kernels(
    model: nn.Module, int4: DequantKernels, int8_groups: Int8GroupKernels
) -> int:
    """Gives ``model``'s quantized weights their C++ kernels: every int4 weight is
    dequantized for its prompt passes in one pass (radixlm.kernels.cpu.dequant; the
    same values as the torch ops, faster: benchmarks/README.md, "CPU engine
    choices"), every int8-group weight gets its
    products (radixlm.kernels.cpu.int8_group). Returns how many weights take one."""
    taken = 0
    for weight in model.modules():
        if isinstance(weight, Int4Weight):
            weight.dequantizer = int4
        elif isinstance(weight, Int8GroupWeight):
            weight.kernels = int8_groups
        else:
            continue
        taken += 1
    return taken


class QuantizedEmbedding(nn.Module):
    """Token embeddings read from an int8 weight (the LM head's, when tied)."""

    def __init__(self, weight: Int8Weight | Int8GroupWeight, dtype: torch.dtype) -> None:
        super().__init__()
        self.qweight, self.dtype = weight, dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids: (T,) -> (T, hidden) in the model's dtype."""
        return self.qweight.dequantize_rows(ids).to(self.dtype)


def kernel_matrix(weight: QuantizedWeight) -> QuantizedMatrix | None:
    """The weight as radixlm.kernels.cpu.small_batch's quantized products read it,
    over its own storage (an int8 per-row weight's scales widened to float32: one
    group of every input); None for what they do not read (act-order codes, int4 not
    packed in a CPU layout known here)."""
    shape = (weight.out_features, weight.in_features)
    if weight.input_order is not None:
        return None
    if isinstance(weight, Int4Weight):
        block = cpu_int4_block()
        if weight.packed is None or weight.packed.device.type != "cpu" or not block:
            return None
        return QuantizedMatrix(
            INT4, weight.packed, weight.scales_zeros, None, weight.group_size, block, shape
        )
    if isinstance(weight, Int8GroupWeight):
        return QuantizedMatrix(
            INT8, weight.codes, weight.scales, weight.zeros, weight.group_size, 0, shape
        )
    if isinstance(weight, Int8Weight):
        scales = weight.scales.float().unsqueeze(1).contiguous()  # (out, 1): one group
        return QuantizedMatrix(INT8, weight.qweight, scales, None, weight.in_features, 0, shape)
    return None


@functools.cache
def cpu_int4_block() -> int:
    """Rows per block of ``torch._convert_weight_to_int4pack_for_cpu``'s layout on
    this CPU (0 when it is none that ``unpack_cpu_int4`` reads).

    The layout is torch's private business and depends on the kernel build the CPU
    gets; it is read once per process by packing known codes and checking that
    unpacking gives them back, so a layout this code does not know is found, not
    misread (its many-row products then run the packed kernel, see QuantizedLinear).
    """
    generator = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (160, 64), dtype=torch.int32, generator=generator)
    packed = torch._convert_weight_to_int4pack_for_cpu(codes, 1)
    for block in (64, 32, 16):
        if torch.equal(_unpack_blocks(packed, 160, 64, block).to(torch.int32), codes):
            return block
    return 0


def _pack_cpu_int4(codes: torch.Tensor) -> torch.Tensor:
    """torch's packed CPU int4 layout of codes (out, in) uint8. torch's op takes int32
    codes, 4 bytes a code: where the layout's row blocks are known (``cpu_int4_block``)
    the rows are converted a few blocks at a time into one output (a block's bytes
    depend on its rows alone), else all at once."""
    block = cpu_int4_block()
    if not block:
        return torch._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)
    out_features, in_features = codes.shape
    packed = torch.empty(out_features, in_features // 2, dtype=torch.uint8)
    _pack_rows(packed, 0, codes, block)
    return packed


def _pack_rows(packed: torch.Tensor, start: int, codes: torch.Tensor, block: int) -> None:
    """Rows [start, start + n) of ``packed`` (torch's CPU int4 layout, viewed (out,
    in / 2)) from their codes (n, in): ``start`` begins a block and the rows end one
    (or end the weight), a few blocks converted at a time."""
    for begin, stop in row_chunks(codes.shape[0], codes.shape[1], block):
        piece = torch._convert_weight_to_int4pack_for_cpu(codes[begin:stop].to(torch.int32), 1)
        packed[start + begin : start + stop] = piece.view(stop - begin, -1)


class _Int4Packer:
    """Writes an int4 weight's codes into torch's CPU layout as their rows arrive.

    The layout is a run of units, each converted from its own rows alone: blocks of
    B = ``cpu_int4_block()`` rows, then the rows past the last whole block as one unit
    (``unpack_cpu_int4``)::

        rows    0          B          2B   ...   whole        out
        units   [ block 0  ][ block 1  ]   ...   [ tail (< B)  ]

    Rows that fill whole units are converted at once; a unit whose rows come apart
    (a fused layer's parts or a shard's rows cut inside it) waits in a unit-sized
    buffer until its last row comes.
    """

    def __init__(self, packed: torch.Tensor, block: int) -> None:
        self.packed, self.block = packed, block
        self.out_features = packed.shape[0]
        self.whole = self.out_features // block * block
        self.waiting: dict[int, tuple[torch.Tensor, int]] = {}  # unit start -> (codes, rows in)

    def write(self, start: int, codes: torch.Tensor) -> None:
        """Rows [start, start + n) from their codes (n, in) uint8; each row once."""
        stop = start + codes.shape[0]
        row = start
        while row < stop:
            unit, unit_stop = self._unit(row)
            whole_units = self._boundary_below(stop)
            if row == unit and whole_units > row:
                _pack_rows(self.packed, row, codes[row - start : whole_units - start], self.block)
                row = whole_units
                continue
            end = min(stop, unit_stop)
            self._wait(unit, unit_stop, row, codes[row - start : end - start])
            row = end

    def flush(self) -> None:
        """Converts the units still waiting for rows (a weight filled in part: their
        missing rows hold what the buffer held)."""
        for unit, (codes, _) in sorted(self.waiting.items()):
            _pack_rows(self.packed, unit, codes, self.block)
        self.waiting.clear()

    def _unit(self, row: int) -> tuple[int, int]:
        if row >= self.whole:
            return self.whole, self.out_features
        start = row // self.block * self.block
        return start, start + self.block

    def _boundary_below(self, row: int) -> int:
        """The last unit boundary at or before ``row``."""
        return row if row == self.out_features else min(row // self.block * self.block, self.whole)

    def _wait(self, unit: int, unit_stop: int, row: int, codes: torch.Tensor) -> None:
        buffer, filled = self.waiting.get(unit) or (
            torch.empty(unit_stop - unit, codes.shape[1], dtype=torch.uint8),
            0,
        )
        buffer[row - unit : row - unit + codes.shape[0]] = codes
        filled += codes.shape[0]
        if filled < unit_stop - unit:
            self.waiting[unit] = (buffer, filled)
            return
        self.waiting.pop(unit, None)
        _pack_rows(self.packed, unit, buffer, self.block)


def unpack_cpu_int4(packed: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
    """torch's packed CPU int4 weight -> codes (out, in) as uint8.

    The layout (read from torch 2.13's kernel, checked by ``cpu_int4_block``): rows
    in blocks of B; a block is (in, B/2) bytes, byte (k, j) holding row j in its low
    nibble and row j + B/2 in its high one; the rows past the last whole block
    (fewer than B) are (in, rest/2) bytes holding rows 2j and 2j + 1.
    """
    block = cpu_int4_block()
    if not block:
        raise QuantizationError("this CPU's torch int4 layout is not one radixlm can read")
    return _unpack_blocks(packed, out_features, in_features, block)


def _unpack_blocks(packed: torch.Tensor, n: int, k: int, block: int) -> torch.Tensor:
    flat = packed.reshape(-1)
    low, high = flat & 0xF, flat >> 4
    whole = n // block * block
    cut = whole * k // 2
    parts = []
    if whole:
        lo = low[:cut].view(n // block, k, block // 2).transpose(1, 2)  # (n/B, B/2, k)
        hi = high[:cut].view(n // block, k, block // 2).transpose(1, 2)
        parts.append(torch.cat((lo, hi), dim=1).reshape(whole, k))
    if n > whole:
        lo = low[cut:].view(k, (n - whole) // 2).t()  # (rest/2, k)
        hi = high[cut:].view(k, (n - whole) // 2).t()
        parts.append(torch.stack((lo, hi), dim=1).reshape(n - whole, k))
    return torch.cat(parts)
