"""A burst of new JSON schemas while the engine decodes: how long each one's compile
takes from its arrival, with the engine idle and with it busy.

A service gets a schema per caller; a burst of new ones (a deploy, a new tenant, the
schema-coverage benchmark's 250 at once) must not wait on the model's steps. One
engine (the default model), two sides in one run, alternating repeat by repeat:

  idle   --schemas distinct small schemas (an object of 3-5 typed fields, the names
         suffixed so no two compile to the same grammar) handed to the engine's own
         compiler at once, nothing else running
  busy   the same count of new schemas while --background unconstrained requests
         decode (ignore_eos; aborted once the burst compiled)

Each compile is timed from its arrival to its result (what a request waits before it
can be scheduled). Printed: the median and P99 of those waits and the time until the
whole burst compiled, per side, and busy / idle. The compile's own CPU time is the same
on both sides; the busy side adds only the share of the 2 cores the model takes, so the
ratio should stay near what that share costs (not a multiple of the model's step time).

Usage: .venv/bin/python benchmarks/bench_compile_burst.py [--schemas 60]
           [--background 16] [--repeats 3] [--out benchmarks/results/compile_burst.json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import threading
import time
import uuid
from pathlib import Path

import radixlm
from radixlm.runtime.constrained import GrammarSpec
from radixlm.runtime.io.messages import GenerateRequest
from radixlm.runtime.io.sampling_params import SamplingParams

RESULTS = Path(__file__).parent / "results" / "compile_burst.json"
_FIELDS = (
    {"type": "integer", "minimum": 0, "maximum": 999},
    {"type": "string", "maxLength": 24},
    {"type": "boolean"},
    {"type": "number"},
    {"enum": ["red", "green", "blue"]},
    {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 4},
)


def schemas(count: int, rng: random.Random) -> list[GrammarSpec]:
    """``count`` small object schemas no compile has seen (a fresh suffix per call)."""
    tag = uuid.uuid4().hex[:6]
    specs = []
    for i in range(count):
        fields = rng.sample(_FIELDS, rng.randint(3, 5))
        props = {f"f{j}_{tag}_{i}": field for j, field in enumerate(fields)}
        schema = {"type": "object", "properties": props, "required": list(props)}
        specs.append(GrammarSpec("json_schema", json.dumps(schema)))
    return specs


def burst(engine: radixlm.Engine, specs: list[GrammarSpec]) -> tuple[list[float], float]:
    """Hands every spec to the engine's compiler at once; each compile's wait from its
    arrival, and the time until the last one finished."""
    grammars = engine._rt.request_builder.grammars
    lock = threading.Lock()
    all_done = threading.Event()
    waits: list[float] = []

    def on_done(arrived: float):
        def record(_future) -> None:
            with lock:
                waits.append(time.monotonic() - arrived)
                if len(waits) == len(specs):
                    all_done.set()

        return record

    start = time.monotonic()
    for spec in specs:
        pending = grammars.start(spec, "auto")
        pending.future.add_done_callback(on_done(time.monotonic()))
    if not all_done.wait(timeout=900):
        raise SystemExit(f"the burst did not compile in 900 s ({len(waits)} of {len(specs)})")
    return waits, time.monotonic() - start


def busy_burst(engine, specs, background: int) -> tuple[list[float], float]:
    """The burst while ``background`` long unconstrained requests decode (aborted once
    the burst compiled)."""
    params = SamplingParams(max_new_tokens=4096, ignore_eos=True, temperature=0)
    requests = [
        GenerateRequest(f"Story {i}: once upon a time,", sampling_params=params, stream=True)
        for i in range(background)
    ]
    stop = threading.Event()

    def decode() -> None:
        chunks = engine.stream_requests(requests)
        try:
            for _ in chunks:
                if stop.is_set():
                    break
        finally:
            chunks.close()  # aborts the requests still running

    thread = threading.Thread(target=decode)
    thread.start()
    try:
        deadline = time.monotonic() + 120
        while engine.get_stats().num_running < background:  # all of them decoding
            if time.monotonic() > deadline:
                raise SystemExit("the background requests did not start in 120 s")
            time.sleep(0.05)
        return burst(engine, specs)
    finally:
        stop.set()
        thread.join()


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schemas", type=int, default=60)
    parser.add_argument("--background", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    rng = random.Random(args.seed)
    engine = radixlm.Engine(dtype="float32")
    sides: dict[str, dict[str, list[float]]] = {
        side: {"wait_p50": [], "wait_p99": [], "burst": []} for side in ("idle", "busy")
    }
    try:
        burst(engine, schemas(4, rng))  # the compile workers are up before any timing
        for repeat in range(args.repeats):
            for side in ("idle", "busy"):
                specs = schemas(args.schemas, rng)
                if side == "idle":
                    waits, total = burst(engine, specs)
                else:
                    waits, total = busy_burst(engine, specs, args.background)
                row = sides[side]
                row["wait_p50"].append(statistics.median(waits))
                row["wait_p99"].append(p99(waits))
                row["burst"].append(total)
                print(f"repeat {repeat} {side:4s}: wait P50 {row['wait_p50'][-1]:.2f} s, "
                      f"P99 {row['wait_p99'][-1]:.2f} s, burst {total:.2f} s")  # fmt: skip
    finally:
        engine.shutdown()
    medians = {s: {k: statistics.median(v) for k, v in row.items()} for s, row in sides.items()}
    print(f"\n{args.schemas} new schemas at once; busy: {args.background} requests decoding")
    print(f"{'side':6s} {'wait P50 s':>10s} {'wait P99 s':>10s} {'burst s':>8s}")
    for side, m in medians.items():
        print(f"{side:6s} {m['wait_p50']:10.2f} {m['wait_p99']:10.2f} {m['burst']:8.2f}")
    ratio = {k: medians["busy"][k] / medians["idle"][k] for k in medians["idle"]}
    print("busy/idle " + ", ".join(f"{k} {v:.2f}x" for k, v in ratio.items()))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"args": vars(args), "repeats": sides, "medians": medians, "busy_over_idle": ratio}
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
