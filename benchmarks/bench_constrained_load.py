"""Constrained decoding under load: a batch of 32 or 64 requests, each with its own JSON
schema, against the same batch unconstrained, per grammar backend.

Each request asks for a JSON object described by a schema of its own (3-6 fields drawn
from strings with a length bound, bounded integers, numbers, booleans, enums and short
string arrays, the field names suffixed with the request's number, so no two schemas
compile to the same grammar). The constrained side runs them greedy; the unconstrained
side runs the same prompts with each request's output length fixed to what its
constrained run gave (``ignore_eos``), so both sides compute the same tokens and the
difference is what constraining costs. The constrained side runs twice, on two engines:
with each pass's grammar masks filled beside the model pass (``overlap_grammar_masks``,
the default) and before it. Sides alternate repeat by repeat; the radix cache is flushed
before every timed run; schemas are compiled (and cached) by a warm-up run first, so
compile time is reported separately, not mixed into the decode figures. Every
constrained output is validated with ``jsonschema``.

Figures: output tokens per second of each side and their ratio (the target: constrained
>= 0.9x unconstrained at batch 32 and 64); the engine's mask time per token (a pass's
mask fill divided by its constrained rows) P50 and P99; compile time P50/P99 of the
batch's schemas.

Usage: .venv/bin/python benchmarks/bench_constrained_load.py [--batches 32 64]
           [--backends xgrammar llguidance] [--repeats 3] [--max-new-tokens 96]
Prints the table and writes benchmarks/results/constrained_load.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import jsonschema

import radixlm
from radixlm.runtime.config import GrammarConfig
from radixlm.runtime.constrained import GrammarCompiler
from radixlm.runtime.io.sampling_params import SamplingParams

RESULTS = Path(__file__).parent / "results" / "constrained_load.json"
NAMES = ("id", "name", "city", "email", "score", "active", "tags", "level", "price", "owner")
SUBJECTS = ("customer", "product", "city", "book", "planet", "recipe", "car", "song")


def field_schema(kind: int, i: int) -> dict:
    """One of six field kinds (request ``i`` varies the bounds)."""
    return [
        {"type": "string", "maxLength": 12 + i % 16},
        {"type": "integer", "minimum": 0, "maximum": 100 + 10 * i},
        {"type": "number"},
        {"type": "boolean"},
        {"enum": [f"a{i}", f"b{i}", "other"]},
        {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3},
    ][kind]


def schema_for(i: int) -> dict:
    """Request i's schema: 3-6 fields, names and kinds rotated by i, all required."""
    count = 3 + i % 4
    names = [f"{NAMES[(i + j) % len(NAMES)]}_{i}" for j in range(count)]
    props = {name: field_schema((i * 7 + j) % 6, i) for j, name in enumerate(names)}
    return {
        "type": "object",
        "properties": props,
        "required": names,
        "additionalProperties": False,
    }


def prompts_and_schemas(tokenizer, batch: int) -> tuple[list[str], list[dict]]:
    schemas = [schema_for(i) for i in range(batch)]
    prompts = []
    for i, schema in enumerate(schemas):
        fields = ", ".join(schema["properties"])
        message = f"Describe a {SUBJECTS[i % len(SUBJECTS)]} as JSON with the fields {fields}."
        prompts.append(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": message}], tokenize=False, add_generation_prompt=True
            )
        )
    return prompts, schemas


def timed(engine, prompts: list[str], params: list[dict]) -> tuple[float, list[dict], int]:
    """(wall seconds, outputs, passes) of one run from a flushed cache."""
    engine.flush_cache()
    before = engine.get_stats().num_steps
    start = time.perf_counter()
    outs = engine.generate(prompts, params)
    return time.perf_counter() - start, outs, engine.get_stats().num_steps - before


def mask_per_token(engine, since: int) -> list[float]:
    """Seconds per constrained row of each pass's mask fill since ``since`` passes."""
    stats = engine._rt.scheduler.stats  # the per-pass record (get_stats has the median)
    fills = list(stats.mask_fill_seconds)[since:]
    rows = list(stats.mask_fill_rows)[since:]
    return [f / r for f, r in zip(fills, rows, strict=True) if r]


