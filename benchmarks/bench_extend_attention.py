"""Prefill attention: the C++ extend kernel (cpu backend) vs SDPA (torch backend).

Both backends run the same prefill pass through their public interface
(``prepare`` once, then ``forward`` for every layer, which also stores the new
tokens' K/V), on the default model's attention shape (30 layers, 9 heads, 3 KV
heads, head dim 64). The torch backend attends a fresh prompt with causal SDPA
(torch's flash attention for CPU), and an extend on a cached prefix with SDPA
over K/V gathered from the pool under a mask; the cpu backend attends both with
its extend kernel. Per scenario and dtype: the median time of a whole pass (all
layers) over ``--repeats`` runs, each side alternating with the other, and the
ratio torch / cpu. Shares its harness with bench_decode_attention.py.

``--builds native avx512``: the kernel alone, built for each of those targets, on
every scenario in bfloat16 (over a bfloat16 pool), the builds alternating call by
call: on a CPU with AVX512-BF16 the native build takes its dot products, the avx512
build (``-march=x86-64-v4``) float32 arithmetic. Prints medians and each build's
time over the first's; writes ``results/extend_attention_builds.json``.

Usage: .venv/bin/python benchmarks/bench_extend_attention.py [--repeats 7]
           [--builds native avx512]
Writes benchmarks/results/extend_attention.json.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch
from bench_decode_attention import HEAD_DIM, HEADS, KV_HEADS, LAYERS, compare

from radixlm.kernels.cpu.extend_attention import load_extend_attention
from radixlm.kernels.cpu.native import KERNEL_TARGETS
from radixlm.runtime.model_store import cache_root

RESULTS = Path(__file__).parent / "results" / "extend_attention.json"
BUILD_RESULTS = RESULTS.with_name("extend_attention_builds.json")


def scenarios() -> dict[str, list[tuple[int, int]]]:
    """(cached tokens, new tokens) per request."""
    rng = random.Random(0)
    return {
        "1 prompt, 1,000 tokens": [(0, 1000)],
        "1 prompt, 4,000 tokens": [(0, 4000)],
        "8 prompts, 20-400 tokens": [(0, rng.randint(20, 400)) for _ in range(8)],
        "512 new on 2,000 cached": [(2000, 512)],
        "16 x 40 new on 600 cached": [(600, 40)] * 16,
    }


def kernel_case(requests: list[tuple[int, int]], dtype: torch.dtype) -> tuple:
    """One layer's kernel arguments for the default model's attention shape: a pool of
    random K/V holding every request's tokens in slots of its own row."""
    gen = torch.Generator().manual_seed(0)
    width = max(cached + new for cached, new in requests)
    k = torch.randn(width * len(requests), KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
    v = torch.randn(width * len(requests), KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
    table = torch.arange(width * len(requests)).reshape(len(requests), width)
    new = torch.tensor([n for _, n in requests])
    q = torch.randn(int(new.sum()), HEADS, HEAD_DIM, generator=gen).to(dtype)
    prefix = torch.tensor([cached for cached, _ in requests])
    starts = torch.cumsum(new, 0) - new
    return q, k, v, table, torch.arange(len(requests)), prefix, new, starts, HEAD_DIM**-0.5


@torch.inference_mode()
def compare_builds(names: list[str], repeats: int, out: Path) -> None:
    """The kernel alone, built for each of ``names``, every scenario in bfloat16, a
    pass being ``LAYERS`` calls; builds alternating call by call."""
    kernels = {
        name: load_extend_attention(cache_root() / "kernels", KERNEL_TARGETS[name])
        for name in names
    }
    results = []
    print(f"{'scenario':28}" + "".join(f"{name + ' ms':>14}" for name in names))
    for scenario, requests in scenarios().items():
        args = kernel_case(requests, torch.bfloat16)
        out_rows = torch.empty_like(args[0])
        times: dict[str, list[float]] = {name: [] for name in names}
        for _ in range(repeats + 1):  # the first round warms up
            for name, kernel in kernels.items():
                start = time.perf_counter()
                for _layer in range(LAYERS):
                    kernel.launch(*args, out_rows)
                times[name].append(time.perf_counter() - start)
        medians = {name: statistics.median(ts[1:]) * 1e3 for name, ts in times.items()}
        first = medians[names[0]]
        cells = [f"{medians[names[0]]:14.1f}"]
        cells += [f"{medians[n]:8.1f} {medians[n] / first:4.2f}x" for n in names[1:]]
        print(f"{scenario:28}" + "".join(cells))
        dots = {name: kernel.bf16_dot_products for name, kernel in kernels.items()}
        results.append({"scenario": scenario, "median_ms": medians, "bf16_dot_products": dots})
    out.write_text(json.dumps({"repeats": repeats, "builds": names, "results": results}, indent=2))
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--builds", nargs="+", choices=list(KERNEL_TARGETS))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.builds:
        compare_builds(args.builds, args.repeats, BUILD_RESULTS)
    else:
        compare(scenarios(), args.repeats, RESULTS)


if __name__ == "__main__":
    main()
