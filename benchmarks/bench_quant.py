"""Quantized weights at a realistic size: a random-weight model of Llama-3.2-1B's shape
(speed does not depend on the weights' values), each weight storage in its own
process, against the machine's limits measured in the same run.

  memory bandwidth   a bfloat16 sum over 1 GiB (``bench_quant_kernels.bandwidth_gb_s``)
  GEMM peak          oneDNN's packed matmul, 1,024 rows, over the model's layer matrices,
                     in the dtype the engine's prompt passes use (``gemm_dtype``)

Per side (``--sides``; the engine's defaults otherwise, dtype auto):

  decode tok/s       one stream, 64 new tokens after a 16-token prompt (median of 3)
  prefill tok/s      a 1,000-token prompt, 1 new token (median of 3)
  weight MB          the model's parameters and buffers (``Placement.weight_bytes``)
  RSS MB             the side's process after loading and one request
  bandwidth share    weight bytes x decode tok/s / bandwidth (each decode step reads
                     every weight once; the KV cache and activations are left out)
  GEMM share         2 x layer parameters x prefill tok/s / GEMM peak (attention and the
                     LM head, which a prompt runs for its last row only, left out)

Usage: .venv/bin/python benchmarks/bench_quant.py [--sides bfloat16 int8 int4]
           [--layers 16] [--compile]
Writes benchmarks/results/quant_llama1b.json. The model (2.5 GB in bfloat16) is written
once under the radixlm cache.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from bench_quant_kernels import SHAPES, bandwidth_gb_s
from gpu_check import LLAMA_1B  # Llama-3.2-1B's shape, tied embeddings

from radixlm.runtime.executor.cpu_threads import configure_cpu
from radixlm.runtime.layers.linear import gemm_dtype
from radixlm.runtime.model_store import cache_root
from radixlm.runtime.models import write_random_model

RESULTS = Path(__file__).parent / "results" / "quant_llama1b.json"
SIDES = {
    "bfloat16": {"dtype": "bfloat16"},
    "int8": {"quantization": "int8"},
    "int4": {"quantization": "int4"},
}


def model_dir(layers: int) -> Path:
    path = cache_root() / "bench-models" / f"llama-1b-shape-{layers}l"
    if not (path / "config.json").is_file():
        write_random_model(path, {**LLAMA_1B, "num_hidden_layers": layers})
    return path


def run_side(path: Path, options: dict) -> dict:
    """Child process: one engine, its figures as one JSON line."""
    import radixlm

    with radixlm.Engine(model_path=str(path), max_total_tokens=4096, **options) as engine:
        prompt = list(range(1000, 1016))
        long_prompt = [1000 + (i * 7919) % 100000 for i in range(1000)]

        def timed(ids: list[int], n: int) -> float:
            engine.flush_cache()
            params = {"temperature": 0, "max_new_tokens": n, "ignore_eos": True}
            start = time.perf_counter()
            engine.generate(input_ids=ids, sampling_params=params)
            return time.perf_counter() - start

        timed(prompt, 4)  # warm-up
        # decode alone: a 64-token run less a 1-token run on the same prompt
        decode = [63 / (timed(prompt, 64) - timed(prompt, 1)) for _ in range(3)]
        prefill = [1000 / timed(long_prompt, 1) for _ in range(3)]
        placement = engine.get_stats().placement
        status = Path("/proc/self/status").read_text()
        rss_mb = int(status.split("VmRSS:")[1].split()[0]) / 1024
    return {
        "decode_tok_s": statistics.median(decode),
        "prefill_tok_s": statistics.median(prefill),
        "weight_mb": placement.weight_bytes / 1e6,
        "weights": placement.weights,
        "rss_mb": rss_mb,
    }


def gemm_peak_gflops(layers: int) -> float:
    """oneDNN's packed matmul of 1,024 rows over one layer's matrices, in gemm_dtype."""
    dtype = gemm_dtype(torch.bfloat16)
    shape = SHAPES["llama-1b"]
    matrices = shape.matrices()[:4]
    weights = [torch.randn(o, i).to(dtype) for o, i in matrices]
    packed = [torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), 1024) for w in weights]
    xs = [torch.randn(1024, w.shape[1]).to(dtype) for w in weights]
    flops = sum(2 * 1024 * w.numel() for w in weights)

    def once() -> float:
        start = time.perf_counter()
        for x, p in zip(xs, packed):
            torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "")
        return time.perf_counter() - start

    once()
    return flops / min(once() for _ in range(5)) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sides", nargs="+", default=list(SIDES), choices=SIDES)
    parser.add_argument("--layers", type=int, default=16, help="16: the whole model")
    parser.add_argument("--compile", action="store_true", help="enable_torch_compile too")
    parser.add_argument("--side", help=argparse.SUPPRESS)  # child process
    args = parser.parse_args()
    path = model_dir(args.layers)
    if args.side:
        options = {**SIDES[args.side], "enable_torch_compile": args.compile}
        print(json.dumps(run_side(path, options)), flush=True)
        return
    configure_cpu(torch.get_num_threads())
    with torch.inference_mode():
        bandwidth = bandwidth_gb_s(5)
        peak = gemm_peak_gflops(args.layers)
    # the layers' parameters: a prompt's GEMM work (its LM head runs for one row)
    params = sum(o * i for o, i in SHAPES["llama-1b"].matrices()) // 8 * args.layers
    print(
        f"bandwidth {bandwidth:.1f} GB/s, GEMM peak {peak:.0f} GFLOP/s; layers {params / 1e9:.2f}B"
    )
    results = {}
    for side in args.sides:
        cmd = [sys.executable, __file__, "--side", side, "--layers", str(args.layers)]
        cmd += ["--compile"] if args.compile else []
        out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
        if out.returncode:
            raise SystemExit(f"{side} failed:\n{out.stderr[-3000:]}")
        r = json.loads(out.stdout.strip().splitlines()[-1])
        r["bandwidth_share"] = r["weight_mb"] * 1e6 * r["decode_tok_s"] / (bandwidth * 1e9)
        r["gemm_share"] = 2 * params * r["prefill_tok_s"] / (peak * 1e9)
        results[side] = r
        print(
            f"{side:9} ({r['weights']}): decode {r['decode_tok_s']:.1f} tok/s "
            f"({r['bandwidth_share']:.0%} of bandwidth), prefill {r['prefill_tok_s']:.0f} tok/s "
            f"({r['gemm_share']:.0%} of GEMM peak), weights {r['weight_mb']:.0f} MB, "
            f"RSS {r['rss_mb']:.0f} MB",
            flush=True,
        )
    report = {
        "bandwidth_gb_s": bandwidth,
        "gemm_peak_gflops": peak,
        "gemm_dtype": str(gemm_dtype(torch.bfloat16)),
        "layers": args.layers,
        "compile": args.compile,
        "sides": results,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
