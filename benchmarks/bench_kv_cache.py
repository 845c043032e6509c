"""What a quantized KV cache costs and buys (``kv_cache_dtype``), one run, the default
model in bfloat16, every side on the same model and machine:

  perplexity   *The Tempest* by llama.cpp's method (``radixlm perplexity``'s), each
               format; the windows prefill through the pool, so they attend the
               quantized K/V (radixlm.runtime.attention.torch_sdpa)
  capacity     the pool's tokens in ``--kv-memory-gb`` and its bytes per token
  concurrency  ``--requests`` requests of ``--request-tokens`` (prompt + 64 new) on a pool
               of ``--small-pool-gb``: how many run at once (polled), each of
               ``--concurrency-formats`` against bf16
  decode       one stream's decode tokens/s on a ``--context``-token prompt, the
               ``--decode-backend`` (torch by default), each of ``--decode-formats``
               against bf16, ``--repeats`` runs alternating the sides

Usage: .venv/bin/python benchmarks/bench_kv_cache.py [--max-windows N] [--repeats 3]
           [--out benchmarks/results/kv_cache.json]
Prints medians and ratios to bfloat16 and writes the JSON report.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import radixlm
from radixlm.runtime.entrypoints.perplexity import DEFAULT_TEXT, measure_perplexity
from radixlm.runtime.model_store import pull_default_model

RESULTS = Path(__file__).parent / "results" / "kv_cache.json"
FORMATS = ("auto", "int8", "fp8_e4m3", "fp8_e5m2", "kivi4", "kivi2")
NEW_TOKENS = 64


def _engine(model_dir: Path, kv_cache_dtype: str, **options: Any) -> radixlm.Engine:
    return radixlm.Engine(
        model_path=str(model_dir), dtype="bfloat16", kv_cache_dtype=kv_cache_dtype, **options
    )


def perplexity_and_capacity(
    model_dir: Path, text: str, args: argparse.Namespace
) -> dict[str, dict[str, Any]]:
    """Each format's perplexity, pool capacity in ``kv_memory_gb`` and bytes per token."""
    out = {}
    for fmt in FORMATS:
        with _engine(model_dir, fmt, kv_memory_gb=args.kv_memory_gb) as engine:
            result = measure_perplexity(engine, text, args.context_ppl, args.max_windows)
            stats = engine.get_stats()
        out[fmt] = {
            "kv_format": stats.placement.kv_format,
            "perplexity": result.perplexity,
            "scored_tokens": result.num_scored_tokens,
            "capacity_tokens": stats.kv_capacity,
            "bytes_per_token": stats.placement.kv_bytes_per_token,
        }
        print(f"{fmt:9} {result.describe()}; {stats.kv_capacity:,} tokens", flush=True)
    return out


def concurrency(model_dir: Path, ids: list[int], fmt: str, args: argparse.Namespace) -> dict:
    """The most requests running at once, polled while ``--requests`` distinct requests
    of ``--request-tokens`` each are served on a pool of ``--small-pool-gb``."""
    prompt_len = args.request_tokens - NEW_TOKENS
    prompts = [ids[i * prompt_len : (i + 1) * prompt_len] for i in range(args.requests)]
    params = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}
    with _engine(model_dir, fmt, kv_memory_gb=args.small_pool_gb) as engine:
        peak, done = 0, threading.Event()

        def poll() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, engine.get_stats().num_running)
                time.sleep(0.01)

        poller = threading.Thread(target=poll)
        poller.start()
        started = time.perf_counter()
        engine.generate(input_ids=prompts, sampling_params=params)
        seconds = time.perf_counter() - started
        done.set()
        poller.join()
        capacity = engine.get_stats().kv_capacity
    fit = capacity // args.request_tokens
    print(f"{fmt:9} pool {capacity:,} tokens: fits {fit}, ran {peak} at once, {seconds:.1f} s")
    return {"capacity_tokens": capacity, "fit": fit, "peak_running": peak, "seconds": seconds}


