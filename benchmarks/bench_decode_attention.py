"""Decode attention: the C++ kernel (cpu backend) vs gather + SDPA (torch backend).

Both backends run the same decode pass through their public interface
(``prepare`` once, then ``forward`` for every layer, which also stores the new
tokens' K/V), on the default model's attention shape (30 layers, 9 heads, 3 KV
heads, head dim 64), over a KV pool whose rows hold contiguous runs of slots as
the allocator hands them out. Per scenario and dtype: the median time of a
whole pass (all layers) over ``--repeats`` runs, each side alternating with the
other, and the ratio torch / cpu.

With ``--kv-cache-dtype`` (int8, fp8_e4m3, fp8_e5m2, kivi4, kivi2: one or more) it
times the C++ kernel alone instead (over a KIVI pool, its own decode kernel,
``radixlm.kernels.cpu.kivi_attention``, the row's new token stored with the rest),
single-stream (one decode row) at contexts up to 4,096 tokens, over a pool of the
model dtype (``--dtype``, bfloat16 by default) and over each quantized pool, for two
shapes: the default model's (SmolLM2-135M: 30 layers, 9 heads, 3 KV heads, head dim
64) and Llama 3.2 1B's (16 layers, 32 heads, 8 KV heads, head dim 64). A run is
every layer of one decode step; the formats alternate run by run; it prints each
format's median and the ratio float pool / quantized pool (above 1: the quantized
pool is faster), and each format's time per kernel call (one layer) in microseconds.

Usage: .venv/bin/python benchmarks/bench_decode_attention.py [--repeats 7]
       .venv/bin/python benchmarks/bench_decode_attention.py --kv-cache-dtype int8 fp8_e4m3 \
           [--dtype bfloat16] [--isa native|avx2|avx512] [--threads 1]
Writes benchmarks/results/decode_attention.json (decode_attention_kv.json with
``--kv-cache-dtype``).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch

from radixlm.kernels.cpu.decode_attention import DecodeAttention, load_decode_attention
from radixlm.kernels.cpu.kivi_attention import KiviAttention, load_kivi_attention
from radixlm.kernels.cpu.native import AVX2, AVX512, NATIVE, KernelTarget
from radixlm.runtime.attention import (
    AttentionInputs,
    CpuAttentionBackend,
    TorchAttentionBackend,
)
from radixlm.runtime.attention.cpu_kernels import layer_scales
from radixlm.runtime.attention.cpu_kivi import kivi_cache
from radixlm.runtime.mem_cache.kivi import KiviWrites
from radixlm.runtime.mem_cache.kv_pool import KVPool, ReqToTokenTable
from radixlm.runtime.mem_cache.kv_quant import KV_CACHE_DTYPES, kv_format
from radixlm.runtime.model_store import cache_root

RESULTS = Path(__file__).parent / "results" / "decode_attention.json"
KV_RESULTS = Path(__file__).parent / "results" / "decode_attention_kv.json"
LAYERS, HEADS, KV_HEADS, HEAD_DIM = 30, 9, 3, 64
# (layers, heads, KV heads, head dim) of the kernel-alone comparison of pool formats
SHAPES = {
    "SmolLM2-135M": (30, 9, 3, 64),
    "Llama-3.2-1B": (16, 32, 8, 64),
}
CONTEXTS = (512, 1024, 2048, 4096)


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


def single_stream(
    shape: tuple[int, int, int, int], context: int, dtype: torch.dtype, fmt_name: str
) -> tuple[KVPool, ReqToTokenTable, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A pool of ``fmt_name`` ("auto": ``dtype`` itself) holding one request's
    ``context`` cached tokens of random K/V in contiguous slots, every layer, its
    table, and the decode row's q, k and v (views of one fused projection). A KIVI
    pool holds the new token too (a pass over one stores it before attention)."""
    layers, heads, kv_heads, head_dim = shape
    gen = torch.Generator().manual_seed(0)
    fmt = kv_format(fmt_name, dtype)
    pool = KVPool(layers, context + 2, kv_heads, head_dim, dtype, fmt=fmt, rows=1)
    slots = torch.arange(1, context + 2)
    table = ReqToTokenTable(1, context + 1)
    row = table.allocate_row()
    table.write(row, 0, slots)
    if pool.kivi:
        group = pool.kivi_layout.group
        writes = KiviWrites.plan(table.table, [row], [0], [context + 1], group, pool.k.device)
    for layer in range(layers):
        k, v = torch.randn(2, context + 1, kv_heads, head_dim, generator=gen).to(dtype)
        if pool.kivi:
            writes.store(pool, layer, k, v)
        else:
            pool.write(layer, slots, k, v)
    qkv = torch.randn(1, heads + 2 * kv_heads, head_dim, generator=gen).to(dtype)
    q, k, v = qkv.split([heads, kv_heads, kv_heads], dim=1)
    return pool, table, q, k, v


