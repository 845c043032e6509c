"""JSON Schema coverage on real-world schemas (JSONSchemaBench), per grammar backend.

A user sends real-world schemas; how many does each backend compile, how many
give a valid object, what does it refuse and why, and does a compiled schema ever let
an invalid object through (it must not).

For each backend, every sampled schema is compiled once through a fresh
``GrammarCompiler`` (timed: the compile time), then every schema that compiled is sent
once through one ``Engine`` (all at once, so continuous batching runs them together)
with a chat prompt asking for an object matching it (the schema's compact text, cut at
--max-schema-chars), seeded sampling at --temperature. Each output is checked with
``jsonschema`` (the schema's own draft, format checks on) and its token ids replayed
through a fresh matcher of the compiled grammar, timing ``fill_bitmask`` per token.
A backend name the engine does not know is skipped with a message.

Usage: .venv/bin/python benchmarks/bench_schema_coverage.py [--data PATH/TO/data]
           [--source jsonschemabench|maskbench] [--fetch]
           [--per-dataset 25] [--seed N] [--backends auto,llguidance,xgrammar] [--lenient]
           [--max-new-tokens 384] [--temperature 0.6] [--max-schema-chars 3000]
           [--json-max-string-length N] [--compile-only K]
           [--out benchmarks/results/schema_coverage.json]
PATH/TO/data is JSONSchemaBench's data/ folder (DATA/<Dataset>/*.json) or its
maskbench/data/ (MaskBench's schema set: DATA/<Dataset>---<name>.json); without --data,
--source's folder in a clone kept in the cache (~/.cache/radixlm/jsonschemabench, made
by --fetch: schema_coverage/dataset.py). The sample is drawn at run time: without
--seed a new seed each run, printed first (rerun it with --seed N), so no figure comes
from a sample chosen once and tuned to. Prints a table
per dataset and backend (see schema_coverage/summary.py), the refused keywords, the
outputs cut at the token limit by cause (an endless string or number, repeated items,
other: schema_coverage/cut_causes.py), every invalid output and crash, and writes the
results JSON. --json-max-string-length sets that option on every request, to measure
what it does to the endless strings. --compile-only K compiles the schemas of K samples
(no generation) and prints each one's refused share, the reasons over all of them and
every refused schema with its reason and JSON pointers.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

import radixlm
from radixlm.runtime.constrained import CompiledGrammar, GrammarCompiler
from radixlm.runtime.errors import GrammarError, InvalidSamplingParamsError
from radixlm.runtime.io.sampling_params import SamplingParams

os.environ.setdefault("HF_HUB_OFFLINE", "1")

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from schema_coverage.cut_causes import cut_cause_counts  # noqa: E402
from schema_coverage.dataset import (  # noqa: E402
    SOURCES,
    SchemaFile,
    data_folder,
    default_cache,
    is_maskbench,
    list_schema_files,
    sample_schemas,
    schema_prompt,
)
from schema_coverage.outcomes import (  # noqa: E402
    SchemaOutcome,
    classify_output,
    refusal_pointers,
    refused_names,
    unchecked_formats,
)
from schema_coverage.summary import (  # noqa: E402
    format_table,
    paper_comparison,
    refusal_counts,
    summarize,
)

ROOT = HERE.parent
RESULTS = ROOT / "benchmarks" / "results" / "schema_coverage.json"
MAX_TOTAL_TOKENS = 65536  # KV slots: room for ~40 prompts of 1.5k tokens decoding at once
# Every request arrives at once and a compile's timeout counts from its arrival: the
# default 10 s would time out a queue behind a slow compile, which is not coverage.
COMPILE_TIMEOUT_S = 600.0
KEPT_TEXT = ("invalid", "crash", "length")  # outcomes whose output text the JSON keeps


def chat(tokenizer, prompt: str) -> str:
    messages = [{"role": "user", "content": prompt}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def request_params(schema: dict, backend: str, args: argparse.Namespace) -> dict[str, Any]:
    params = {
        "json_schema": schema,
        "grammar_backend": backend,
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "seed": args.seed,
    }
    if args.json_max_string_length is not None:
        params["json_max_string_length"] = args.json_max_string_length
    return {**params, "json_schema_lenient": True} if args.lenient else params


def unavailable(compiler: GrammarCompiler, backend: str) -> str | None:
    """Why ``backend`` cannot run here (unknown to the engine, package missing), or None.
    Builds the backend, so its set-up is not part of the first schema's compile time."""
    try:
        params = {"json_schema": {"type": "object"}, "grammar_backend": backend}
        compiler.compile(SamplingParams.from_dict(params).grammar, backend)
    except InvalidSamplingParamsError as e:
        return str(e)
    except KeyError:
        return "GrammarCompiler has no such backend"
    return None