def decode_speed(model_dir: Path, ids: list[int], args: argparse.Namespace) -> dict[str, list]:
    """One stream's decode tokens/s after a ``--context``-token prompt, the sides
    alternating run by run (the prompt cached after a side's first run)."""
    params = {"temperature": 0, "max_new_tokens": NEW_TOKENS + 1, "ignore_eos": True}
    prompt = ids[: args.context]
    engines = {
        fmt: _engine(
            model_dir,
            fmt,
            attention_backend=args.decode_backend,
            max_total_tokens=args.context + 1024,
        )
        for fmt in ("auto", *args.decode_formats)
    }
    speeds: dict[str, list[float]] = {fmt: [] for fmt in engines}
    try:
        for engine in engines.values():  # warm-up: the prompt prefilled and cached
            engine.generate(input_ids=prompt, sampling_params={**params, "max_new_tokens": 2})
        for _ in range(args.repeats):
            for fmt, engine in engines.items():
                meta = engine.generate(input_ids=prompt, sampling_params=params)["meta_info"]
                speeds[fmt].append(NEW_TOKENS / (meta["e2e_latency"] - meta["ttft"]))
    finally:
        for engine in engines.values():
            engine.shutdown()
    for fmt, values in speeds.items():
        print(f"{fmt:9} decode at {args.context} tokens: {[round(v, 1) for v in values]} tok/s")
    return speeds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context-ppl", type=int, default=512, help="perplexity window")
    parser.add_argument("--max-windows", type=int, default=None, help="perplexity windows")
    parser.add_argument("--kv-memory-gb", type=float, default=1.0)
    parser.add_argument("--small-pool-gb", type=float, default=0.18)
    parser.add_argument("--request-tokens", type=int, default=1024)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--context", type=int, default=4096, help="decode's prompt")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency-formats", nargs="+", default=["int8", "kivi4", "kivi2"])
    parser.add_argument("--decode-formats", nargs="+", default=["int8"])
    parser.add_argument("--decode-backend", default="torch", help="attention_backend")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    model_dir = pull_default_model(progress=False)
    text = DEFAULT_TEXT.read_text(encoding="utf-8")
    sides = perplexity_and_capacity(model_dir, text, args)
    with _engine(model_dir, "auto", max_total_tokens=64) as engine:
        ids = engine.tokenizer(text, add_special_tokens=False).input_ids
    fits = {
        fmt: concurrency(model_dir, ids, fmt, args) for fmt in ("auto", *args.concurrency_formats)
    }
    speeds = decode_speed(model_dir, ids, args)

    bf16 = sides["auto"]
    print(f"\n{'kv cache':10} {'perplexity':>11} {'vs bf16':>8} {'bytes/token':>12} {'tokens':>9}")
    for r in sides.values():
        delta = r["perplexity"] / bf16["perplexity"] - 1
        r["perplexity_delta"] = delta
        r["capacity_ratio"] = r["capacity_tokens"] / bf16["capacity_tokens"]
        print(
            f"{r['kv_format']:10} {r['perplexity']:11.4f} {delta:+8.2%} "
            f"{r['bytes_per_token']:12,} {r['capacity_tokens']:9,} ({r['capacity_ratio']:.2f}x)"
        )
    base = fits["auto"]
    for fmt in args.concurrency_formats:
        fit = fits[fmt]
        fit["fit_ratio"] = fit["fit"] / base["fit"]
        fit["peak_ratio"] = fit["peak_running"] / base["peak_running"]
        print(
            f"{args.request_tokens}-token requests on {args.small_pool_gb} GiB, {fmt}: fit "
            f"{base['fit']} -> {fit['fit']} ({fit['fit_ratio']:.2f}x), ran at once "
            f"{base['peak_running']} -> {fit['peak_running']} ({fit['peak_ratio']:.2f}x)"
        )
    medians = {fmt: statistics.median(v) for fmt, v in speeds.items()}
    over_bf16 = {
        fmt: statistics.median(a / b for a, b in zip(speeds[fmt], speeds["auto"]))
        for fmt in args.decode_formats
    }
    print(
        f"decode at {args.context} tokens ({args.decode_backend} backend), tok/s: "
        f"bf16 {medians['auto']:.1f}, "
        + ", ".join(f"{f} {medians[f]:.1f} ({over_bf16[f]:.2f}x)" for f in args.decode_formats)
    )
    report = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "formats": sides,
        "concurrency": fits,
        "decode": {"tok_s": speeds, "median": medians, "over_bf16": over_bf16},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