def time_step(
    kernel: DecodeAttention, kivi: KiviAttention | None, pool: KVPool, table, q, k, v
) -> float:
    """One decode step's attention, every layer, through the kernel alone (``kivi``'s
    over a KIVI pool)."""
    rows, lens = torch.zeros(1, dtype=torch.int64), torch.tensor([table.host.shape[1] - 1])
    scale = q.shape[-1] ** -0.5
    if pool.kivi:
        assert kivi is not None
        seq_lens = lens + 1  # the new token is stored
        start = time.perf_counter()
        for layer in range(pool.k.shape[0]):
            kivi.launch_decode(q, kivi_cache(pool, layer), table.table, rows, seq_lens, scale)
        return time.perf_counter() - start
    start = time.perf_counter()
    for layer in range(pool.k.shape[0]):
        kernel.launch(
            q, pool.k[layer], pool.v[layer], table.table, rows, lens, k, v, scale, 0, 0.0,
            *layer_scales(pool, layer),
        )  # fmt: skip
    return time.perf_counter() - start


@torch.inference_mode()
def compare_formats(
    formats: list[str], dtype: torch.dtype, repeats: int, out: Path, target: KernelTarget = NATIVE
) -> None:
    """The kernel (built for ``target``) alone over a ``dtype`` pool and over each
    quantized pool of ``formats``, single-stream, per shape and context (see the
    module doc); prints medians and ratios, writes ``out``."""
    kernel = load_decode_attention(cache_root() / "kernels", target)
    kivi = None
    if any(kv_format(name, dtype).kivi is not None for name in formats):
        kivi = load_kivi_attention(cache_root() / "kernels", target)
    names = ["auto", *formats]
    base = str(dtype).removeprefix("torch.")
    results = []
    print(f"{'shape':14} {'context':>7} " + " ".join(f"{n:>14}" for n in [base, *formats]))
    for shape_name, shape in SHAPES.items():
        for context in CONTEXTS:
            cases = {name: single_stream(shape, context, dtype, name) for name in names}
            times: dict[str, list[float]] = {name: [] for name in names}
            for case in cases.values():  # warm-up
                time_step(kernel, kivi, *case)
            for _ in range(repeats):
                for name, case in cases.items():
                    times[name].append(time_step(kernel, kivi, *case))
            medians = {name: statistics.median(ts) * 1e3 for name, ts in times.items()}
            per_call = {name: m * 1e3 / shape[0] for name, m in medians.items()}  # us per layer
            ratios = {name: medians["auto"] / medians[name] for name in formats}
            cells = [f"{medians['auto']:11.2f} ms"]
            cells += [f"{medians[n]:6.2f} {ratios[n]:5.2f}x" for n in formats]
            print(f"{shape_name:14} {context:7} " + " ".join(f"{c:>14}" for c in cells))
            print(f"{'':14} {'us/call':>7} " + " ".join(f"{per_call[n]:14.1f}" for n in names))
            results.append(
                {
                    "shape": shape_name,
                    "layers_heads_kv_heads_head_dim": shape,
                    "context": context,
                    "median_ms": {base if n == "auto" else n: m for n, m in medians.items()},
                    "ratio_vs_float": ratios,
                    "us_per_call": {base if n == "auto" else n: u for n, u in per_call.items()},
                    "runs_ms": {n: [t * 1e3 for t in ts] for n, ts in times.items()},
                }
            )
            del cases
    summary = {"repeats": repeats, "dtype": base, "isa": target.name, "results": results}
    out.write_text(json.dumps(summary, indent=2))
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--kv-cache-dtype",
        nargs="+",
        choices=[name for name in KV_CACHE_DTYPES if name != "auto"],
        help="time the kernel alone over these quantized pools against a --dtype pool",
    )
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument(
        "--isa", choices=["native", "avx2", "avx512"], default="native",
        help="the kernel build --kv-cache-dtype times",
    )  # fmt: skip
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.kv_cache_dtype:
        target = {"native": NATIVE, "avx2": AVX2, "avx512": AVX512}[args.isa]
        dtype = getattr(torch, args.dtype)
        compare_formats(args.kv_cache_dtype, dtype, args.repeats, KV_RESULTS, target)
        return
    decode = {name: [(n, 1) for n in lens] for name, lens in scenarios().items()}
    compare(decode, args.repeats, RESULTS)


if __name__ == "__main__":
    main()
