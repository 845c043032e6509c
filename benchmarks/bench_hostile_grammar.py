"""A hostile grammar costs its time limit and no more, in one run.

One engine serves a stream of short requests (a 16-token greedy answer each, one at a
time) in three phases, and the median latency of each phase is printed with its ratio
to the first:

  before   the engine alone
  during   while one client's constraint compiles and hits grammar_compile_timeout
           (default: a regex of 5,000 literal alternatives on the outlines backend,
           whose FSM construction takes minutes)
  after    once that client has its GrammarCompileTimeoutError

The compile runs in a worker process that is killed at the limit, so "after" should
read 1.0x: nothing keeps burning CPU beside the engine (a compile left running in a
thread would slow every later request for as long as it runs). The worker's process id
is checked gone.

Usage: .venv/bin/python benchmarks/bench_hostile_grammar.py [--timeout 10] [--shorts 8]
           [--out benchmarks/results/hostile_grammar.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import threading
import time
from pathlib import Path

from radixlm import Engine
from radixlm.runtime.errors import GrammarCompileTimeoutError
from radixlm.runtime.model_store import pull_default_model

RESULTS = Path(__file__).parent / "results" / "hostile_grammar.json"
PROMPTS = ["The capital of France", "Two plus two is", "Hello, my name", "Water boils at"]


def short_latency(engine: Engine, i: int) -> float:
    params = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}
    start = time.perf_counter()
    engine.generate(PROMPTS[i % len(PROMPTS)] + f" ({i})", params)
    return time.perf_counter() - start


def hostile_choices(n: int) -> list[str]:
    r = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    return ["".join(r.choice(letters) for _ in range(12)) for _ in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout", type=float, default=10.0, help="grammar_compile_timeout")
    parser.add_argument("--shorts", type=int, default=8, help="short requests per phase")
    parser.add_argument("--choices", type=int, default=5000)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    engine = Engine(
        model_path=str(pull_default_model()), dtype="float32", grammar_compile_timeout=args.timeout
    )
    grammars = engine._rt.request_builder.grammars
    engine.generate("warm up", {"max_new_tokens": 4, "regex": "[a-z]+"})  # a worker is up
    before = [short_latency(engine, i) for i in range(args.shorts)]
    workers_before = grammars.workers.pids()

    outcome: dict = {}

    def hostile() -> None:
        start = time.perf_counter()
        params = {"choices": hostile_choices(args.choices), "grammar_backend": "outlines"}
        try:
            engine.generate("Pick one.", params)
            outcome["error"] = None
        except GrammarCompileTimeoutError as e:
            outcome["error"] = str(e)
        outcome["seconds"] = time.perf_counter() - start

    thread = threading.Thread(target=hostile)
    thread.start()
    time.sleep(0.2)
    during = []
    while thread.is_alive():
        during.append(short_latency(engine, len(during)))
    thread.join()
    after = [short_latency(engine, i) for i in range(args.shorts)]
    gone = [pid for pid in workers_before if not os.path.exists(f"/proc/{pid}")]
    engine.shutdown()

    phases = {"before": before, "during": during, "after": after}
    medians = {name: statistics.median(values) for name, values in phases.items()}
    print(f"hostile constraint: {args.choices} choices on outlines, limit {args.timeout:g} s")
    print(f"  refused after {outcome['seconds']:.2f} s: {outcome['error']}")
    print(f"  workers before it {workers_before}, killed since: {gone}")
    for name, values in phases.items():
        ratio = medians[name] / medians["before"]
        print(f"  {name:7s} {len(values):3d} short requests, median {medians[name]:.3f} s "
              f"({ratio:.2f}x before)")  # fmt: skip
    report = {
        "timeout_s": args.timeout,
        "choices": args.choices,
        "refused_after_s": outcome["seconds"],
        "error": outcome["error"],
        "killed_workers": gone,
        "latency_s": phases,
        "median_s": medians,
        "after_over_before": medians["after"] / medians["before"],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
