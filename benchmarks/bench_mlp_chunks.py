"""Prompt passes through the MLP in row chunks (``runtime/models/mlp.py``,
``MLP_CHUNK_BYTES``) against in one piece, on Llama-3.2-1B's shape (bfloat16).

A 1,000-token pass of that shape makes a 32 MB gate/up output per layer, and glibc
gives the engine's thread a block that size from fresh pages every time (page faults,
each page zeroed by the kernel). Each candidate is a chunk of a fixed number of rows,
or none ("whole"); one engine runs them all in turn, prompt by prompt (a new random
prompt each time, the radix cache never hit), and the page faults of each pass are
counted (the process's minor faults).

Usage: .venv/bin/python benchmarks/bench_mlp_chunks.py [--shapes 1x1000 8x100]
           [--chunks 128 256 512] [--pairs 8] [--out PATH]
Prints each candidate's median prefill time, its speed over "whole", and its median
page faults; writes benchmarks/results/mlp_chunks.json.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from bench_families import model_dir  # noqa: E402

from radixlm.runtime.models import mlp  # noqa: E402

RESULTS = HERE / "results" / "mlp_chunks.json"
WHOLE = "whole"
ONE_TOKEN = {"temperature": 0, "max_new_tokens": 1}


def use(candidate: str) -> None:
    """Sets the MLP's chunking to ``candidate``: a row count, or none."""
    if candidate == WHOLE:
        mlp.MLP_CHUNK_BYTES, mlp.MLP_CHUNK_MIN_ROWS = 1 << 62, 1
    else:
        mlp.MLP_CHUNK_BYTES, mlp.MLP_CHUNK_MIN_ROWS = 0, int(candidate)


def measure(engine, shape: tuple[int, int], candidates: list[str], pairs: int) -> dict:
    """Seconds and page faults of each candidate's prefills of ``shape`` (requests x
    tokens), the candidates in turn, after one unmeasured round."""
    rng = random.Random(0)
    requests, tokens = shape
    runs = {c: {"seconds": [], "faults": []} for c in candidates}
    for round_ in range(pairs + 1):
        for candidate in candidates:
            use(candidate)
            prompts = [[rng.randrange(100, 30000) for _ in range(tokens)] for _ in range(requests)]
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            start = time.perf_counter()
            engine.generate(input_ids=prompts, sampling_params=ONE_TOKEN)
            seconds = time.perf_counter() - start
            if round_:
                runs[candidate]["seconds"].append(seconds)
                runs[candidate]["faults"].append(
                    resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
                )
    whole = statistics.median(runs[WHOLE]["seconds"])
    return {
        c: {
            "median_ms": statistics.median(r["seconds"]) * 1e3,
            "speed_over_whole": whole / statistics.median(r["seconds"]),
            "median_faults": statistics.median(r["faults"]),
            **r,
        }
        for c, r in runs.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["1x1000", "8x100"])
    parser.add_argument("--chunks", nargs="+", type=int, default=[128, 256, 512])
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    import radixlm

    engine = radixlm.Engine(model_path=str(model_dir("llama-3.2-1b")), dtype="bfloat16")
    engine.generate(input_ids=[[5, 6, 7]], sampling_params=ONE_TOKEN)
    candidates = [WHOLE, *map(str, args.chunks)]
    results = {}
    try:
        for text in args.shapes:
            requests, tokens = (int(v) for v in text.split("x"))
            results[text] = measure(engine, (requests, tokens), candidates, args.pairs)
            for c, r in results[text].items():
                print(f"{text:8} {c:>6} rows: {r['median_ms']:8.1f} ms  "
                      f"{r['speed_over_whole']:.3f}x whole  {r['median_faults']:8.0f} faults",
                      flush=True)  # fmt: skip
    finally:
        engine.shutdown()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"pairs": args.pairs, "shapes": results}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
