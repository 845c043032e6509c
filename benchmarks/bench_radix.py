"""The radix cache vs the no-sharing baseline (``disable_radix_cache=True``), one run.

Workloads (issue: RadixAttention):
  few-shot   a 5-shot prompt (~600 tokens) shared by 64 questions, up to 16 new tokens
             each, all submitted at once: throughput and cache hit rate.
  multi-turn an 8-turn chat, each turn's prompt = all earlier turns + a new message:
             time to first token of turn 8 over turn 1.

Usage: .venv/bin/python benchmarks/bench_radix.py [--repeats 3]
Prints medians and ratios and writes benchmarks/results/radix.json. The two engines run
one after the other in this process (never both at once), on the default model, float32.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import radixlm
from radixlm.runtime.model_store import pull_default_model

RESULTS = Path(__file__).parent / "results" / "radix.json"

SHOTS = [
    (
        "Tom has 3 apples and buys 5 more. How many apples does he have now?",
        "He starts with 3 and buys 5, so he has 3 + 5 = 8 apples. The answer is 8.",
    ),
    (
        "A train travels 60 miles per hour for 2 hours. How far does it go?",
        "Distance is speed times time: 60 * 2 = 120 miles. The answer is 120.",
    ),
    (
        "Sara reads 12 pages a day. How many pages does she read in a week?",
        "A week has 7 days, so she reads 12 * 7 = 84 pages. The answer is 84.",
    ),
    (
        "A box holds 24 pencils. Tim gives away 9. How many are left?",
        "He had 24 and gave away 9, so 24 - 9 = 15 pencils are left. The answer is 15.",
    ),
    (
        "There are 5 rows of chairs with 6 chairs each. How many chairs are there?",
        "Five rows of six chairs is 5 * 6 = 30 chairs. The answer is 30.",
    ),
]


def few_shot_prompts(num_questions: int = 64) -> list[str]:
    header = "Solve each problem step by step and end with 'The answer is N.'\n\n"
    shots = "".join(f"Question: {q}\nAnswer: {a}\n\n" for q, a in SHOTS) * 2
    return [
        f"{header}{shots}Question: A shop sells {i + 2} pens for {3 * i + 5} dollars. "
        f"What does one group of {i + 2} pens cost?\nAnswer:"
        for i in range(num_questions)
    ]


def run_few_shot(engine: radixlm.Engine, prompts: list[str]) -> dict[str, float]:
    engine.flush_cache()
    before = engine.get_stats()
    start = time.perf_counter()
    outs = engine.generate(prompts, {"temperature": 0, "max_new_tokens": 16})
    elapsed = time.perf_counter() - start
    after = engine.get_stats()
    prompt_tokens = after.num_prompt_tokens - before.num_prompt_tokens
    cached = after.num_cached_tokens - before.num_cached_tokens
    return {
        "seconds": elapsed,
        "requests_per_s": len(prompts) / elapsed,
        "out_tok_s": sum(o["meta_info"]["completion_tokens"] for o in outs) / elapsed,
        "hit_rate": cached / prompt_tokens,
    }


def run_multi_turn(engine: radixlm.Engine, turns: int = 8) -> dict[str, float]:
    engine.flush_cache()
    messages: list[dict[str, str]] = []
    ttfts = []
    for t in range(turns):
        messages.append(
            {
                "role": "user",
                "content": f"Tell me fact number {t + 1} about the "
                "ocean, in two sentences, and mention one animal.",
            }
        )
        prompt = engine.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        out = engine.generate(prompt, {"temperature": 0, "max_new_tokens": 48})
        ttfts.append(out["meta_info"]["ttft"])
        messages.append({"role": "assistant", "content": out["text"]})
    return {
        "ttft_turn1_s": ttfts[0],
        "ttft_turn8_s": ttfts[-1],
        "turn8_over_turn1": ttfts[-1] / ttfts[0],
        "prompt_tokens_turn8": out["meta_info"]["prompt_tokens"],
    }


def measure(disable: bool, repeats: int) -> dict[str, float]:
    engine = radixlm.Engine(
        model_path=str(pull_default_model(progress=False)),
        dtype="float32",
        disable_radix_cache=disable,
    )
    prompts = few_shot_prompts()
    engine.generate(prompts[0], {"max_new_tokens": 2})  # warm-up
    runs = [run_few_shot(engine, prompts) | run_multi_turn(engine) for _ in range(repeats)]
    engine.shutdown()
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    results = {"radix": measure(False, args.repeats), "no_sharing": measure(True, args.repeats)}
    radix, base = results["radix"], results["no_sharing"]
    print(f"{'metric':<22} {'radix':>10} {'no sharing':>11} {'ratio':>7}")
    for key in radix:
        ratio = radix[key] / base[key] if base[key] else float("nan")
        print(f"{key:<22} {radix[key]:>10.3f} {base[key]:>11.3f} {ratio:>6.2f}x")
    speedup = base["seconds"] / radix["seconds"]
    print(
        f"few-shot speedup (no-sharing time / radix time): {speedup:.2f}x, "
        f"hit rate {radix['hit_rate']:.1%}"
    )
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {"repeats": args.repeats, "results": results, "few_shot_speedup": speedup}, indent=2
        )
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