def compile_schema(
    compiler: GrammarCompiler, base: dict, params: dict
) -> tuple[CompiledGrammar, float] | SchemaOutcome:
    """The compiled grammar and its compile time, or the outcome of a failed compile."""
    try:
        spec = SamplingParams.from_dict(params).grammar
        start = time.perf_counter()
        compiled = compiler.compile(spec, params["grammar_backend"])
        return compiled, time.perf_counter() - start
    except GrammarError as e:
        names = refused_names(str(e))
        return SchemaOutcome(**base, status="refused", refused=names, message=str(e))
    except Exception as e:  # a bug somewhere: counted, never hidden
        return SchemaOutcome(**base, status="crash", message=f"compile: {e!r}")


def generate_all(engine, prompts: list[str], params: list[dict]) -> list[Any]:
    """Every request at once; each one's result dict or the exception it raised."""

    async def run() -> list[Any]:
        calls = [engine.async_generate(p, s) for p, s in zip(prompts, params)]
        return await asyncio.gather(*calls, return_exceptions=True)

    return asyncio.run(run())


def replay_mask_fill(
    compiled: CompiledGrammar, output_ids: list[int], width: int
) -> tuple[tuple[float, ...], str]:
    """Each token's ``fill_bitmask`` time on a fresh matcher, and the first token the
    matcher refused ('' if none: the engine's matcher accepted them all)."""
    matcher = compiled.new_matcher()
    bitmask = torch.zeros(1, width, dtype=torch.int32)
    times = []
    for i, token in enumerate(output_ids):
        start = time.perf_counter()
        matcher.fill_bitmask(bitmask, 0)
        times.append(time.perf_counter() - start)
        if not matcher.accept_token(token):
            return tuple(times), f"token {token} at output position {i} refused on replay"
    return tuple(times), ""


def generated_outcome(
    base: dict, schema: dict, compiled: CompiledGrammar, compile_s: float, result: Any, width: int
) -> SchemaOutcome:
    """The outcome of a schema that compiled, from what the engine returned for it."""
    done = {**base, "compiled": True, "compile_s": compile_s}
    if isinstance(result, GrammarError):  # the engine's own compile refused it
        message = f"engine: {result}"
        return SchemaOutcome(**done, status="refused", refused=refused_names(message),
                             message=message)  # fmt: skip
    if isinstance(result, BaseException):
        return SchemaOutcome(**done, status="crash", message=f"generate: {result!r}")
    meta = result["meta_info"]
    try:
        status, message = classify_output(meta["finish_reason"], result["text"], schema)
    except Exception as e:  # the validator cannot use the schema (an unresolvable $ref, ...)
        status, message = "crash", f"validate: {e!r}"
    fills, replay_error = replay_mask_fill(compiled, result["output_ids"], width)
    return SchemaOutcome(
        **done,
        status=status,
        message=message,
        text=result["text"] if status in KEPT_TEXT else "",
        num_output_tokens=len(result["output_ids"]),
        mask_fill_s=fills,
        replay_error=replay_error,
        warnings=tuple(str(w) for w in meta.get("grammar_warnings") or ()),
    )


