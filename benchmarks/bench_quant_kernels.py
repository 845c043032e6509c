"""Weight-only quantized products that torch already ships, against the float paths
radixlm runs: the measurement that chooses the quantized layers' kernels.

Decode reads every weight once per token, so its speed is bytes over bandwidth: int8
weights are half of bfloat16's bytes, int4 a quarter. Whether a kernel turns that into
speed at the rows a decode pass has (1 to 64) is what this measures, on every layer
matrix of a model shape at once (more bytes than any cache, so read from memory):

  float32   radixlm's float32 ``Linear`` as the engine runs it: the few-row C++ kernel
            up to 64 rows (``use_small_batch``), oneDNN on a blocked copy above
  bfloat16  radixlm's bfloat16 ``Linear`` as the engine runs it (the same kernels)
  int8      ``torch._weight_int8pack_mm``: int8 weights, one scale per output channel,
            bfloat16 activations
  int4/g    ``torch._weight_int4pack_mm_for_cpu``: 4-bit weights with a scale and a
            zero point per group of ``g`` inputs (32 and 64), bfloat16 activations
  int8g/g   radixlm's own kernel (``radixlm.kernels.cpu.int8_group``, no torch kernel
            exists): int8 weights with a float32 scale per group of ``g`` inputs (32:
            GGUF's Q8_0 / Q5_*, 16: Q6_K), bfloat16 activations
  step ...  the products of the whole quantized decode step
            (``small_batch_quant_cpu.cpp``, ``SmallBatchKernels.quant_linear``) on the
            same storages (int4 in torch's packed layout, int8 per channel, int8 in
            groups), float32 activations, called raw as the step runs them

Each side's products run back to back over all matrices; sides alternate repeat by
repeat; medians. The machine's memory bandwidth is measured in the same run (a
bfloat16 sum over 1 GiB), and each side's one-row time is set against it: the share of
the bandwidth limit is weight bytes / time / bandwidth. Each quantized product is also
checked against the float product of its dequantized weights (the error must be a
bfloat16 rounding, not a layout mistake).

Usage: .venv/bin/python benchmarks/bench_quant_kernels.py [--shape default llama-1b]
           [--rows 1 4 16 64] [--repeats 7]
Prints a table per shape and writes benchmarks/results/quant_kernels.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from radixlm.kernels.cpu.int8_group import dequantize_reference, load_int8_group_kernels
from radixlm.kernels.cpu.small_batch import (
    INT4,
    INT8,
    QuantizedMatrix,
    SmallBatchKernels,
    load_small_batch_kernels,
)
from radixlm.runtime.executor.cpu_threads import configure_cpu
from radixlm.runtime.layers.linear import Linear
from radixlm.runtime.layers.quantization import cpu_int4_block
from radixlm.runtime.model_store.store import cache_root

RESULTS = Path(__file__).parent / "results" / "quant_kernels.json"
# Both divide every input width measured (the default model's 576 is no multiple of 128).
INT4_GROUPS = (32, 64)
INT8G_GROUPS = (32, 16)


@dataclass(frozen=True)
class Shape:
    """A decoder's layer matrices: qkv (fused), o, gate_up (fused), down."""

    hidden: int
    intermediate: int
    q_heads: int
    kv_heads: int
    head_dim: int
    layers: int

    def matrices(self) -> list[tuple[int, int]]:
        """(out, in) of every layer matrix of the model, in order."""
        qkv = (self.q_heads + 2 * self.kv_heads) * self.head_dim
        layer = [
            (qkv, self.hidden),
            (self.hidden, self.q_heads * self.head_dim),
            (2 * self.intermediate, self.hidden),
            (self.hidden, self.intermediate),
        ]
        return layer * self.layers


SHAPES = {
    "default": Shape(576, 1536, 9, 3, 64, 30),  # SmolLM2-135M
    # Llama-3.2-1B's layers, 8 of its 16: 0.5 GB of weights in bfloat16, still far
    # more than any cache, and every side's copies fit in 24 GB together.
    "llama-1b": Shape(2048, 8192, 32, 8, 64, 8),
}


