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

Usage: .venv/bin/python benchmarks/bench_extend_attention.py [--repeats 7]
Writes benchmarks/results/extend_attention.json.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import torch
from bench_decode_attention import compare

RESULTS = Path(__file__).parent / "results" / "extend_attention.json"


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    compare(scenarios(), args.repeats, RESULTS)


if __name__ == "__main__":
    main()
