"""Tensor parallelism on the CPU: one engine over 2 ranks (gloo, 2 processes, each with
its share of the cores) against one engine on 1 rank with all of them, same model,
same requests, one after the other in this run. Under tensor parallelism the C++
few-row layer kernels are off (they run whole layers), so 1 rank runs twice: with its
default paths (``tp1``) and with them off too (``tp1-eager``: the same forward path as
each rank of ``tp2``).

Model: Llama-3.2-1B's shape with random weights (speed does not depend on the
weights' values), bfloat16, written once under the radixlm cache (``bench-models/``);
``--layers`` narrows it (the default keeps all 16).

Workloads (greedy, every request forced to its token count, prefix cache flushed
before each run):
  single   one stream: a 100-token prompt, 64 new tokens (decode tok/s)
  batch    16 prompts of 100 tokens, 32 new each (output tok/s)
  prefill  one 512-token prompt, 1 new token (prompt tok/s)

For the 2-rank engine the run also reports rank 0's share of wall time spent in the
ranks' collectives (all-reduces and the logits' all-gather, waiting for the slower
rank included: ``EngineStats.tensor_parallel``). Medians of ``--repeats``.

Usage: .venv/bin/python benchmarks/bench_tp.py [--repeats 3] [--layers 16] [--out PATH]
Writes benchmarks/results/tp.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from gpu_check import LLAMA_1B  # noqa: E402

from radixlm.runtime.entrypoints.engine import Engine  # noqa: E402
from radixlm.runtime.model_store import cache_root  # noqa: E402
from radixlm.runtime.models import write_random_model  # noqa: E402

RESULTS = HERE / "results" / "tp.json"
WORKLOADS = {  # name: (prompts, prompt tokens, new tokens)
    "single": (1, 100, 64),
    "batch": (16, 100, 32),
    "prefill": (1, 512, 1),
}


def checkpoint(layers: int) -> Path:
    path = cache_root() / "bench-models" / f"llama-3.2-1b-shape-{layers}l"
    if not (path / "config.json").is_file():
        print(f"writing the checkpoint to {path} ...", flush=True)
        write_random_model(path, {**LLAMA_1B, "num_hidden_layers": layers})
    return path


def run(engine: Engine, name: str, repeats: int) -> dict:
    count, prompt_len, new = WORKLOADS[name]
    rng = random.Random(0)
    params = {"temperature": 0, "max_new_tokens": new, "ignore_eos": True}
    rates, shares = [], []
    for _ in range(repeats):
        prompts = [[rng.randrange(100, 100_000) for _ in range(prompt_len)] for _ in range(count)]
        engine.flush_cache()
        before = engine.get_stats().tensor_parallel
        start = time.perf_counter()
        engine.generate(input_ids=prompts, sampling_params=params)
        wall = time.perf_counter() - start
        after = engine.get_stats().tensor_parallel
        tokens = count * (prompt_len if name == "prefill" else new)
        rates.append(tokens / wall)
        if before is not None and after is not None:
            comm = (after.all_reduce_s + after.gather_s) - (before.all_reduce_s + before.gather_s)
            shares.append(comm / wall)
    result = {"tok_s": statistics.median(rates), "runs": rates}
    if shares:
        result["collective_share"] = statistics.median(shares)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--layers", type=int, default=LLAMA_1B["num_hidden_layers"])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    model = checkpoint(args.layers)
    results: dict[str, dict] = {}
    sides = {
        "tp1": {"tp_size": 1},
        "tp1-eager": {"cpu_layer_kernels": False},
        "tp2": {"tp_size": 2},
    }
    for side, options in sides.items():
        engine = Engine(model_path=str(model), dtype="bfloat16", kv_memory_gb=1.0, **options)
        try:
            engine.generate(input_ids=[[1, 2, 3, 4]], sampling_params={"max_new_tokens": 4})
            stats = engine.get_stats()
            results[side] = {
                "threads_per_rank": engine.config.resolved_num_threads,
                "paths": stats.cpu_paths.describe() if stats.cpu_paths else None,
                **{name: run(engine, name, args.repeats) for name in WORKLOADS},
            }
        finally:
            engine.shutdown()
        print(f"{side}: " + json.dumps(results[side], default=str), flush=True)
    head = ["workload", "TP=1", "TP=1 eager", "TP=2", "2/1", "2/1 eager", "collectives"]
    print("\n" + "".join(f"{h:>12}" for h in head) + "   (tok/s)")
    for name in WORKLOADS:
        one, eager, two = (results[s][name]["tok_s"] for s in sides)
        share = results["tp2"][name]["collective_share"]
        row = [name, f"{one:.1f}", f"{eager:.1f}", f"{two:.1f}", f"{two / one:.2f}"]
        print("".join(f"{c:>12}" for c in [*row, f"{two / eager:.2f}", f"{share:.0%}"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "date": time.strftime("%Y-%m-%d"),
                "cpu": platform.processor() or platform.machine(),
                "cores": os.cpu_count(),
                "model": {**LLAMA_1B, "num_hidden_layers": args.layers},
                "workloads": {k: dataclasses.asdict(_W(*v)) for k, v in WORKLOADS.items()},
                "results": results,
            },
            indent=2,
        )
    )


@dataclasses.dataclass
class _W:
    prompts: int
    prompt_tokens: int
    new_tokens: int


if __name__ == "__main__":
    main()