# ---- quantization (per output channel int8; group-wise int4 with zero points) -----------


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 weights (out, in), bfloat16 scales (out,)): w ~ q * scale, symmetric."""
    scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-12)
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale.to(torch.bfloat16)


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale.float()[:, None]


def quantize_int4(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(4-bit codes 0..15 as int32 (out, in), bfloat16 scales and zero points
    (in / group, out, 2)) in torch's convention: w ~ (code - 8) * scale + zero."""
    out, inp = w.shape
    grouped = w.reshape(out, inp // group, group)
    low, high = grouped.amin(dim=-1, keepdim=True), grouped.amax(dim=-1, keepdim=True)
    scale = ((high - low) / 15).clamp(min=1e-12)
    codes = torch.round((grouped - low) / scale).clamp(0, 15).to(torch.int32)
    zero = low + 8 * scale  # code 8 sits at the zero point
    scales_zeros = torch.stack((scale.squeeze(-1).t(), zero.squeeze(-1).t()), dim=-1)
    return codes.reshape(out, inp), scales_zeros.to(torch.bfloat16).contiguous()


def dequantize_int4(codes: torch.Tensor, scales_zeros: torch.Tensor, group: int) -> torch.Tensor:
    out, inp = codes.shape
    scale = scales_zeros[..., 0].float().t()[:, :, None]  # (out, in / group, 1)
    zero = scales_zeros[..., 1].float().t()[:, :, None]
    grouped = codes.reshape(out, inp // group, group).float()
    return ((grouped - 8) * scale + zero).reshape(out, inp)


def quantize_int8_groups(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 weights (out, in), float32 scales (out, in / group)): symmetric per group."""
    out, inp = w.shape
    scale = (w.reshape(out, -1, group).abs().amax(dim=-1) / 127).clamp(min=1e-12)
    q = torch.round(w.reshape(out, -1, group) / scale[..., None]).clamp(-127, 127)
    return q.reshape(out, inp).to(torch.int8), scale.contiguous()


# ---- the sides -------------------------------------------------------------------------

Product = Callable[[torch.Tensor], torch.Tensor]  # x (rows, in) -> (rows, out)


def float_side(weights: list[torch.Tensor], dtype: torch.dtype) -> list[Product]:
    """radixlm's ``Linear`` in ``dtype``, prepared and with the few-row kernel, as the
    engine runs it."""
    kernels = load_small_batch_kernels(cache_root() / "kernels")
    products = []
    for w in weights:
        linear = Linear(w.shape[1], w.shape[0], False, dtype, "cpu")
        linear.weight.data.copy_(w)
        linear.prepare()
        linear.use_small_batch(kernels)
        products.append(linear)
    return products


def int8_side(weights: list[torch.Tensor]) -> list[Product]:
    products = []
    for w in weights:
        q, scale = quantize_int8(w)
        products.append(lambda x, q=q, s=scale: torch._weight_int8pack_mm(x, q, s))
    return products


def int4_side(weights: list[torch.Tensor], group: int) -> list[Product]:
    products = []
    for w in weights:
        codes, scales_zeros = quantize_int4(w, group)
        packed = torch._convert_weight_to_int4pack_for_cpu(codes, 1)
        products.append(
            lambda x, p=packed, g=group, sz=scales_zeros: torch._weight_int4pack_mm_for_cpu(
                x, p, g, sz
            )
        )
    return products


def int8_group_side(weights: list[torch.Tensor], group: int) -> list[Product]:
    kernels = load_int8_group_kernels(cache_root() / "kernels")
    products = []
    for w in weights:
        q, scale = quantize_int8_groups(w, group)
        products.append(lambda x, q=q, s=scale: kernels.matmul(x, q, s, None))
    return products


def step_side(weights: list[torch.Tensor], storage: str) -> list[Product]:
    """The quantized decode step's product on ``storage`` ("int4/g32", "int8",
    "int8g/g32"), through its raw entry point (the step calls it with no checks)."""
    kernels = load_small_batch_kernels(cache_root() / "kernels")
    function = kernels.entry_point("quant_linear", torch.float32)
    products = []
    for w in weights:
        if storage.startswith("int4"):
            group = int(storage.split("/g")[1])
            codes, scales_zeros = quantize_int4(w, group)
            packed = torch._convert_weight_to_int4pack_for_cpu(codes, 1)
            m = QuantizedMatrix(INT4, packed, scales_zeros, None, group, cpu_int4_block(), w.shape)
        elif storage == "int8":
            q, scale = quantize_int8(w)
            scales = scale.float().unsqueeze(1).contiguous()
            m = QuantizedMatrix(INT8, q, scales, None, w.shape[1], 0, w.shape)
        else:
            group = int(storage.split("/g")[1])
            q, scale = quantize_int8_groups(w, group)
            m = QuantizedMatrix(INT8, q, scale, None, group, 0, w.shape)
        products.append(_raw_product(kernels, function, m))
    return products


def _raw_product(kernels: SmallBatchKernels, function, m: QuantizedMatrix) -> Product:
    problems = m.problems("weight", kernels.lanes)
    if problems:
        raise SystemExit("; ".join(problems))
    fields = torch.tensor(m.fields(), dtype=torch.int64)
    out_features, in_features = m.shape

    def product(x: torch.Tensor, m=m, fields=fields) -> torch.Tensor:
        y = torch.empty(x.shape[0], out_features)
        function(x.data_ptr(), fields.data_ptr(), None, y.data_ptr(), x.shape[0], in_features,
                 out_features)  # fmt: skip
        return y

    return product


STEP_SIDES = ("step int4/g32", "step int8", "step int8g/g32")


def side_bytes(weights: list[torch.Tensor]) -> dict[str, int]:
    """Weight bytes each side reads per pass (scales and zero points included)."""
    params = sum(w.numel() for w in weights)
    outs = sum(w.shape[0] for w in weights)
    out = {"float32": 4 * params, "bfloat16": 2 * params, "int8": params + 2 * outs}
    for g in INT4_GROUPS:
        out[f"int4/g{g}"] = params // 2 + 4 * (params // g)
    for g in INT8G_GROUPS:
        out[f"int8g/g{g}"] = params + 4 * (params // g)
    for name in STEP_SIDES:
        out[name] = out[name.removeprefix("step ")]
    return out


# ---- measuring -------------------------------------------------------------------------


def bandwidth_gb_s(repeats: int) -> float:
    """Memory read bandwidth: a bfloat16 sum over 1 GiB, best of ``repeats``."""
    big = torch.ones(1 << 29, dtype=torch.bfloat16)
    best = min(_timed(lambda: big.sum()) for _ in range(repeats))
    return big.numel() * 2 / best / 1e9


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def check(sides: dict[str, list[Product]], weights: list[torch.Tensor]) -> dict[str, float]:
    """Largest error of each quantized side's first matrix against the float product
    of its own dequantized weights, relative to the largest output."""
    w, x = weights[0], torch.randn(4, weights[0].shape[1]).to(torch.bfloat16)
    refs = {"int8": dequantize_int8(*quantize_int8(w))}
    for g in INT4_GROUPS:
        refs[f"int4/g{g}"] = dequantize_int4(*quantize_int4(w, g), g)
    for g in INT8G_GROUPS:
        refs[f"int8g/g{g}"] = dequantize_reference(*quantize_int8_groups(w, g), None)
    errors = {}
    for name, ref_w in refs.items():
        ref = x.float() @ ref_w.t()
        for side in (name, f"step {name}"):
            if side in sides:
                got = sides[side][0](x if side == name else x.float()).float()
                errors[side] = float((got - ref).abs().max() / ref.abs().max())
    return errors


def measure(shape: Shape, rows: list[int], repeats: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(o, i, generator=gen) * i**-0.5 for o, i in shape.matrices()]
    sides: dict[str, list[Product]] = {
        "float32": float_side(weights, torch.float32),
        "bfloat16": float_side(weights, torch.bfloat16),
        "int8": int8_side(weights),
    }
    for g in INT4_GROUPS:
        sides[f"int4/g{g}"] = int4_side(weights, g)
    for g in INT8G_GROUPS:
        sides[f"int8g/g{g}"] = int8_group_side(weights, g)
    for name in STEP_SIDES:
        sides[name] = step_side(weights, name.removeprefix("step "))
    errors = check(sides, weights)
    nbytes = side_bytes(weights)
    del weights
    seconds: dict[int, dict[str, float]] = {}
    widths = [inp for _, inp in shape.matrices()]
    for n in rows:
        xs = {w: torch.randn(n, w) for w in set(widths)}  # one input per input width
        inputs = {"float32": xs, "bfloat16": {w: x.to(torch.bfloat16) for w, x in xs.items()}}
        times: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(repeats):
            for name, products in sides.items():
                wide = name == "float32" or name.startswith("step ")
                ins = inputs["float32" if wide else "bfloat16"]
                xs_in_order = [ins[w] for w in widths]
                times[name].append(_timed(lambda p=products, x=xs_in_order: _run(p, x)))
        seconds[n] = {name: statistics.median(t) for name, t in times.items()}
    return {"seconds": seconds, "bytes": nbytes, "errors": errors}


def _run(products: list[Product], xs: list[torch.Tensor]) -> None:
    for product, x in zip(products, xs, strict=True):
        product(x)


def print_table(name: str, result: dict, bandwidth: float) -> None:
    seconds, nbytes = result["seconds"], result["bytes"]
    sides = list(next(iter(seconds.values())))
    print(f"\n{name}: all layer matrices, ms per pass (x: speed-up over bfloat16)")
    print(f"{'rows':>5} " + " ".join(f"{s:>16}" for s in sides))
    for n, by_side in seconds.items():
        bf16 = by_side["bfloat16"]
        cells = [f"{1000 * t:8.2f} ({bf16 / t:4.2f}x)" for t in by_side.values()]
        print(f"{n:>5} " + " ".join(f"{c:>16}" for c in cells))
    one = seconds[min(seconds)]
    shares = [f"{nbytes[s] / one[s] / 1e9 / bandwidth:16.0%}" for s in sides]
    print(f"{'BW%':>5} " + " ".join(shares) + f"   (one row; bandwidth {bandwidth:.1f} GB/s)")
    errors = ", ".join(f"{k} {v:.2e}" for k, v in result["errors"].items())
    print(f"largest error against the dequantized float product (relative): {errors}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", nargs="+", choices=SHAPES, default=list(SHAPES))
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 4, 16, 64])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=0, help="default: all cores")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    configure_cpu(args.threads or torch.get_num_threads())
    bandwidth = bandwidth_gb_s(args.repeats)
    report = {
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "bandwidth_gb_s": bandwidth,
        "repeats": args.repeats,
        "shapes": {},
    }
    for name in args.shape:
        result = measure(SHAPES[name], args.rows, args.repeats)
        report["shapes"][name] = result
        print_table(name, result, bandwidth)
    args.out.parent.mkdir(exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
