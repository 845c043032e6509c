"""The quantized checkpoints people download, read into radixlm's weight storage.

``config.json``'s ``quantization_config`` (or an AutoGPTQ directory's
``quantize_config.json``) names the format; each quantized linear layer's tensors are
turned into the codes radixlm stores (``Int4Codes`` / ``Int8Codes``, radixlm.runtime.
layers.quantization) with the file's values, or, for FP8, into a float weight::

    format              tensors of a layer                       becomes
    AWQ (GEMM)          qweight (in, out/8) int32, AWQ's nibble   Int4Codes: code q,
                        order; qzeros (in/g, out/8); scales        scale s, zero (8-z)*s
                        (in/g, out)                                (w = (q - z) * s)
    GPTQ 4-bit          qweight (in/8, out) int32, nibbles in      Int4Codes: code q,
                        order; qzeros (groups, out/8); scales      scale s, zero (8-z)*s
                        (groups, out); g_idx (in,)
    GPTQ 8-bit          the same with 4 codes an int32             Int8Codes: q - 128,
                                                                   s, (128 - z) * s
    compressed-tensors  weight_packed (out, in/8 or in/4) int32,   Int4Codes / Int8Codes
      pack-quantized    codes + 8 (or + 128) in order; weight_     (w = (q - zp) * s)
      (W4A16, W8A16)    scale (out, groups); weight_zero_point
                        packed along out when asymmetric
    compressed-tensors  weight (out, in) int8; weight_scale        Int8Codes (exact)
      int/naive-quant.  (out, 1) or groups; zero point if any
    compressed-tensors  weight (out, in) float8_e4m3fn;            a float weight:
      float-quantized,  weight_scale (per tensor, per channel)     fp8 value * scale,
      FP8 checkpoints   or weight_scale_inv (128 x 128 blocks)      rounded once

GPTQ zero points: AutoGPTQ's files (``checkpoint_format`` "gptq", the default) store
z - 1, GPTQModel's "gptq_v2" stores z. An act-order layer (``desc_act``: ``g_idx`` not
in group order) is stored with its columns sorted by group and reads its input in that
order (``Int8Codes.order``).

Codes, scales and zero points are the file's: 4-bit and 8-bit codes as they are, zero
points folded into float32 zeros exactly (a small integer times an fp16 or bf16 scale).
Which storage holds them (int4 with bf16 scales, or int8 groups with float32 ones) is
``radixlm.runtime.models.quantized_loader``'s choice. What is not served is refused by
name, with the config field that says so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from radixlm.runtime.errors import ModelLoadError
from radixlm.runtime.layers.quantization import Codes, Int4Codes, Int8Codes, RowBlocks

__all__ = [
    "CheckpointQuantization",
    "LayerCodes",
    "QuantizedCheckpointError",
    "layer_codes",
    "module_weight",
    "read_checkpoint_quantization",
]

# AWQ packs 8 output columns into an int32 in this order (column AWQ_ORDER[i] at
# nibble i); reading nibble REVERSE[j] gives column j.
_AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)
FLOAT8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
# tensors a quantized layer may carry that the weight is not made of (activation
# and KV scales of W8A8 / FP8 files: radixlm computes its activations in float and
# scales its own KV per token)
IGNORED_SUFFIXES = ("input_scale", "input_global_scale", "input_zero_point", "output_scale")
# what each format calls a quantized layer's tensors (the suffix after the module)
QUANTIZED_SUFFIXES = {
    "awq": ("qweight", "qzeros", "scales"),
    "gptq": ("qweight", "qzeros", "scales", "g_idx"),
    "compressed-tensors": (
        "weight_packed",
        "weight_shape",
        "weight_scale",
        "weight_zero_point",
        "weight_g_idx",
    ),
    "fp8": ("weight_scale", "weight_scale_inv"),
}
_CT_FORMATS = ("pack-quantized", "int-quantized", "naive-quantized", "float-quantized")


class QuantizedCheckpointError(ModelLoadError):
    """A quantized checkpoint radixlm does not serve (the message names the field)."""


@dataclass(frozen=True)
class CheckpointQuantization:
    """What a checkpoint's quantization config says, checked.

    method: "awq", "gptq", "compressed-tensors" or "fp8".
    bits: the weights' bits (AWQ, GPTQ); None where each layer's tensors tell.
    zeros_minus_one: GPTQ files in AutoGPTQ's format store each zero point less one.
    block: the block a block scale covers (FP8 files' ``weight_block_size``,
        compressed-tensors' ``block_structure``); None: read from the scales' shapes.
    """

    method: str
    bits: int | None = None
    zeros_minus_one: bool = False
    label: str = ""
    block: tuple[int, int] | None = None  # FP8 block scales' (rows, columns)

    def describe(self) -> str:
        return self.label or self.method

    @property
    def suffixes(self) -> tuple[str, ...]:
        """The tensor name endings that belong to a quantized layer's weight."""
        return QUANTIZED_SUFFIXES[self.method]


def read_checkpoint_quantization(model_dir: str | Path) -> CheckpointQuantization | None:
    """The checkpoint's quantization (None: a float checkpoint).

    Raises:
        QuantizedCheckpointError: a method, format or setting radixlm does not serve.
    """
    model_dir = Path(model_dir)
    config = _json(model_dir / "config.json").get("quantization_config")
    if config is None and (model_dir / "quantize_config.json").is_file():
        config = {"quant_method": "gptq", **_json(model_dir / "quantize_config.json")}
    if config is None:
        return None
    if not isinstance(config, dict):
        raise QuantizedCheckpointError("config.json's quantization_config must be an object")
    method = str(config.get("quant_method", "")).lower()
    readers = {
        "awq": _awq,
        "gptq": _gptq,
        "compressed-tensors": _compressed_tensors,
        "fp8": _fp8,
    }
    if method not in readers:
        raise QuantizedCheckpointError(
            f"quantization_config.quant_method {method!r} is not served; radixlm serves "
            f"{', '.join(readers)} checkpoints (and GGUF files)"
        )
    return readers[method](config)


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        loaded = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{str(path)!r} is not valid JSON: {e}") from e
    return loaded if isinstance(loaded, dict) else {}


def _refuse(field: str, value: object, served: str) -> QuantizedCheckpointError:
    return QuantizedCheckpointError(
        f"quantization_config.{field} = {value!r} is not served; radixlm serves {served}"
    )


def _awq(config: dict[str, Any]) -> CheckpointQuantization:
    bits = config.get("bits", config.get("w_bit"))
    version = str(config.get("version", "gemm")).lower()
    if version != "gemm":
        raise _refuse("version", version, "AWQ's GEMM layout")
    if bits != 4:
        raise _refuse("bits", bits, "4-bit AWQ")
    if config.get("zero_point", True) is not True:
        raise _refuse("zero_point", config.get("zero_point"), "AWQ with zero points")
    group = config.get("group_size", config.get("q_group_size"))
    return CheckpointQuantization("awq", 4, label=f"AWQ 4-bit, group {group}")


def _gptq(config: dict[str, Any]) -> CheckpointQuantization:
    bits = config.get("bits")
    if bits not in (4, 8):
        raise _refuse("bits", bits, "4- and 8-bit GPTQ")
    field = "checkpoint_format" if "checkpoint_format" in config else "format"  # GPTQModel's
    checkpoint_format = str(config.get(field, "gptq")).lower()
    if checkpoint_format not in ("gptq", "gptq_v2"):
        raise _refuse(field, checkpoint_format, "GPTQ's gptq and gptq_v2 layouts")
    if config.get("dynamic"):
        raise _refuse("dynamic", "{...}", "one GPTQ setting for every layer")
    group = config.get("group_size", -1)
    act_order = ", act-order" if config.get("desc_act") else ""
    group_text = "per channel" if group in (-1, None) else f"group {group}"
    return CheckpointQuantization(
        "gptq",
        bits,
        zeros_minus_one=checkpoint_format == "gptq",
        label=f"GPTQ {bits}-bit, {group_text}{act_order}",
    )


def _compressed_tensors(config: dict[str, Any]) -> CheckpointQuantization:
    status = config.get("quantization_status", "compressed")
    if status != "compressed":
        raise _refuse("quantization_status", status, "compressed checkpoints")
    formats = {config.get("format")} | {
        group.get("format") for group in (config.get("config_groups") or {}).values()
    }
    formats.discard(None)
    for fmt in formats:
        if fmt not in _CT_FORMATS:
            raise _refuse("format", fmt, f"compressed-tensors' {', '.join(_CT_FORMATS)}")
    if config.get("sparsity_config"):
        raise _refuse("sparsity_config", "{...}", "dense compressed-tensors checkpoints")
    label = "compressed-tensors " + "/".join(sorted(formats)) if formats else ""
    blocks = [
        (group.get("weights") or {}).get("block_structure")
        for group in (config.get("config_groups") or {}).values()
    ]
    block = next((tuple(b) for b in blocks if b), None)
    return CheckpointQuantization("compressed-tensors", label=label, block=block)  # type: ignore[arg-type]


def _fp8(config: dict[str, Any]) -> CheckpointQuantization:
    fmt = str(config.get("fmt", "e4m3")).lower()
    if fmt != "e4m3":
        raise _refuse("fmt", fmt, "e4m3 FP8 weights")
    block = config.get("weight_block_size")
    scales = f"{block[0]}x{block[1]} block scales" if block else "per-tensor scales"
    return CheckpointQuantization(
        "fp8", label=f"FP8 e4m3, {scales}", block=tuple(block) if block else None
    )


def module_weight(
    quant: CheckpointQuantization, module: str, tensors: dict[str, torch.Tensor]
) -> Codes | RowBlocks:
    """A quantized layer's weight (out, in) from its file tensors (keyed by suffix):
    codes holding the file's values, or float32 values (FP8); a pack-quantized or FP8
    layer's are read a block of rows at a time (``RowBlocks``).

    Raises:
        QuantizedCheckpointError: tensors of a shape or kind the format does not have.
    """
    try:
        if quant.method == "awq":
            return _awq_codes(tensors)
        if quant.method == "gptq":
            return _gptq_codes(tensors, quant.bits or 4, quant.zeros_minus_one)
        if "weight_packed" in tensors:
            return _packed_codes(tensors)
        return _scaled_weight(tensors, quant.block)
    except (KeyError, RuntimeError, ValueError) as e:
        if isinstance(e, QuantizedCheckpointError):
            raise QuantizedCheckpointError(f"layer {module!r}: {e}") from e
        raise QuantizedCheckpointError(
            f"layer {module!r}: its {quant.describe()} tensors "
            f"({', '.join(sorted(tensors))}) do not fit together: {e}"
        ) from e


@dataclass(frozen=True)
class LayerCodes:
    """What a quantized layer's file tensors hold, read from their shapes: ``bits`` 4
    or 8 (None: a float weight, FP8), a scale per ``group_size`` inputs, and the
    weight's (out, in) features."""

    bits: int | None
    group_size: int
    out_features: int
    in_features: int


def layer_codes(
    quant: CheckpointQuantization,
    shapes: dict[str, tuple[int, ...]],
    weight_dtype: torch.dtype | None,
    weight_shape: tuple[int, int] | None,
) -> LayerCodes:
    """A quantized layer's ``LayerCodes`` from its tensors' shapes (keyed by suffix),
    the dtype of its ``weight`` tensor if it has one and the values of its
    ``weight_shape`` (compressed-tensors' packed layers)."""
    if quant.method in ("awq", "gptq"):
        bits = quant.bits or 4
        rows, cols = shapes["qweight"]
        out_features, in_features = (
            (cols * 32 // bits, rows) if quant.method == "awq" else (cols, rows * 32 // bits)
        )
        groups = shapes["scales"][0]
        return LayerCodes(bits, in_features // max(groups, 1), out_features, in_features)
    if "weight_packed" in shapes and weight_shape is not None:
        out_features, in_features = weight_shape
        bits = shapes["weight_packed"][1] * 32 // max(in_features, 1)
    elif "weight" in shapes:
        out_features, in_features = shapes["weight"][:2]
        bits = 8 if weight_dtype == torch.int8 else None
    else:
        raise QuantizedCheckpointError("a quantized layer has neither weight nor weight_packed")
    scale = shapes.get("weight_scale", shapes.get("weight_scale_inv", (1,)))
    per_group = len(scale) == 2 and scale[1] > 1 and bits is not None
    return LayerCodes(
        bits, in_features // scale[1] if per_group else in_features, out_features, in_features
    )


def _nibbles(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 (..., n) -> (..., n * 32 / bits) codes, the lowest bits first (int32)."""
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    return ((packed[..., None] >> shifts) & ((1 << bits) - 1)).flatten(-2)


def _awq_codes(t: dict[str, torch.Tensor]) -> Int4Codes:
    codes = _nibbles(t["qweight"], 4)  # (in, out), nibble order
    zeros = _nibbles(t["qzeros"], 4)  # (in/g, out)
    codes = _awq_columns(codes)
    zeros = _awq_columns(zeros)
    scale = t["scales"].float()  # (in/g, out)
    if codes.shape[1] != scale.shape[1] or zeros.shape != scale.shape:
        raise ValueError("qweight, qzeros and scales disagree on the output width")
    if codes.shape[0] % scale.shape[0]:
        raise ValueError("scales' groups do not divide the input width")
    return Int4Codes(
        codes.t().to(torch.uint8).contiguous(),
        scale.t().contiguous(),
        ((8 - zeros).float() * scale).t().contiguous(),
    )


def _awq_columns(unpacked: torch.Tensor) -> torch.Tensor:
    rows, cols = unpacked.shape
    return unpacked.view(rows, cols // 8, 8)[..., list(_AWQ_REVERSE_ORDER)].reshape(rows, cols)


def _gptq_codes(t: dict[str, torch.Tensor], bits: int, minus_one: bool) -> Codes:
    codes = _nibbles(t["qweight"].t(), bits).t()  # (in, out)
    scale = t["scales"].float()  # (groups, out)
    zeros = _nibbles(t["qzeros"], bits) + int(minus_one)  # (groups, out)
    if zeros.shape != scale.shape or codes.shape[1] != scale.shape[1]:
        raise ValueError("qweight, qzeros and scales disagree on the output width")
    in_features, groups = codes.shape[0], scale.shape[0]
    if in_features % groups:
        raise ValueError("scales' groups do not divide the input width")
    g_idx = t.get("g_idx")
    order = None
    if g_idx is not None:
        g_idx = g_idx.to(torch.int64)
        size = in_features // groups
        if not torch.equal(g_idx, torch.arange(in_features) // size):
            if not torch.equal(
                torch.bincount(g_idx, minlength=groups), torch.full((groups,), size)
            ):
                raise ValueError("g_idx does not give every group the same number of columns")
            order = torch.sort(g_idx, stable=True).indices
            codes = codes[order]
    offset = 1 << (bits - 1)  # 8 or 128: the code a zero point of its own middle sits at
    zero = ((offset - zeros).float() * scale).t().contiguous()
    if bits == 4:
        return Int4Codes(
            codes.t().to(torch.uint8).contiguous(), scale.t().contiguous(), zero, order
        )
    return Int8Codes(
        (codes - offset).t().to(torch.int8).contiguous(), scale.t().contiguous(), zero, order
    )


def _packed_codes(t: dict[str, torch.Tensor]) -> RowBlocks:
    """Codes read from ``weight_packed`` a block of rows at a time: unpacking takes an
    int32 a code, eight times an int4 code's packed bytes."""
    out_features, in_features = (int(n) for n in t["weight_shape"].tolist())
    packed = t["weight_packed"]
    bits = packed.shape[1] * 32 // in_features
    if bits not in (4, 8) or packed.shape[1] * 32 != in_features * bits:
        raise QuantizedCheckpointError(
            f"weight_packed of {packed.shape[1]} words a row for {in_features} inputs: "
            "radixlm serves 4- and 8-bit pack-quantized weights"
        )
    if "weight_g_idx" in t:
        raise QuantizedCheckpointError("weight_g_idx (activation ordering) is not served")
    offset = 1 << (bits - 1)
    scale = _grouped_scale(t["weight_scale"], out_features, in_features)
    zero_point = torch.zeros_like(scale)
    if "weight_zero_point" in t:  # asymmetric: packed along the output dim
        zp = _nibbles(t["weight_zero_point"].t(), bits).t()[:out_features] - offset
        zero_point = zp.float().reshape(out_features, -1).expand_as(scale)
    zero = (-zero_point * scale).contiguous()

    def read(start: int, stop: int) -> Codes:
        stored = _nibbles(packed[start:stop], bits)  # (rows, in): code + offset
        if bits == 4:
            return Int4Codes(stored.to(torch.uint8), scale[start:stop], zero[start:stop])
        return Int8Codes((stored - offset).to(torch.int8), scale[start:stop], zero[start:stop])

    return RowBlocks.chunked((out_features, in_features), read)


def _grouped_scale(scale: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
    """(out, groups) float32 from a per-channel (out, 1) / (out,) or group scale."""
    scale = scale.float().reshape(out_features, -1)
    if in_features % scale.shape[1]:
        raise ValueError(f"{scale.shape[1]} scale groups do not divide {in_features} inputs")
    return scale.contiguous()


def _scaled_weight(t: dict[str, torch.Tensor], block: tuple[int, int] | None) -> Codes | RowBlocks:
    """int8 codes as they are; FP8 values times their scales in float32, a block of rows
    at a time (a whole matrix widened would take four bytes a weight)."""
    weight = t["weight"]
    out_features, in_features = weight.shape
    if weight.dtype == torch.int8:
        scale = _grouped_scale(t["weight_scale"], out_features, in_features)
        zero = torch.zeros_like(scale)
        if "weight_zero_point" in t:
            zero = -t["weight_zero_point"].float().reshape(out_features, -1) * scale
        return Int8Codes(weight, scale, zero.contiguous())
    if weight.dtype not in FLOAT8_DTYPES:
        raise QuantizedCheckpointError(f"a quantized weight of dtype {weight.dtype} is not served")
    scale = t.get("weight_scale_inv", t.get("weight_scale"))
    if scale is None:
        raise KeyError("weight_scale")
    scale = scale.float()
    tile = _scale_tile(scale, out_features, in_features, block)

    def read(start: int, stop: int) -> torch.Tensor:
        return weight[start:stop].float() * _scale_rows(scale, tile, start, stop, in_features)

    return RowBlocks.chunked((out_features, in_features), read)


def _scale_tile(
    scale: torch.Tensor, out_features: int, in_features: int, block: tuple[int, int] | None
) -> tuple[int, int] | None:
    """The (rows, columns) a block scale covers (a block scale's last blocks may be cut
    short); None for a per-tensor or per-channel scale."""
    if scale.numel() == 1 or scale.dim() == 1 or scale.shape[-1] == 1:
        return None
    rows, cols = block or (-(-out_features // scale.shape[0]), -(-in_features // scale.shape[1]))
    if -(-out_features // rows) != scale.shape[0] or -(-in_features // cols) != scale.shape[1]:
        raise ValueError(
            f"block scales of shape {tuple(scale.shape)} do not tile ({out_features}, "
            f"{in_features}) in blocks of {rows}x{cols}"
        )
    return rows, cols


def _scale_rows(
    scale: torch.Tensor, tile: tuple[int, int] | None, start: int, stop: int, in_features: int
) -> torch.Tensor:
    """A per-tensor, per-channel or block (``tile``) scale broadcast over rows
    [start, stop) of the weight."""
    if scale.numel() == 1:
        return scale.reshape(1, 1)
    if tile is None:
        return scale.reshape(-1, 1)[start:stop]
    rows, cols = tile
    first = start // rows  # the block row that row ``start`` falls in
    expanded = scale[first : -(-stop // rows)].repeat_interleave(rows, 0).repeat_interleave(cols, 1)
    return expanded[start - first * rows : stop - first * rows, :in_features]