def run_backend(
    engine, backend: str, sample: list[SchemaFile], schemas: list[Any], args
) -> tuple[list[SchemaOutcome], dict[str, float]]:
    """Every schema through ``backend``: compile, generate together, check, replay."""
    compiler = GrammarCompiler(engine._rt.scheduler.vocab, engine.config.grammar)
    width = compiler.vocab.bitmask_width
    outcomes: list[SchemaOutcome | None] = [None] * len(sample)
    todo: list[tuple[int, dict, CompiledGrammar, float]] = []
    start = time.perf_counter()
    for i, (item, schema) in enumerate(zip(sample, schemas)):
        base = {"dataset": item.dataset, "name": item.name, "backend": backend}
        if isinstance(schema, Exception):
            outcomes[i] = SchemaOutcome(**base, status="crash", message=f"load: {schema!r}")
            continue
        params = request_params(schema, backend, args)
        compiled = compile_schema(compiler, base, params)
        if isinstance(compiled, SchemaOutcome):
            outcomes[i] = compiled
        else:
            todo.append((i, params, *compiled))
    compiled_at = time.perf_counter()
    prompts = [chat(engine.tokenizer, schema_prompt(schemas[i], args.max_schema_chars))
               for i, *_ in todo]  # fmt: skip
    results = generate_all(engine, prompts, [params for _, params, *_ in todo])
    generated_at = time.perf_counter()
    for (i, _, compiled, compile_s), result in zip(todo, results):
        base = {"dataset": sample[i].dataset, "name": sample[i].name, "backend": backend}
        outcomes[i] = generated_outcome(base, schemas[i], compiled, compile_s, result, width)
    walls = {
        "compile_s": compiled_at - start,
        "generate_s": generated_at - compiled_at,
        "check_and_replay_s": time.perf_counter() - generated_at,
    }
    return [o for o in outcomes if o is not None], walls


def load_schemas(data: Path, sample: list[SchemaFile]) -> list[Any]:
    """Each schema, or the exception loading it raised (counted as a crash)."""
    loaded: list[Any] = []
    for item in sample:
        try:
            loaded.append(item.load(data))
        except (OSError, ValueError) as e:
            loaded.append(e)
    return loaded


def check_lenient_known() -> None:
    try:
        SamplingParams.from_dict({"json_schema_lenient": True})
    except InvalidSamplingParamsError as e:
        raise SystemExit(f"--lenient: this engine cannot do it yet: {e}") from None


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data",
        default=None,
        help="JSONSchemaBench's data/ or maskbench/data/ folder (default: --source's "
        "folder in the benchmark's cache)",
    )
    parser.add_argument(
        "--source",
        choices=sorted(SOURCES),
        default="jsonschemabench",
        help="without --data: which schema set of the cached clone",
    )
    parser.add_argument(
        "--fetch", action="store_true", help="clone JSONSchemaBench into the cache if missing"
    )
    parser.add_argument("--per-dataset", type=int, default=25)
    parser.add_argument(
        "--seed", type=int, default=None, help="the sample's seed (default: a new one, printed)"
    )
    parser.add_argument("--backends", default="auto", help="comma-separated grammar backends")
    parser.add_argument("--lenient", action="store_true", help="json_schema_lenient=True")
    parser.add_argument("--max-new-tokens", type=int, default=384)
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--max-schema-chars", type=int, default=3000)
    parser.add_argument(
        "--json-max-string-length",
        type=int,
        default=None,
        help="json_max_string_length on each request (default: the engine's, off)",
    )
    parser.add_argument(
        "--compile-only",
        type=int,
        metavar="SEEDS",
        default=None,
        help="only compile the schemas of SEEDS samples (the first --seed, the rest drawn) "
        "and report each one's refused share and the reasons: no generation",
    )
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    try:
        cache = default_cache()
        data = Path(args.data) if args.data else data_folder(args.source, cache, args.fetch)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    args.data = str(data)
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(2**31)
    print(f"sample seed {args.seed} (rerun this sample with --seed {args.seed})", flush=True)
    return args


