"""Grammar mask fill against the fill threads: the time to fill one
pass's bitmask for 64 constrained rows, on 1, 2 and 4 ``MaskWorker`` threads, per
grammar backend.

Each row has a JSON schema of its own (``bench_constrained_load.schema_for``: 3-6
fields of strings, bounded integers, numbers, booleans, enums and string arrays) over
the default model's tokenizer, and its matcher walks a valid compact output of that
schema one token per step, as in decoding; the rows start staggered through their
outputs (row i at i / 64 of its tokens: inside a string, after a key, in a number ...),
and a row at its end is replaced by a fresh request with the same schema, so every step
fills a mix of mid-output states, most of them new to their matcher. A step is what the
engine does each pass: the worker starts the fill and the caller waits for it
(``MaskWorker.start`` then ``wait``); the token advance between steps is not timed.
Each thread count walks the same steps from fresh matchers (after one untimed walk that
warms the compiled grammars' caches); counts alternate repeat by repeat; every step's
bitmask is checked equal to the loop thread's fill of the same matchers.

Figures: the median milliseconds per step of each thread count, the fill in the loop
thread (``overlap_grammar_masks`` off: no hand-off) beside them, and each count's
speedup against 1 thread; and the cores other processes kept busy meanwhile (a pool
can only be faster on cores nobody else holds: on a shared machine, read the speedups
beside that column).

Usage: .venv/bin/python benchmarks/bench_mask_fill.py [--rows 64] [--threads 1 2 4]
           [--backends llguidance xgrammar] [--steps 40] [--repeats 5]
Prints the table and writes benchmarks/results/mask_fill.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from radixlm.runtime.config import GrammarConfig
from radixlm.runtime.constrained import CompiledGrammar, GrammarCompiler, TokenVocabulary
from radixlm.runtime.io.sampling_params import SamplingParams
from radixlm.runtime.model_store import default_model_dir
from radixlm.runtime.scheduling.mask_worker import MaskWorker
from radixlm.runtime.scheduling.stats import SchedulerStats

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_constrained_load import schema_for  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "mask_fill.json"
BACKENDS = ("llguidance", "xgrammar")


def instance_for(schema: dict, i: int) -> dict:
    """A valid value of ``schema_for(i)`` (every field filled)."""
    values = []
    for name, field in schema["properties"].items():
        if "enum" in field:
            values.append((name, field["enum"][1]))
        elif field["type"] == "string":
            values.append((name, f"Ann Lee of {i} Main St"[: field["maxLength"]]))
        elif field["type"] == "integer":
            values.append((name, (37 * i) % field["maximum"]))
        elif field["type"] == "number":
            values.append((name, 3.25 + i))
        elif field["type"] == "boolean":
            values.append((name, i % 2 == 0))
        else:
            values.append((name, ["red", "sky blue"][: 1 + i % 2]))
    return dict(values)


class Row:
    """One constrained request of the batch: a matcher walking a valid output of its
    schema, one token per step; at the end a new request with the same schema takes
    its place (continuous batching), so the batch holds a steady mix of states."""

    def __init__(self, compiled: CompiledGrammar, tokens: list[int], position: int) -> None:
        self._compiled, self._tokens = compiled, tokens
        self.grammar = compiled.new_matcher()  # the one field MaskWorker reads
        self._position = 0
        for _ in range(position):
            self.advance()

    def advance(self) -> None:
        if self._position == len(self._tokens):  # its mask was the last (EOS only)
            self.grammar, self._position = self._compiled.new_matcher(), 0
            return
        token = self._tokens[self._position]
        assert self.grammar.accept_token(token), (self._compiled.backend, token)
        self._position += 1


def compile_rows(
    compiler: GrammarCompiler, tokenizer, backend: str, num_rows: int
) -> list[tuple[CompiledGrammar, list[int]]]:
    """Row i's compiled schema and the tokens of a valid compact output of it."""
    rows = []
    for i in range(num_rows):
        schema = schema_for(i)
        spec = SamplingParams(json_schema=json.dumps(schema)).grammar
        text = json.dumps(instance_for(schema, i), separators=(",", ":"))
        rows.append(
            (compiler.compile(spec, backend), tokenizer.encode(text, add_special_tokens=False))
        )
    return rows


