"""Decode attention: the C++ kernel (cpu backend) vs gather + SDPA (torch backend).

Both backends run the same decode pass through their public interface
(``prepare`` once, then ``forward`` for every layer, which also stores the new
tokens' K/V), on the default model's attention shape (30 layers, 9 heads, 3 KV
heads, head dim 64), over a KV pool whose rows hold contiguous runs of slots as
the allocator hands them out. Per scenario and dtype: the median time of a
whole pass (all layers) over ``--repeats`` runs, each side alternating with the
other, and the ratio torch / cpu.

Usage: .venv/bin/python benchmarks/bench_decode_attention.py [--repeats 7]
Writes benchmarks/results/decode_attention.json.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch

from radixlm.runtime.attention import (
    AttentionInputs,
    CpuAttentionBackend,
    TorchAttentionBackend,
)
from radixlm.runtime.mem_cache.kv_pool import KVPool, ReqToTokenTable
from radixlm.runtime.model_store import cache_root

RESULTS = Path(__file__).parent / "results" / "decode_attention.json"
LAYERS, HEADS, KV_HEADS, HEAD_DIM = 30, 9, 3, 64


def scenarios() -> dict[str, list[int]]:
    """Cached tokens per decode row."""
    rng = random.Random(0)
    return {
        "64 rows, 20-528 tokens": [rng.randint(20, 528) for _ in range(64)],
        "32 rows, 256 tokens": [256] * 32,
        "8 rows, 1,000 tokens": [1000] * 8,
        "1 row, 1,000 tokens": [1000],
        "1 row, 4,000 tokens": [4000],
    }


def build(requests: list[tuple[int, int]], dtype: torch.dtype):
    """Both backends over a pool of random K/V holding each request's cached
    tokens and room for its new ones, the pass's inputs, and its q/k/v as views
    of one fused projection, as the model hands them over.

    requests: (cached tokens, new tokens) of each request.
    """
    total = sum(cached + new for cached, new in requests)
    pool = KVPool(LAYERS, total + 1, KV_HEADS, HEAD_DIM, dtype)
    pool.k.normal_()
    pool.v.normal_()
    table = ReqToTokenTable(len(requests), max(cached + new for cached, new in requests))
    next_slot, rows, new_slots = 1, [], []
    for cached, new in requests:
        row = table.allocate_row()
        slots = torch.arange(next_slot, next_slot + cached + new)
        next_slot += cached + new
        table.write(row, 0, slots)
        rows.append(row)
        new_slots.append(slots[cached:])
    inputs = AttentionInputs(
        rows=torch.tensor(rows),
        prefix_lens=torch.tensor([cached for cached, _ in requests]),
        extend_lens=torch.tensor([new for _, new in requests]),
        out_cache_loc=torch.cat(new_slots),
    )
    scale = HEAD_DIM**-0.5
    backends = {
        "torch": TorchAttentionBackend(pool, table, scale),
        "cpu": CpuAttentionBackend.load(pool, table, scale, cache_root() / "kernels"),
    }
    num_tokens = sum(new for _, new in requests)
    qkv = torch.randn(num_tokens, HEADS + 2 * KV_HEADS, HEAD_DIM).to(dtype)
    q, k, v = qkv.split([HEADS, KV_HEADS, KV_HEADS], dim=1)  # views, as the model's
    return backends, inputs, q, k, v


def time_pass(backend, inputs, q, k, v) -> float:
    start = time.perf_counter()
    metadata = backend.prepare(inputs)
    for layer in range(LAYERS):
        backend.forward(layer, q, k, v, metadata)
    return time.perf_counter() - start


@torch.inference_mode()
def compare(scenarios: dict[str, list[tuple[int, int]]], repeats: int, out: Path) -> None:
    """Times both backends on each scenario (requests as in ``build``) in float32
    and bfloat16, alternating run by run; prints medians and ratios, writes ``out``."""
    results = []
    print(f"{'dtype':9} {'scenario':34} {'torch ms':>9} {'cpu ms':>8} {'ratio':>6}")
    for dtype in (torch.float32, torch.bfloat16):
        for name, requests in scenarios.items():
            backends, inputs, q, k, v = build(requests, dtype)
            times: dict[str, list[float]] = {side: [] for side in backends}
            for backend in backends.values():  # warm-up
                time_pass(backend, inputs, q, k, v)
            for _ in range(repeats):
                for side, backend in backends.items():
                    times[side].append(time_pass(backend, inputs, q, k, v))
            medians = {side: statistics.median(ts) * 1e3 for side, ts in times.items()}
            ratio = medians["torch"] / medians["cpu"]
            dtype_name = str(dtype).removeprefix("torch.")
            print(
                f"{dtype_name:9} {name:34} {medians['torch']:9.1f} {medians['cpu']:8.1f}"
                f" {ratio:5.2f}x"
            )
            results.append(
                {
                    "dtype": dtype_name,
                    "scenario": name,
                    "cached_tokens": sum(cached for cached, _ in requests),
                    "new_tokens": sum(new for _, new in requests),
                    "torch_ms": medians["torch"],
                    "cpu_ms": medians["cpu"],
                    "ratio": ratio,
                    "runs_ms": {side: [t * 1e3 for t in ts] for side, ts in times.items()},
                }
            )
    out.write_text(json.dumps({"repeats": repeats, "results": results}, indent=2))
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    decode = {name: [(n, 1) for n in lens] for name, lens in scenarios().items()}
    compare(decode, args.repeats, RESULTS)


if __name__ == "__main__":
    main()
