"""Fairness under load (issue: engine reliability), both sides of each figure in one run.

  (a) a short request's time to first token while a long prompt (default ~8,100
      tokens, the default model's context is 8,192) is being prefilled, beside the
      same short requests on an idle engine. The short requests are sent one at a
      time once the long prefill's first pass has run; the long prompt's own TTFT
      and its number of passes are printed too, so the wait reads in passes.
  (b) a tight KV pool: 32 requests of ~200-token prompts + 64 new tokens (greedy,
      ignore_eos) with ``max_total_tokens=600`` (two requests fit with their
      decodes), beside the same workload with a roomy pool: wall time, retractions,
      and whether the tokens are the same.

Usage: .venv/bin/python benchmarks/bench_fairness.py [--long-tokens 8100] [--shorts 5]
           [--tight-requests 32] [--repeats 1] [--out benchmarks/results/fairness.json]
Prints medians and ratios and writes the JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import threading
import time
from pathlib import Path

from radixlm import Engine
from radixlm.runtime.model_store import pull_default_model

RESULTS = Path(__file__).parent / "results" / "fairness.json"
SHORT_PROMPTS = ["The capital of France", "Two plus two is", "Hello, my name", "Water boils at"]
WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex".split()


def long_prompt(engine: Engine, num_tokens: int) -> list[int]:
    """Exactly ``num_tokens`` token ids of varied text."""
    r = random.Random(0)
    ids: list[int] = []
    while len(ids) < num_tokens:
        text = " ".join(r.choice(WORDS) for _ in range(200))
        ids += engine.tokenizer(text)["input_ids"]
    return ids[:num_tokens]


def short_ttft(engine: Engine, prompt: str) -> float:
    """Seconds from sending ``prompt`` to its first streamed token."""
    params = {"temperature": 0, "max_new_tokens": 1, "ignore_eos": True}
    start = time.perf_counter()
    stream = engine.generate(prompt, params, stream=True)
    next(stream)
    elapsed = time.perf_counter() - start
    stream.close()
    return elapsed


def ttft_during_long_prefill(engine: Engine, long_ids: list[int], shorts: int) -> dict:
    """(a): short TTFTs on the idle engine, then while ``long_ids`` is prefilled."""
    prompts = [SHORT_PROMPTS[i % len(SHORT_PROMPTS)] + f" ({i})" for i in range(shorts)]
    idle = [short_ttft(engine, p) for p in prompts]
    engine.flush_cache()
    steps_before = engine.get_stats().num_steps
    long_result: dict = {}

    def run_long() -> None:
        start = time.perf_counter()
        params = {"temperature": 0, "max_new_tokens": 1, "ignore_eos": True}
        out = engine.generate(input_ids=long_ids, sampling_params=params)
        long_result["ttft_s"] = time.perf_counter() - start
        long_result["steps"] = engine.get_stats().num_steps - steps_before
        assert out["meta_info"]["prompt_tokens"] == len(long_ids)

    thread = threading.Thread(target=run_long)
    thread.start()
    while engine.get_stats().num_steps < steps_before + 1:
        time.sleep(0.01)
    during = []
    for p in prompts:
        if not thread.is_alive():
            break
        during.append(short_ttft(engine, p))
    thread.join()
    return {
        "idle_s": idle,
        "during_long_prefill_s": during,
        "long_prompt_tokens": len(long_ids),
        "long_ttft_s": long_result["ttft_s"],
        "long_passes": long_result["steps"],
    }


def tight_pool_prompts(engine: Engine, n: int) -> list[list[int]]:
    prompts = []
    for i in range(n):
        r = random.Random(100 + i)
        text = f"Story {i}: " + " ".join(r.choice(WORDS) for _ in range(400))
        prompts.append(engine.tokenizer(text)["input_ids"][:200])
    return prompts


def run_pool(model_dir: str, prompts: list[list[int]], max_total_tokens: int | None) -> dict:
    """(b): one engine, the whole workload at once: wall time, retractions, tokens."""
    kwargs = {} if max_total_tokens is None else {"max_total_tokens": max_total_tokens}
    engine = Engine(model_path=model_dir, dtype="float32", **kwargs)
    try:
        engine.generate("warm up", {"max_new_tokens": 2})
        before = engine.get_stats().num_retractions
        params = {"temperature": 0, "max_new_tokens": 64, "ignore_eos": True}
        start = time.perf_counter()
        outs = engine.generate(input_ids=prompts, sampling_params=params)
        wall = time.perf_counter() - start
        return {
            "wall_s": wall,
            "retractions": engine.get_stats().num_retractions - before,
            "kv_capacity": engine.get_stats().kv_capacity,
            "output_ids": [o["output_ids"] for o in outs],
        }
    finally:
        engine.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--long-tokens", type=int, default=8100)
    parser.add_argument("--shorts", type=int, default=5)
    parser.add_argument("--tight-requests", type=int, default=32)
    parser.add_argument("--tight-pool", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    model_dir = str(pull_default_model(progress=False))

    engine = Engine(model_path=model_dir, dtype="float32")
    try:
        short_ttft(engine, "warm up")
        fairness = [
            ttft_during_long_prefill(engine, long_prompt(engine, args.long_tokens), args.shorts)
            for _ in range(args.repeats)
        ]
        prompts = tight_pool_prompts(engine, args.tight_requests)
    finally:
        engine.shutdown()
    idle = statistics.median(t for f in fairness for t in f["idle_s"])
    during = statistics.median(t for f in fairness for t in f["during_long_prefill_s"])
    long_ttft = statistics.median(f["long_ttft_s"] for f in fairness)
    passes = statistics.median(f["long_passes"] for f in fairness)
    print(
        f"(a) short-request TTFT, median of {sum(len(f['idle_s']) for f in fairness)} / "
        f"{sum(len(f['during_long_prefill_s']) for f in fairness)} requests"
    )
    print(f"    idle engine                        {idle * 1e3:9.1f} ms")
    print(
        f"    during a {args.long_tokens}-token prefill       {during * 1e3:9.1f} ms"
        f"  ({during / idle:.1f}x idle; {during / (long_ttft / passes):.1f} of the long "
        f"prompt's mean pass of {long_ttft / passes:.2f} s)"
    )
    print(f"    the long prompt's own TTFT         {long_ttft:9.1f} s   over {passes:.0f} passes")

    pools = {"tight": [], "roomy": []}
    for _ in range(args.repeats):
        pools["tight"].append(run_pool(model_dir, prompts, args.tight_pool))
        pools["roomy"].append(run_pool(model_dir, prompts, None))
    same = all(t["output_ids"] == r["output_ids"] for t, r in zip(pools["tight"], pools["roomy"]))
    tight_wall = statistics.median(p["wall_s"] for p in pools["tight"])
    roomy_wall = statistics.median(p["wall_s"] for p in pools["roomy"])
    print(f"(b) {args.tight_requests} requests x (200 prompt + 64 new) tokens")
    for name in pools:
        runs = pools[name]
        wall = statistics.median(p["wall_s"] for p in runs)
        retractions = statistics.median(p["retractions"] for p in runs)
        print(
            f"    {name:<5} pool ({runs[0]['kv_capacity']:>6} slots)  {wall:7.1f} s  "
            f"{retractions:5.0f} retractions"
        )
    print(f"    tight / roomy wall time  {tight_wall / roomy_wall:.2f}x; same tokens: {same}")

    for runs in pools.values():
        for p in runs:
            del p["output_ids"]
    settings = {**vars(args), "out": str(args.out)}
    report = {"fairness": fairness, "pools": pools, "same_tokens": same, "args": settings}
    args.out.parent.mkdir(exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
