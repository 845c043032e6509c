"""The first prompt passes after an Engine starts, with its grammar workers starting
beside them: the measurement behind ``compile_worker._STARTING_NICENESS``.

An Engine starts the fast lane's compile worker with it (``CompileWorkers.warm``), and
the worker's start (torch and three grammar backends imported, the vocabulary read) is
seconds of CPU. A script takes requests at once; on a 2-core machine the worker took a
core from the engine's two OpenMP threads. Sides, each an Engine in a process of its
own, the default model, 30 prompts of 150 random tokens one after the other
(max_new_tokens 1), each prompt's wall time:

  niced      this tree: the worker starts ``_STARTING_NICENESS`` nicer than the engine
  not niced  the same with ``_STARTING_NICENESS = 0`` (as before)
  no worker  ``CompileWorkers.warm`` does nothing: no worker starts

Usage: .venv/bin/python benchmarks/bench_start_passes.py [--prompts 30] [--rounds 2]
Prints each side's medians over the first 10 prompts and over the last 10.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time

SIDES = ("niced", "not niced", "no worker")


def side(name: str, prompts: int) -> None:
    """One side's prompt times, as a JSON list on the last line."""
    import radixlm
    from radixlm.runtime.constrained import compile_worker

    if name == "not niced":
        compile_worker._STARTING_NICENESS = 0
    elif name == "no worker":
        compile_worker.CompileWorkers.warm = lambda self: None
    engine = radixlm.Engine(dtype="bfloat16")
    rng = random.Random(0)
    times = []
    for _ in range(prompts):
        prompt = [[rng.randrange(100, 30000) for _ in range(150)]]
        start = time.perf_counter()
        engine.generate(input_ids=prompt, sampling_params={"temperature": 0, "max_new_tokens": 1})
        times.append((time.perf_counter() - start) * 1e3)
    engine.shutdown()
    print(json.dumps(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        side(args.side, args.prompts)
        return
    runs: dict[str, list[list[float]]] = {name: [] for name in SIDES}
    for _ in range(args.rounds):  # sides in turns
        for name in SIDES:
            cmd = [sys.executable, __file__, "--side", name, "--prompts", str(args.prompts)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            runs[name].append(json.loads(out.strip().splitlines()[-1]))
    print(f"{'side':10} {'first 10 prompts, ms':>22} {'last 10, ms':>12}")
    for name, times in runs.items():
        first = statistics.median(t for run in times for t in run[:10])
        last = statistics.median(t for run in times for t in run[-10:])
        print(f"{name:10} {first:>22.1f} {last:>12.1f}")


if __name__ == "__main__":
    main()
