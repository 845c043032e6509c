"""Constrained decoding: jump-forward, mask overhead, mask fill and compile times, one run.

Workloads (issue: constrained decoding):
  (a) 32 requests for the 6-field ``api_user`` schema, greedy: jump-forward on vs off,
      wall time and forward passes.
  (b) the same 32 requests constrained (jump-forward off) vs unconstrained with the
      same number of output tokens each: time per decode step.
  (c) median time to fill the batch's grammar bitmask, per pass (from the engine).
  (d) compile time of every constraint in the test suite, per backend (median, max).
  (e) the same workload with ``outlines`` + transformers, when that library is
      installed in the venv given by --outlines-python (a separate venv: it pins its
      own outlines-core), as the peer baseline.
  agreement: greedy outputs with jump-forward equal those without it, over the test
      suite's constraints (the figure that decides the ``jump_forward`` default).

Usage: .venv/bin/python benchmarks/bench_constrained.py [--repeats 3]
           [--outlines-python /path/to/venv/bin/python]
Prints medians and ratios and writes benchmarks/results/constrained.json. Sides are
alternated run by run on one engine (float32, default model, radix cache flushed
before every timed run so no side reuses the other's KV).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the shared constraint suite lives with the tests

import radixlm  # noqa: E402
from radixlm.runtime.config import GrammarConfig  # noqa: E402
from radixlm.runtime.constrained import GrammarCompiler  # noqa: E402
from radixlm.runtime.errors import GrammarError  # noqa: E402
from radixlm.runtime.io.sampling_params import SamplingParams  # noqa: E402
from radixlm.runtime.model_store import pull_default_model  # noqa: E402
from tests.runtime.constrained.cases import CASES, find_case  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "constrained.json"
NUM_REQUESTS = 32
MAX_NEW_TOKENS = 160
OUTLINES_SIDE = Path(__file__).with_name("outlines_side.py")


def chat(tokenizer, prompt: str) -> str:
    messages = [{"role": "user", "content": prompt}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def json_prompts(tokenizer) -> list[str]:
    """32 different requests for the same schema (so outputs differ, as in service)."""
    names = ["Ada", "Bo", "Chen", "Dana", "Eli", "Fay", "Gus", "Hana"]
    cities = ["Paris", "Lagos", "Osaka", "Lima"]
    return [
        chat(
            tokenizer,
            f"Give me the details of a fictional user named {names[i % 8]} who lives in "
            f"{cities[i // 8]} as JSON.",
        )
        for i in range(NUM_REQUESTS)
    ]


def timed_run(engine, prompts, params) -> dict:
    engine.flush_cache()
    before = engine.get_stats()
    start = time.perf_counter()
    outs = engine.generate(prompts, params)
    wall = time.perf_counter() - start
    after = engine.get_stats()
    return {
        "wall_s": wall,
        "passes": after.num_steps - before.num_steps,
        "output_tokens": sum(len(o["output_ids"]) for o in outs),
        "jumped_tokens": after.num_jump_forward_tokens - before.num_jump_forward_tokens,
        "mask_fill_median_s": after.mask_fill_median_s,
        "outs": outs,
    }


def bench_jump_and_overhead(engine, repeats: int) -> dict:
    case = find_case("api_user")
    prompts = json_prompts(engine.tokenizer)
    greedy = {**case.params(), "temperature": 0, "max_new_tokens": MAX_NEW_TOKENS}
    sides = {
        "jump_on": [{**greedy, "jump_forward": True}] * NUM_REQUESTS,
        "jump_off": [{**greedy, "jump_forward": False}] * NUM_REQUESTS,
    }
    timed_run(engine, prompts[:4], sides["jump_on"][:4])  # warm-up: compile, allocator
    runs: dict[str, list[dict]] = {name: [] for name in [*sides, "unconstrained"]}
    for _ in range(repeats):
        for name, params in sides.items():
            runs[name].append(timed_run(engine, prompts, params))
            for out in runs[name][-1]["outs"]:
                case.check(out["text"])
        # unconstrained, the same number of output tokens per request as jump_off gave
        lengths = [len(o["output_ids"]) for o in runs["jump_off"][-1]["outs"]]
        plain = [{"temperature": 0, "max_new_tokens": n, "ignore_eos": True} for n in lengths]
        runs["unconstrained"].append(timed_run(engine, prompts, plain))
    return _summarise(runs)


def _summarise(runs: dict[str, list[dict]]) -> dict:
    med = {
        name: {
            key: statistics.median(r[key] for r in rs)
            for key in ("wall_s", "passes", "output_tokens", "jumped_tokens")
        }
        for name, rs in runs.items()
    }
    step = {name: med[name]["wall_s"] / med[name]["passes"] for name in med}
    fills = [r["mask_fill_median_s"] for r in runs["jump_off"] if r["mask_fill_median_s"]]
    return {
        "medians": med,
        "jump_wall_ratio": med["jump_off"]["wall_s"] / med["jump_on"]["wall_s"],
        "jump_passes_ratio": med["jump_off"]["passes"] / med["jump_on"]["passes"],
        "step_s": step,
        "mask_overhead": step["jump_off"] / step["unconstrained"] - 1.0,
        "mask_fill_median_s": statistics.median(fills) if fills else None,
    }


def bench_agreement(engine) -> dict:
    """Greedy outputs with and without jump-forward over the whole constraint suite."""
    prompts = [chat(engine.tokenizer, c.prompt) for c in CASES]
    texts = {}
    for jump in (True, False):
        params = [
            {**c.params(), "temperature": 0, "max_new_tokens": 200, "jump_forward": jump}
            for c in CASES
        ]
        texts[jump] = [o["text"] for o in engine.generate(prompts, params)]
    differ = [c.name for c, a, b in zip(CASES, texts[True], texts[False]) if a != b]
    return {
        "cases": len(CASES),
        "agree": len(CASES) - len(differ),
        "agreement": 1 - len(differ) / len(CASES),
        "differ": differ,
    }


def bench_compile(engine) -> dict:
    """Compile time of each suite constraint, per backend, uncached (a fresh compiler)."""
    rt = engine._rt
    vocab = rt.scheduler.vocab
    out = {}
    for backend in ("outlines", "xgrammar"):
        compiler = GrammarCompiler(vocab, GrammarConfig(grammar_compile_timeout=120))
        compiler.compile(SamplingParams(regex="warm").grammar, backend)  # builds the backend
        times, refused = [], []
        for case in CASES:
            spec = SamplingParams(**case.params()).grammar
            start = time.perf_counter()
            try:
                compiler.compile(spec, backend)
                times.append(time.perf_counter() - start)
            except GrammarError:
                refused.append(case.name)
        out[backend] = {
            "compiled": len(times),
            "median_s": statistics.median(times),
            "max_s": max(times),
            "refused": refused,
        }
    return out


def bench_outlines(python: str, repeats: int) -> dict | None:
    """The peer baseline, in its own process and venv (see outlines_side.py)."""
    case = find_case("api_user")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(pull_default_model(progress=False)))
    job = {
        "model_dir": str(pull_default_model(progress=False)),
        "schema": case.spec,
        "prompts": json_prompts(tokenizer),
        "max_new_tokens": MAX_NEW_TOKENS,
        "repeats": repeats,
    }
    proc = subprocess.run(
        [python, str(OUTLINES_SIDE)], input=json.dumps(job), capture_output=True, text=True
    )
    if proc.returncode != 0:
        print(f"outlines baseline failed:\n{proc.stderr[-2000:]}")
        return None
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["valid"] = sum(_is_valid(case, text) for text in result.pop("texts"))
    return result


def _is_valid(case, text: str) -> bool:
    try:
        case.check(text)
        return True
    except AssertionError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--outlines-python", default=None)
    args = parser.parse_args()
    engine = radixlm.Engine(dtype="float32", max_total_tokens=32768)
    try:
        results = {
            "workload": bench_jump_and_overhead(engine, args.repeats),
            "agreement": bench_agreement(engine),
            "compile": bench_compile(engine),
        }
    finally:
        engine.shutdown()
    if args.outlines_python:
        results["outlines"] = bench_outlines(args.outlines_python, args.repeats)
    report(results)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")


def report(results: dict) -> None:
    w = results["workload"]
    med = w["medians"]
    print(f"(a) {NUM_REQUESTS} x api_user, greedy, medians of the timed runs")
    for name, m in med.items():
        print(
            f"    {name:14s} {m['wall_s']:7.2f} s  {m['passes']:5.0f} passes  "
            f"{m['output_tokens']:6.0f} tokens  ({m['jumped_tokens']:.0f} jumped)"
        )
    print(f"    jump-forward wall ratio {w['jump_wall_ratio']:.2f}x, passes ratio "
          f"{w['jump_passes_ratio']:.2f}x")  # fmt: skip
    constrained, plain = w["step_s"]["jump_off"] * 1e3, w["step_s"]["unconstrained"] * 1e3
    overhead = w["mask_overhead"] * 100
    print(f"(b) per step: constrained {constrained:.1f} ms vs unconstrained {plain:.1f} ms: "
          f"overhead {overhead:+.1f}%")  # fmt: skip
    if w["mask_fill_median_s"] is not None:
        print(f"(c) mask fill per pass ({NUM_REQUESTS} rows): median "
              f"{w['mask_fill_median_s'] * 1e6:.0f} us")  # fmt: skip
    for backend, c in results["compile"].items():
        print(f"(d) compile {backend}: {c['compiled']} constraints, median "
              f"{c['median_s'] * 1e3:.1f} ms, max {c['max_s'] * 1e3:.1f} ms; refused "
              f"{len(c['refused'])}")  # fmt: skip
    a = results["agreement"]
    print(f"agreement: jump-forward on/off greedy outputs equal in {a['agree']}/{a['cases']} "
          f"cases ({a['agreement'] * 100:.1f}%); differ: {a['differ']}")  # fmt: skip
    o = results.get("outlines")
    if o:
        ours = med["jump_on"]["wall_s"]
        print(f"(e) outlines + transformers: {o['wall_s']:.2f} s (compile {o['compile_s']:.2f} s, "
              f"{o['valid']}/{NUM_REQUESTS} valid) vs radixlm {ours:.2f} s: "
              f"radixlm {o['wall_s'] / ours:.2f}x faster")  # fmt: skip


if __name__ == "__main__":
    main()
