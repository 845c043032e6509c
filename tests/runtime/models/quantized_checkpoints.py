"""Tiny quantized checkpoints in the layouts their libraries write, from a float one.

Each writer quantizes every linear layer's weight of a float checkpoint (the
vocabulary, norms and MoE routers stay float, as the libraries leave them) and
returns, beside the directory, the weights the file's values stand for, computed
here in float64 from the integers it packed (``Written.weights``): the float twin a
loader must reproduce.

Layouts: AWQ GEMM as AutoAWQ packs it (8 output columns an int32 in the order
0, 2, 4, 6, 1, 3, 5, 7); GPTQ as AutoGPTQ / GPTQModel pack it (inputs along an int32,
zero points along the outputs, v1 zero points less one); compressed-tensors and FP8
block files through the ``compressed-tensors`` package's own compressors.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


@dataclass
class Written:
    path: Path
    # linear weight name -> (out, in) float64; empty when written with reference=False
    # (a real model's would take 8 bytes a weight)
    weights: dict[str, torch.Tensor]


def quantized_names(tensors: dict[str, torch.Tensor], lm_head: bool = False) -> list[str]:
    """The linear weights a quantizer converts: every 2-D ``*_proj.weight``/expert
    weight but the vocabulary (``lm_head``: the LM head too, as GPTQ's option does) and
    the MoE routers."""
    return [
        name
        for name, t in tensors.items()
        if t.dim() == 2
        and name.endswith(".weight")
        and "embed_tokens" not in name
        and (lm_head or not name.startswith("lm_head"))
        and not name.endswith(("mlp.gate.weight", "shared_expert_gate.weight"))
    ]


def _copy_dir(src: Path, dst: Path) -> dict[str, torch.Tensor]:
    """Copies what is not weights; returns every tensor (one file or shards)."""
    dst.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(src.iterdir()):
        if f.suffix == ".safetensors":
            tensors.update(load_file(f))
        elif f.name != "model.safetensors.index.json":
            shutil.copy(f, dst / f.name)
    return tensors


def _write(dst: Path, tensors: dict[str, torch.Tensor], quantization_config: dict) -> None:
    config = json.loads((dst / "config.json").read_text())
    config["quantization_config"] = quantization_config
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in tensors.items()}, dst / "model.safetensors")


def _minmax(w: torch.Tensor, bits: int, group: int) -> tuple[torch.Tensor, ...]:
    """Asymmetric min-max codes of w (out, in): (q, z, s) with q (out, in) in
    0..2^bits-1, z and s (out, in/group); s rounded to fp16 first."""
    out_features, in_features = w.shape
    grouped = w.reshape(out_features, -1, group)
    low, high = grouped.amin(-1).clamp(max=0), grouped.amax(-1).clamp(min=0)
    top = (1 << bits) - 1
    s = ((high - low) / top).clamp(min=1e-4).half().float()
    z = torch.round(-low / s).clamp(0, top)
    q = torch.round(grouped / s[..., None] + z[..., None]).clamp(0, top)
    return q.reshape(out_features, in_features).to(torch.int64), z.to(torch.int64), s


def _symmetric(w: torch.Tensor, bits: int, group: int) -> tuple[torch.Tensor, ...]:
    """GPTQ's symmetric codes: zero point 2^(bits-1), s = amax / (2^(bits-1) - 1)."""
    out_features, in_features = w.shape
    grouped = w.reshape(out_features, -1, group)
    middle = 1 << (bits - 1)
    s = (grouped.abs().amax(-1) / (middle - 1)).clamp(min=1e-4).half().float()
    q = (torch.round(grouped / s[..., None]) + middle).clamp(0, (1 << bits) - 1)
    z = torch.full_like(s, middle, dtype=torch.int64)
    return q.reshape(out_features, in_features).to(torch.int64), z, s


def _pack(values: torch.Tensor, bits: int, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """(rows, n) ints -> (rows, n * bits / 32) int32, 32/bits values a word along the
    last dim, value ``order[i]`` of each run (in order if None) at bit i * bits."""
    per_word = 32 // bits
    rows, n = values.shape
    runs = values.reshape(rows, n // per_word, per_word)
    if order is not None:
        runs = runs[..., list(order)]
    words = torch.zeros(rows, n // per_word, dtype=torch.int64)
    for i in range(per_word):
        words |= runs[..., i] << (i * bits)
    return (words - ((words >> 31) << 32)).to(torch.int32)  # two's complement


def write_awq(float_dir: Path, dst: Path, group: int, reference: bool = True) -> Written:
    tensors = _copy_dir(float_dir, dst)
    weights = {}
    for name in quantized_names(tensors):
        q, z, s = _minmax(tensors.pop(name).float(), 4, group)
        module = name.removesuffix(".weight")
        tensors[f"{module}.qweight"] = _pack(q.t(), 4, AWQ_ORDER)  # (in, out/8)
        tensors[f"{module}.qzeros"] = _pack(z.t(), 4, AWQ_ORDER)  # (in/g, out/8)
        tensors[f"{module}.scales"] = s.t().half()  # (in/g, out)
        if reference:
            weights[name] = _deq(q, z, s, group)
    config = {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True}
    _write(dst, tensors, {**config, "version": "gemm"})
    return Written(dst, weights)


def write_gptq(
    float_dir: Path,
    dst: Path,
    bits: int,
    group: int,
    *,
    sym: bool = True,
    desc_act: bool = False,
    v2: bool = False,
    seed: int = 0,
    reference: bool = True,
    lm_head: bool = False,
) -> Written:
    """group -1: one group per output channel. desc_act: columns assigned to groups in
    a random order (``g_idx``), as act-order quantization leaves them."""
    tensors = _copy_dir(float_dir, dst)
    weights = {}
    for name in quantized_names(tensors, lm_head):
        w = tensors.pop(name).float()
        out_features, in_features = w.shape
        size = in_features if group == -1 else group
        perm = _act_order(name, in_features, seed) if desc_act else torch.arange(in_features)
        g_idx = torch.empty(in_features, dtype=torch.int64)
        g_idx[perm] = torch.arange(in_features) // size  # column perm[j] is in group j // size
        q, z, s = (_symmetric if sym else _minmax)(w[:, perm], bits, size)
        unperm = torch.empty_like(perm)
        unperm[perm] = torch.arange(in_features)
        q_in_order = q[:, unperm]  # (out, in) in input order
        module = name.removesuffix(".weight")
        stored_z = z.t() - (0 if v2 else 1)  # (groups, out)
        tensors[f"{module}.qweight"] = _pack(q_in_order, bits).t().contiguous()  # (in*b/32, out)
        tensors[f"{module}.qzeros"] = _pack(stored_z, bits)  # (groups, out*b/32)
        tensors[f"{module}.scales"] = s.t().half()
        tensors[f"{module}.g_idx"] = g_idx.to(torch.int32)
        if reference:
            weights[name] = _deq(q, z, s, size)[:, unperm]
    config = {
        "quant_method": "gptq",
        "bits": bits,
        "group_size": group,
        "desc_act": desc_act,
        "sym": sym,
        "checkpoint_format": "gptq_v2" if v2 else "gptq",
        "lm_head": lm_head,
    }
    _write(dst, tensors, config)
    return Written(dst, weights)


def _act_order(name: str, in_features: int, seed: int) -> torch.Tensor:
    """A random column order, the same for the layers that read the same input (q, k
    and v; gate and up), as act-order gives them: their inputs' statistics agree."""
    module = name.removesuffix(".weight")
    shared = {"k_proj": "q_proj", "v_proj": "q_proj", "up_proj": "gate_proj"}
    path, _, leaf = module.rpartition(".")
    key = f"{path}.{shared.get(leaf, leaf)}"
    generator = torch.Generator().manual_seed(seed + sum(map(ord, key)) * 7919)
    return torch.randperm(in_features, generator=generator)


def _deq(q: torch.Tensor, z: torch.Tensor, s: torch.Tensor, group: int) -> torch.Tensor:
    """(q - z) * s in float64, z and s repeated over their groups."""
    zz = z.double().repeat_interleave(group, 1)
    ss = s.double().repeat_interleave(group, 1)
    return (q.double() - zz) * ss


def _ct_scheme(args: dict, activations: dict | None = None):  # noqa: ANN202
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    inputs = None if activations is None else QuantizationArgs(**activations)
    return QuantizationScheme(
        targets=["Linear"], weights=QuantizationArgs(**args), input_activations=inputs
    )


def write_compressed_tensors(
    float_dir: Path,
    dst: Path,
    fmt: str,
    args: dict,
    activations: dict | None = None,
    reference: bool = True,
) -> Written:
    """A compressed-tensors checkpoint written by the package's own compressor for
    ``fmt`` ("pack-quantized", "int-quantized", "float-quantized"); ``Written.weights``
    is the package's own decompression of each layer (in float64)."""
    from compressed_tensors.compressors.base import BaseCompressor
    from compressed_tensors.quantization.utils.helpers import calculate_qparams

    scheme = _ct_scheme(args, activations)
    compressor = BaseCompressor.get_value_from_registry(fmt)
    tensors = _copy_dir(float_dir, dst)
    weights = {}
    for name in quantized_names(tensors):
        w = tensors.pop(name).to(torch.bfloat16)
        out_features, in_features = w.shape
        low, high = _ranges(w.float(), scheme.weights)
        scale, zero_point = calculate_qparams(low, high, scheme.weights)
        state = {"weight": w, "weight_scale": scale.to(torch.bfloat16)}
        if not scheme.weights.symmetric:
            state["weight_zero_point"] = zero_point
        compressed = compressor.compress(state, scheme)
        module = name.removesuffix(".weight")
        tensors.update({f"{module}.{k}": v for k, v in compressed.items()})
        if reference:
            weights[name] = compressor.decompress(dict(compressed), scheme)["weight"].double()
    groups = {"group_0": {"targets": ["Linear"], **scheme.model_dump(exclude={"targets"})}}
    config = {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "quantization_status": "compressed",
        "config_groups": groups,
        "ignore": ["lm_head"],
    }
    _write(dst, tensors, json.loads(json.dumps(config, default=str)))
    return Written(dst, weights)


def _ranges(w: torch.Tensor, args) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001
    """(min, max) of w over what one scale covers, as the package's observers give them."""
    strategy = str(getattr(args.strategy, "value", args.strategy))
    out_features, in_features = w.shape
    if strategy == "tensor":
        return w.amin().reshape(1), w.amax().reshape(1)
    if strategy == "channel":
        return w.amin(1, keepdim=True), w.amax(1, keepdim=True)
    if strategy == "group":
        grouped = w.reshape(out_features, -1, args.group_size)
        return grouped.amin(-1), grouped.amax(-1)
    rows, cols = args.block_structure  # block
    blocks = w.reshape(out_features // rows, rows, in_features // cols, cols)
    return blocks.amin((1, 3)), blocks.amax((1, 3))


def write_fp8_blocks(
    float_dir: Path, dst: Path, block: tuple[int, int], reference: bool = True
) -> Written:
    """An FP8 checkpoint as DeepSeek's and Qwen's FP8 files are: e4m3 weights and a
    ``weight_scale_inv`` per block; ``Written.weights`` is the compressed-tensors
    package's FP8-block dequantizer's reading of each layer (in float64)."""
    from compressed_tensors.entrypoints.convert.converters.fp8block_dequantizer import (
        FP8BlockDequantizer,
    )

    dequantizer = FP8BlockDequantizer(weight_block_size=block)
    tensors = _copy_dir(float_dir, dst)
    weights = {}
    top = torch.finfo(torch.float8_e4m3fn).max
    for name in quantized_names(tensors):
        w = tensors.pop(name).float()
        out_features, in_features = w.shape
        rows, cols = block
        padded = torch.zeros(-(-out_features // rows) * rows, -(-in_features // cols) * cols)
        padded[:out_features, :in_features] = w
        blocks = padded.reshape(padded.shape[0] // rows, rows, padded.shape[1] // cols, cols)
        scale = (blocks.abs().amax((1, 3)) / top).clamp(min=1e-8)
        expanded = scale.repeat_interleave(rows, 0).repeat_interleave(cols, 1)
        fp8 = (padded / expanded)[:out_features, :in_features].to(torch.float8_e4m3fn)
        module = name.removesuffix(".weight")
        tensors[name] = fp8
        tensors[f"{module}.weight_scale_inv"] = scale
        if reference:
            weights[name] = dequantizer._create_dequantized_weight(fp8, scale).double()
    config = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": list(block),
    }
    _write(dst, tensors, config)
    return Written(dst, weights)


def write_float_twin(written: Written, dst: Path, dtype: torch.dtype = torch.float32) -> Path:
    """A float checkpoint of ``written``'s dequantized weights (``reference=True``), its
    other tensors (vocabulary, norms, biases) as they are."""
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    for f in written.path.iterdir():
        if f.name not in ("model.safetensors", "config.json"):
            shutil.copy(f, dst / f.name)
    config = json.loads((written.path / "config.json").read_text())
    config.pop("quantization_config")
    (dst / "config.json").write_text(json.dumps(config))
    tensors = {  # the vocabulary, norms and biases
        name: t
        for name, t in load_file(written.path / "model.safetensors").items()
        if name.endswith(".bias") or name.rpartition(".")[0] + ".weight" not in written.weights
    }
    tensors.update({name: w.to(dtype) for name, w in written.weights.items()})
    save_file(tensors, dst / "model.safetensors")
    return dst