def compile_only(args: argparse.Namespace) -> None:
    """The refused share of ``args.compile_only`` samples, per backend and seed (each
    schema compiled alone, as ``run_backend`` does first), and the reasons over all."""
    data = Path(args.data)
    files, wrapped = list_schema_files(data), is_maskbench(data)
    draw = random.Random(args.seed)
    seeds = [args.seed] + [draw.randrange(2**31) for _ in range(args.compile_only - 1)]
    engine = radixlm.Engine(dtype="float32", max_total_tokens=4096)
    results: dict[str, Any] = {"command": " ".join(sys.argv), "seeds": seeds, "backends": {}}
    try:
        for backend in args.backends:
            compiler = GrammarCompiler(engine._rt.scheduler.vocab, engine.config.grammar)
            per_seed, reasons, outcomes, listed = [], Counter(), {}, {}
            for seed in seeds:
                sample = sample_schemas(files, args.per_dataset, seed, wrapped=wrapped)
                refused = 0
                for item, schema in zip(sample, load_schemas(data, sample)):
                    key = f"{item.dataset}/{item.name}"
                    if key not in outcomes:
                        base = {"dataset": item.dataset, "name": item.name, "backend": backend}
                        if isinstance(schema, Exception):
                            outcomes[key] = SchemaOutcome(
                                **base, status="crash", message=repr(schema)
                            )
                        else:
                            compiled = compile_schema(
                                compiler, base, request_params(schema, backend, args)
                            )
                            outcomes[key] = (
                                compiled if isinstance(compiled, SchemaOutcome) else None
                            )
                    outcome = outcomes[key]
                    if outcome is not None:
                        refused += 1
                        reasons[outcome.refused or (outcome.status,)] += 1
                        if key not in listed:
                            listed[key] = _refusal_json(outcome)
                per_seed.append({"seed": seed, "schemas": len(sample), "refused": refused})
                print(f"{backend} seed {seed}: {refused} of {len(sample)} refused "
                      f"({100 * refused / len(sample):.1f}%)", flush=True)  # fmt: skip
            total = sum(r["refused"] for r in per_seed)
            count = sum(r["schemas"] for r in per_seed)
            print(f"{backend}: {total} of {count} refused ({100 * total / count:.2f}%); reasons:")
            for names, n in reasons.most_common():
                print(f"  {n:4d}  {', '.join(names)}")
            for key, refusal in sorted(listed.items()):
                print(f"  refused {key}: {'+'.join(refusal['reasons'])} at "
                      f"{', '.join(refusal['pointers']) or '(no pointer)'}")  # fmt: skip
            results["backends"][backend] = {
                "per_seed": per_seed,
                "refused_share": total / count,
                "reasons": [[list(k), v] for k, v in reasons.most_common()],
                "refused": listed,
            }
    finally:
        engine.shutdown()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")


def _refusal_json(outcome: SchemaOutcome) -> dict[str, Any]:
    """A refused (or crashed) schema: its reasons, where in the schema, the message."""
    return {
        "reasons": list(outcome.refused or (outcome.status,)),
        "pointers": refusal_pointers(outcome.message),
        "message": outcome.message[:2000],
    }


