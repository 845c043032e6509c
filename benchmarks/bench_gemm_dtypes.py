"""Which dtype a CPU's prompt-pass GEMMs should run in: the measurement behind
``radixlm.runtime.layers.linear.gemm_dtype`` and ``dtype="auto"``.

For every layer matrix of a model shape, a prefill chunk's product (``--rows`` rows)
four ways, each over all matrices back to back, medians of ``--repeats``:

  bf16 packed     oneDNN's bf16 matmul on the weight in its blocked layout (what a
                  bf16 ``Linear`` runs where the CPU computes bf16 natively)
  bf16 plain      torch's bf16 ``F.linear`` on the plain weight
  f32 on bf16     float32 GEMM on the bf16 values, the weight widened every call (what
                  a bf16 ``Linear`` runs on a CPU without native bf16)
  f32             float32 GEMM on a float32 weight (what a float32 model runs)

Usage: .venv/bin/python benchmarks/bench_gemm_dtypes.py [--shape default llama-1b]
           [--rows 512] [--repeats 5]
Prints GFLOP/s per way and writes benchmarks/results/gemm_dtypes.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from bench_quant_kernels import SHAPES

from radixlm.runtime.executor.cpu_threads import configure_cpu
from radixlm.runtime.layers.linear import native_bf16

RESULTS = Path(__file__).parent / "results" / "gemm_dtypes.json"


def ways(weights: list[torch.Tensor]) -> dict[str, list]:
    bf16 = [w.to(torch.bfloat16) for w in weights]
    packed = [torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), 1) for w in bf16]
    return {
        "bf16 packed": [
            lambda x, p=p: torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "")
            for p in packed
        ],
        "bf16 plain": [lambda x, w=w: F.linear(x, w) for w in bf16],
        "f32 on bf16": [lambda x, w=w: F.linear(x.float(), w.float()).bfloat16() for w in bf16],
        "f32": [lambda x, w=w: F.linear(x.float(), w) for w in weights],
    }


def measure(shape_name: str, rows: int, repeats: int) -> dict[str, float]:
    shape = SHAPES[shape_name]
    weights = [torch.randn(o, i) * i**-0.5 for o, i in shape.matrices()]
    inputs = {i: torch.randn(rows, i).to(torch.bfloat16) for _, i in shape.matrices()}
    flops = sum(2 * rows * o * i for o, i in shape.matrices())
    times: dict[str, list[float]] = {name: [] for name in ways(weights[:1])}
    sides = ways(weights)
    for products in sides.values():  # warm-up: oneDNN builds its kernels once
        for product, w in zip(products, weights):
            product(inputs[w.shape[1]])
    for _ in range(repeats):
        for name, products in sides.items():
            start = time.perf_counter()
            for product, w in zip(products, weights):
                product(inputs[w.shape[1]])
            times[name].append(time.perf_counter() - start)
    return {name: flops / statistics.median(t) / 1e9 for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", nargs="+", default=["default", "llama-1b"], choices=SHAPES)
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    configure_cpu(torch.get_num_threads())
    report = {"rows": args.rows, "native_bf16": native_bf16(), "gflops": {}}
    print(f"native bf16 (AVX512-BF16 or AMX): {native_bf16()}; {args.rows} rows")
    for name in args.shape:
        with torch.inference_mode():
            result = measure(name, args.rows, args.repeats)
        report["gflops"][name] = result
        f32 = result["f32"]
        cells = ", ".join(f"{k} {v:.0f} GFLOP/s ({v / f32:.2f}x f32)" for k, v in result.items())
        print(f"{name}: {cells}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