def step_seconds(
    worker: MaskWorker, vocab: TokenVocabulary, compiled: list, steps: int
) -> list[float]:
    """Each step's fill, from ``start`` to the end of its wait, over fresh matchers that
    start staggered through their outputs (row i at i / rows of its tokens); each step's
    mask is checked equal to the loop thread's fill of the same matchers."""
    rows = [Row(c, t, i * (len(t) + 1) // len(compiled)) for i, (c, t) in enumerate(compiled)]
    check = MaskWorker(vocab, SchedulerStats(), overlap=False)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        mask = worker.start(rows)  # type: ignore[arg-type]
        assert mask is not None
        if mask.wait is not None:
            mask.wait()
        times.append(time.perf_counter() - start)
        assert torch.equal(mask.bitmask, check.start(rows).bitmask)  # type: ignore[arg-type, union-attr]
        for row in rows:
            row.advance()
    return times


def run_backend(backend: str, vocab: TokenVocabulary, tokenizer, args: argparse.Namespace) -> dict:
    compiler = GrammarCompiler(vocab, GrammarConfig())
    try:
        compiled = compile_rows(compiler, tokenizer, backend, args.rows)
    finally:
        compiler.close()
    sides = {"loop": MaskWorker(vocab, SchedulerStats(), overlap=False)} | {
        n: MaskWorker(vocab, SchedulerStats(), overlap=True, num_threads=n) for n in args.threads
    }
    times: dict = {side: [] for side in sides}
    others = OtherLoad()
    try:
        # untimed: a state's first visit fills caches its grammar's later matchers share
        step_seconds(sides["loop"], vocab, compiled, args.steps)
        for _ in range(args.repeats):  # sides alternate repeat by repeat
            for side, worker in sides.items():
                times[side] += step_seconds(worker, vocab, compiled, args.steps)
    finally:
        for worker in sides.values():
            worker.close()
    other_cores = others.cores()
    median_ms = {str(side): 1e3 * statistics.median(t) for side, t in times.items()}
    one = median_ms[str(args.threads[0])]
    return {
        "backend": backend,
        "rows": args.rows,
        "median_ms": median_ms,
        "speedup": {str(n): one / median_ms[str(n)] for n in args.threads},
        "us_per_row_loop": 1e3 * median_ms["loop"] / args.rows,
        "other_cores": other_cores,
    }


class OtherLoad:
    """The cores other processes kept busy since it was made (this machine's busy time
    from /proc/stat less this process's CPU time): a pool can only be faster on cores
    nobody else holds. None off Linux."""

    def __init__(self) -> None:
        self._start = (_busy_seconds(), time.process_time(), time.perf_counter())

    def cores(self) -> float | None:
        busy, ours, wall = self._start
        now = _busy_seconds()
        if now is None or busy is None:
            return None
        return (now - busy - (time.process_time() - ours)) / (time.perf_counter() - wall)


def _busy_seconds() -> float | None:
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:9]]
    except OSError:
        return None
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields) - idle) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4])
    installed = [b for b in BACKENDS if importlib.util.find_spec(b) is not None]
    parser.add_argument("--backends", nargs="+", default=installed)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    # The benchmark's own torch work (the equality checks) on this thread alone: an
    # OpenMP team spins on its cores for a while after each parallel op, and beside it
    # a pool of 2 fills no faster than 1 thread (benchmarks/README.md, "Constrained
    # decoding").
    torch.set_num_threads(1)
    model_dir = default_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    eos = frozenset({tokenizer.eos_token_id})
    vocab = TokenVocabulary.from_tokenizer(tokenizer, len(tokenizer), eos)
    results = [run_backend(backend, vocab, tokenizer, args) for backend in args.backends]
    header = "".join(f"{f'{n} thr ms':>10}" for n in args.threads)
    speedups = "".join(f"{f'x{n}':>7}" for n in args.threads)
    print(f"backend       rows  loop ms{header}{speedups}  us/row (loop)  other load")
    for r in results:
        ms = "".join(f"{r['median_ms'][str(n)]:>10.2f}" for n in args.threads)
        up = "".join(f"{r['speedup'][str(n)]:>7.2f}" for n in args.threads)
        loop_ms = r["median_ms"]["loop"]
        load = "?" if r["other_cores"] is None else f"{r['other_cores']:.2f} cores"
        print(
            f"{r['backend']:<12}{r['rows']:>6}{loop_ms:>8.2f}{ms}{up}"
            f"{r['us_per_row_loop']:>14.1f}  {load}"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"results": results, "torch_threads": torch.get_num_threads()}))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
