"""Prompt passes over quantized layers: radixlm's quantized product against a weight
dequantized for the pass and a GEMM, by rows and matrix size: the measurement behind
``QuantizedLinear``'s row limits (``quant_kernel_max_rows``).

A decode pass of a few rows runs radixlm's product (``SmallBatchKernels.quant_product``,
the whole decode step's). A prompt pass used to dequantize every weight to bfloat16
(``DequantKernels``, ``Int8GroupKernels``) and run oneDNN's GEMM over it from 33 rows on.
The dequantized weight is written and read again each pass: a fixed cost per weight that
grows once the matrix is larger than the caches, while the product's cost grows with the
rows. So the product wins up to a row count that grows with the matrix.

Each shape is one decoder layer's four matrices (qkv, o, gate_up, down): the default
model's (576 wide), Qwen2.5-0.5B's (896) and Llama-3.2-1B's (2048), random weights
quantized in groups of 32 (int4: torch's packed layout, as a GGUF Q4_0 loads; int8g:
GGUF's Q8_0 / Q5_0 storage). Per rows, the two sides run the four matrices back to back,
in turns, and each figure is the median over the repeats. ``--per-matrix`` times each
matrix alone: the limits are per matrix.

Usage: .venv/bin/python benchmarks/bench_quant_prompt.py [--shapes default qwen-0.5b
           llama-1b] [--kinds int4 int8g] [--rows 16 32 64 96 128 192 256 384 512]
           [--repeats 5] [--per-matrix]
Prints kernel / dequantize+GEMM times and ratios and writes
benchmarks/results/quant_prompt.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from radixlm.kernels.cpu.dequant import load_dequant_kernels
from radixlm.kernels.cpu.int8_group import load_int8_group_kernels
from radixlm.kernels.cpu.small_batch import load_small_batch_kernels
from radixlm.runtime.executor.cpu_threads import configure_cpu
from radixlm.runtime.layers.quantization import (
    Int4Weight,
    Int8GroupWeight,
    QuantizedLinear,
    kernel_matrix,
    quant_kernel_max_rows,
)
from radixlm.runtime.model_store.store import cache_root

HERE = Path(__file__).resolve().parent
# (out, in) of a layer's qkv, o, gate_up and down
SHAPES = {
    "default": [(960, 576), (576, 576), (3072, 576), (576, 1536)],
    "qwen-0.5b": [(1152, 896), (896, 896), (9728, 896), (896, 4864)],
    "llama-1b": [(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192)],
}
KINDS = {"int4": Int4Weight, "int8g": Int8GroupWeight}


def layer(shape: str, kind: str) -> list[QuantizedLinear]:
    build_dir = cache_root() / "kernels"
    kernels = load_small_batch_kernels(build_dir)
    linears = []
    for out_features, in_features in SHAPES[shape]:
        weight = KINDS[kind](out_features, in_features, 32, torch.bfloat16, "cpu")
        weight.quantize_rows(0, torch.randn(out_features, in_features))
        weight.pack()
        if kind == "int4":
            weight.dequantizer = load_dequant_kernels(build_dir)
        else:
            weight.kernels = load_int8_group_kernels(build_dir)
        linear = QuantizedLinear(weight, False, torch.bfloat16, "cpu")
        if not linear.use_small_batch(kernels):
            raise SystemExit(f"{kind} {out_features}x{in_features}: the kernel does not take it")
        linears.append(linear)
    return linears


def timed(fn, repeats: int) -> list[float]:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def measure(linears: list[QuantizedLinear], rows: int, repeats: int) -> dict[str, float]:
    inputs = {lin.in_features: torch.randn(rows, lin.in_features).bfloat16() for lin in linears}
    kernels = linears[0].small_batch[0]  # type: ignore[index]
    matrices = [kernel_matrix(lin.qweight) for lin in linears]

    def kernel() -> None:
        for lin, matrix in zip(linears, matrices, strict=True):
            x = inputs[lin.in_features].float()
            kernels.quant_product(x, matrix).to(torch.bfloat16)

    def dequantized() -> None:
        for lin in linears:
            F.linear(inputs[lin.in_features], lin.qweight.dequantize(torch.bfloat16))

    sides: dict[str, list[float]] = {"kernel": [], "dequantized": []}
    for _ in range(repeats):  # in turns
        sides["kernel"] += timed(kernel, 1)
        sides["dequantized"] += timed(dequantized, 1)
    return {side: statistics.median(times) for side, times in sides.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--kinds", nargs="+", choices=list(KINDS), default=list(KINDS))
    parser.add_argument(
        "--rows", nargs="+", type=int, default=[16, 32, 64, 96, 128, 192, 256, 384, 512]
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="default: all cores")
    parser.add_argument("--per-matrix", action="store_true", help="each matrix alone")
    parser.add_argument("--json", type=Path, default=HERE / "results" / "quant_prompt.json")
    args = parser.parse_args()
    configure_cpu(args.threads or torch.get_num_threads())
    results = []
    for shape in args.shapes:
        for kind in args.kinds:
            linears = layer(shape, kind)
            groups = [[lin] for lin in linears] if args.per_matrix else [linears]
            for group in groups:
                limits = [quant_kernel_max_rows(lin.qweight) for lin in group]
                matrices = [(lin.out_features, lin.in_features) for lin in group]
                print(f"{shape}, {kind}, {matrices}: row limits {limits}")
                print(f"{'rows':>6} {'kernel ms':>10} {'dequant+GEMM ms':>16} {'kernel ahead':>13}")
                for rows in args.rows:
                    times = measure(group, rows, args.repeats)
                    ahead = times["dequantized"] / times["kernel"]
                    print(f"{rows:>6} {times['kernel']:>10.2f} {times['dequantized']:>16.2f} "
                          f"{ahead:>12.2f}x", flush=True)  # fmt: skip
                    results.append(
                        {"shape": shape, "kind": kind, "matrices": matrices, "rows": rows, **times}
                    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"threads": torch.get_num_threads(), "results": results}))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