def compile_seconds(engine, backend: str, schemas: list[dict]) -> list[float]:
    """Each schema's compile, uncached (a compiler of its own, in this process), sorted."""
    compiler = GrammarCompiler(engine._rt.scheduler.vocab, GrammarConfig())
    compiler.compile(SamplingParams(json_schema='{"type": "integer"}').grammar, backend)
    times = []
    for schema in schemas:
        start = time.perf_counter()
        compiler.compile(SamplingParams(json_schema=json.dumps(schema)).grammar, backend)
        times.append(time.perf_counter() - start)
    return sorted(times)


def run_backend(backend: str, batch: int, repeats: int, max_new: int) -> dict:
    engines = {
        overlap: radixlm.Engine(
            grammar_backend=backend, max_total_tokens=65536, overlap_grammar_masks=overlap
        )
        for overlap in (True, False)
    }
    try:
        engine = engines[True]
        prompts, schemas = prompts_and_schemas(engine.tokenizer, batch)
        constrained = [
            {"temperature": 0, "max_new_tokens": max_new, "json_schema": json.dumps(s)}
            for s in schemas
        ]
        start = time.perf_counter()
        for e in engines.values():
            timed(e, prompts, constrained)  # warm-up: every schema compiled and cached
        warm_s = time.perf_counter() - start
        compile_s = compile_seconds(engine, backend, schemas)
        stats = engine._rt.scheduler.stats
        runs: dict[str, list[float]] = {"overlapped": [], "serial": [], "unconstrained": []}
        per_token: list[float] = []
        tokens = 0
        for _ in range(repeats):
            mark = len(stats.mask_fill_seconds)
            for side, e in (("overlapped", engines[True]), ("serial", engines[False])):
                wall, outs, _ = timed(e, prompts, constrained)
                check(outs, schemas)
                runs[side].append(sum(len(o["output_ids"]) for o in outs) / wall)
            per_token += mask_per_token(engine, mark)
            lengths = [len(o["output_ids"]) for o in outs]
            tokens = sum(lengths)
            plain = [{"temperature": 0, "max_new_tokens": n, "ignore_eos": True} for n in lengths]
            wall, outs, _ = timed(engine, prompts, plain)
            runs["unconstrained"].append(sum(len(o["output_ids"]) for o in outs) / wall)
    finally:
        for e in engines.values():
            e.shutdown()
    per_token.sort()
    med = {side: statistics.median(v) for side, v in runs.items()}
    return {
        "backend": backend,
        "batch": batch,
        "output_tokens": tokens,
        "tok_s": med,
        "ratio": med["overlapped"] / med["unconstrained"],
        "ratio_serial": med["serial"] / med["unconstrained"],
        "mask_per_token_us": {
            "p50": 1e6 * _quantile(per_token, 0.5),
            "p99": 1e6 * _quantile(per_token, 0.99),
        },
        "compile_ms": {
            "p50": 1e3 * _quantile(compile_s, 0.5),
            "p99": 1e3 * _quantile(compile_s, 0.99),
        },
        "warm_up_s": warm_s,
    }


def check(outs: list[dict], schemas: list[dict]) -> None:
    """Every output that ended by itself is valid JSON of its schema."""
    for out, schema in zip(outs, schemas, strict=True):
        if out["meta_info"]["finish_reason"]["type"] == "stop":
            jsonschema.validate(json.loads(out["text"]), schema)


def _quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--backends", nargs="+", default=["xgrammar", "llguidance"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    args = parser.parse_args()
    results = [
        run_backend(backend, batch, args.repeats, args.max_new_tokens)
        for backend in args.backends
        for batch in args.batches
    ]
    print("backend     batch  tok/s: overlapped / serial / unconstrained   ratio (serial)  "
          "mask/token p50/p99 us  compile p50/p99 ms")  # fmt: skip
    for r in results:
        tok = r["tok_s"]
        print(
            f"{r['backend']:11s} {r['batch']:5d}  {tok['overlapped']:10.1f} / {tok['serial']:6.1f}"
            f" / {tok['unconstrained']:13.1f}   {r['ratio']:5.2f} ({r['ratio_serial']:.2f})  "
            f"{r['mask_per_token_us']['p50']:9.1f} / {r['mask_per_token_us']['p99']:<9.1f}  "
            f"{r['compile_ms']['p50']:7.1f} / {r['compile_ms']['p99']:.1f}"
        )
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
