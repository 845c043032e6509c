"""Overlap scheduling on and off, side by side in one run.

The default model on this machine's device (the CPU here), greedy decoding of B
requests of 32-token prompts for ``--new-tokens`` tokens each, ``ignore_eos``: one
engine with ``overlap_schedule="on"`` (pass N+1 built and launched before pass N's
results are applied) and one with ``"off"`` (one pass at a time), run in turns,
``--repeats`` times each. Prints the median decode throughput of each side per batch
size, their ratio, and whether the two sides' tokens are the same (they must be).

On the CPU a pass runs on the engine loop's own thread, so nothing overlaps it: the
figure says what the bookkeeping costs there (``overlap_schedule="auto"`` is off on the
CPU). ``benchmarks/gpu_check.py`` measures the GPU, where the host's share of a step
hides behind the device's.

Usage: .venv/bin/python benchmarks/bench_overlap.py [--batches 1 8 32] [--new-tokens 64]
           [--repeats 3] [--json benchmarks/results/overlap.json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import radixlm
from radixlm.runtime.model_store import default_model_dir

RESULTS = Path(__file__).resolve().parent / "results" / "overlap.json"
PROMPT_TOKENS = 32
PROMPT_IDS = 10_000  # prompt ids are drawn below this: inside any vocabulary we serve
SIDES = ("on", "off")


def _prompts(batch: int) -> list[list[int]]:
    rng = random.Random(batch)
    return [[rng.randrange(3, PROMPT_IDS) for _ in range(PROMPT_TOKENS)] for _ in range(batch)]


def _decode(engine: radixlm.Engine, prompts: list[list[int]], new_tokens: int) -> tuple:
    """Seconds of one greedy call, and its tokens."""
    params = {"max_new_tokens": new_tokens, "temperature": 0.0, "ignore_eos": True}
    engine.flush_cache()
    start = time.perf_counter()
    outputs = engine.generate(input_ids=prompts, sampling_params=params)
    seconds = time.perf_counter() - start
    return seconds, [o["output_ids"] for o in outputs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args()

    model = str(default_model_dir())
    engines = {side: radixlm.Engine(model_path=model, overlap_schedule=side) for side in SIDES}
    try:
        results: dict[str, dict] = {}
        for batch in args.batches:
            prompts = _prompts(batch)
            times: dict[str, list[float]] = {side: [] for side in SIDES}
            tokens: dict[str, list] = {}
            for side in SIDES:  # warm-up: one untimed call each
                _decode(engines[side], prompts, args.new_tokens)
            for _ in range(args.repeats):
                for side in SIDES:  # in turns, so a busy moment hits both
                    seconds, tokens[side] = _decode(engines[side], prompts, args.new_tokens)
                    times[side].append(seconds)
            generated = batch * args.new_tokens
            tok_s = {side: generated / statistics.median(times[side]) for side in SIDES}
            steps_ahead = engines["on"].get_stats().num_steps_ahead
            results[str(batch)] = {
                "tok_s": tok_s,
                "ratio_on_off": tok_s["on"] / tok_s["off"],
                "runs_s": times,
                "same_tokens": tokens["on"] == tokens["off"],
                "steps_ahead_so_far": steps_ahead,
            }
            print(
                f"batch {batch:4d}: overlap on {tok_s['on']:8.1f} tok/s, "
                f"off {tok_s['off']:8.1f} tok/s, on/off {tok_s['on'] / tok_s['off']:.3f}x, "
                f"same tokens: {tokens['on'] == tokens['off']}"
            )
    finally:
        for engine in engines.values():
            engine.shutdown()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"new_tokens": args.new_tokens, "batches": results}, indent=1))


if __name__ == "__main__":
    main()