def main() -> None:
    args = parse_args()
    if args.compile_only is not None:
        compile_only(args)
        return
    data = Path(args.data)
    sample = sample_schemas(
        list_schema_files(data), args.per_dataset, args.seed, wrapped=is_maskbench(data)
    )
    schemas = load_schemas(data, sample)
    if args.lenient:
        check_lenient_known()
    outcomes: list[SchemaOutcome] = []
    skipped: dict[str, str] = {}
    walls: dict[str, dict[str, float]] = {}
    engine = radixlm.Engine(
        dtype="float32",
        max_total_tokens=MAX_TOTAL_TOKENS,
        grammar_compile_timeout=COMPILE_TIMEOUT_S,
    )
    try:
        for backend in args.backends:
            why = unavailable(GrammarCompiler(engine._rt.scheduler.vocab, engine.config.grammar),
                              backend)  # fmt: skip
            if why is not None:
                print(f"skipping backend {backend!r}: {why}")
                skipped[backend] = why
                continue
            done, walls[backend] = run_backend(engine, backend, sample, schemas, args)
            outcomes += done
            print(f"{backend}: {len(done)} schemas; " +
                  ", ".join(f"{k} {v:.1f}" for k, v in walls[backend].items()))  # fmt: skip
    finally:
        engine.shutdown()
    results = collect(args, sample, schemas, outcomes, skipped, walls)
    report(results, outcomes)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")


def collect(args, sample, schemas, outcomes, skipped, walls) -> dict[str, Any]:
    rows = summarize(outcomes)
    checked = [s for s, item in zip(schemas, sample) if isinstance(s, dict)]
    return {
        "command": " ".join(sys.argv),
        "config": {k: v for k, v in vars(args).items()},
        "sample": [f"{s.dataset}/{s.name}" for s in sample],
        "skipped_backends": skipped,
        "wall_s": walls,
        "rows": [{**dataclasses.asdict(r), "valid_of_finished": r.valid_of_finished} for r in rows],
        "refused": {b: c.most_common() for b, c in refusal_counts(outcomes).items()},
        "cut_causes": {b: dict(c) for b, c in cut_cause_counts(outcomes).items()},
        "unchecked_formats": sorted(set().union(*map(unchecked_formats, checked))),
        "outcomes": [_outcome_json(o) for o in outcomes],
    }


def _outcome_json(o: SchemaOutcome) -> dict[str, Any]:
    out = dataclasses.asdict(o)
    fills = out.pop("mask_fill_s")
    out["mask_fill_max_s"] = max(fills) if fills else None
    return out


def report(results: dict[str, Any], outcomes: list[SchemaOutcome]) -> None:
    rows = summarize(outcomes)
    print(format_table(rows))
    for backend in dict.fromkeys(o.backend for o in outcomes):
        print(paper_comparison(rows, backend))
    for backend, counts in results["refused"].items():
        top = ", ".join(f"{name} {n}" for name, n in counts[:12])
        print(f"{backend} refused, by keyword / format / reason: {top or 'none'}")
    for backend, causes in results["cut_causes"].items():
        print(f"{backend} cut at the token limit, by cause: " +
              ", ".join(f"{cause} {n}" for cause, n in causes.items()))  # fmt: skip
    for o in outcomes:  # every refusal: what it names, and where in the schema
        if o.status == "refused":
            where = ", ".join(refusal_pointers(o.message)) or "(no pointer)"
            print(f"  refused {o.backend} {o.dataset}/{o.name}: {'+'.join(o.refused)} at {where}")
    late = [o for o in outcomes if o.status == "refused" and o.compiled]
    if late:  # compiled alone, then refused by the engine's own compile (a timeout under load)
        print(f"compiled alone but refused by the engine ({len(late)}): " +
              ", ".join(f"{o.backend} {o.dataset}/{o.name} ({o.compile_s:.1f} s alone; "
                        f"{'+'.join(o.refused)})" for o in late))  # fmt: skip
    for o in outcomes:
        if o.status in ("invalid", "crash") or o.replay_error:
            print(f"{o.status.upper()} {o.backend} {o.dataset}/{o.name}: "
                  f"{o.message or o.replay_error}\n    output: {o.text[:400]!r}")  # fmt: skip
    warned = Counter(w for o in outcomes for w in o.warnings)
    if warned:
        print(f"lenient warnings ({sum(warned.values())}): {warned.most_common(8)}")
    if results["unchecked_formats"]:
        print(f"formats the validator could not check: {results['unchecked_formats']}")


if __name__ == "__main__":
    main()
