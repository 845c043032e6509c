"""The program DSL (``import radixlm as sgl``) on the in-process runtime, one command.

Workloads, each a pair of sides measured in the same run:
  few_shot_select  a 5-shot multiple-choice prompt (a constant prefix of 5 worked
                   examples) and 64 questions, each a program ending in a 4-choice
                   ``select``, through ``run_batch``: programs/s with the radix cache
                   vs ``disable_radix_cache=True``. Target >= 3x.
  branching        32 programs through ``run_batch``, each on a shared guide text:
                   ``fork(3)``, an 8-token gen per branch, ``join``, then ``fork(3)``
                   and an 8-token gen again, ``join``: programs/s, radix cache vs
                   none. Target >= 3x.
  dsl_overhead     64 programs ``prompt -> gen a (16 tokens) -> text -> gen b (16)``
                   through ``run_batch`` vs the same requests made directly: one
                   batched ``Engine.generate`` of the 64 first prompts, then one of
                   the 64 second prompts built from their outputs: programs/s,
                   DSL / direct. Target >= 0.9.
  select_cost      a 4-choice ``select`` vs one gen of as many tokens as the longest
                   choice has, on the same prompt, one call after another: ms per
                   call (median of each run's calls), select / gen. Target <= 1.5.

Every gen is greedy with ``ignore_eos`` (fixed lengths on both sides), float32, the
engine's defaults otherwise. The cache is flushed before every timed run of the first
three workloads (a run must not be served from the previous repeat's prefixes).
select_cost is measured with the prompt cached on both sides (each run starts with
one untimed call of its side, and nothing flushes in between): that is the
steady state of an evaluation whose prompts share their prefix, and it compares what
each call adds on top of its prompt; without the cache both sides would mostly time
the same prompt prefill.

Sides run in child processes, one per engine (radix cache on: every side but
``no_sharing``; off: ``no_sharing``), as ``bench_engine.py``'s ``SideProcess``. Two
engines in one process would be fair only if the idle one's loop thread had retired
(``IDLE_EXIT_S`` of idleness, at every switch of sides) before the other works, or
its OpenMP team slows the working one's ops; a process per engine makes that hold by
construction. Within a repeat the sides of a workload run back to back, alternating,
so that the machine's drift hits both; the paired ratio is the median of the
per-repeat ratios (first side / second).

Usage: .venv/bin/python benchmarks/bench_dsl.py [--repeats 3]
           [--workloads few_shot_select branching dsl_overhead select_cost] [--quick]
Prints a table and writes benchmarks/results/dsl.json (``--quick``: tiny sizes, one
repeat unless ``--repeats`` says otherwise, and no file unless ``--out`` names one).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

import radixlm as sgl  # noqa: E402
from radixlm.runtime.model_store import pull_default_model  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "dsl.json"
DTYPE = "float32"


@dataclass(frozen=True)
class Sizes:
    """How many programs (or sequential calls) each workload runs per timed run."""

    num_questions: int = 64  # few_shot_select
    num_branch_programs: int = 32  # branching
    num_two_gen_programs: int = 64  # dsl_overhead
    num_select_calls: int = 20  # select_cost, per side per run


QUICK = Sizes(num_questions=4, num_branch_programs=2, num_two_gen_programs=4, num_select_calls=3)

# ---- the prompts ----------------------------------------------------------------------

SHOTS = [
    ("Tom has 3 apples and buys 5 more. How many apples does he have now?",
     ("2", "8", "15", "35"), "He starts with 3 and buys 5, so 3 + 5 = 8.", "B"),
    ("A train travels 60 miles per hour for 2 hours. How far does it go?",
     ("120 miles", "62 miles", "30 miles", "58 miles"), "Speed times time: 60 * 2 = 120.", "A"),
    ("Sara reads 12 pages a day. How many pages does she read in a week?",
     ("19", "72", "84", "5"), "A week has 7 days, so 12 * 7 = 84 pages.", "C"),
    ("A box holds 24 pencils. Tim gives away 9. How many are left?",
     ("33", "16", "14", "15"), "He had 24 and gave away 9, so 24 - 9 = 15.", "D"),
    ("There are 5 rows of chairs with 6 chairs each. How many chairs are there?",
     ("11", "30", "1", "36"), "Five rows of six chairs is 5 * 6 = 30 chairs.", "B"),
]  # fmt: skip
LETTERS = ("A", "B", "C", "D")


def multiple_choice(question: str, options: tuple[str, ...]) -> str:
    lines = "".join(f"{letter}. {option}\n" for letter, option in zip(LETTERS, options))
    return f"Question: {question}\n{lines}"


FEW_SHOT = (
    "Answer each multiple-choice question with the letter of the right option.\n\n"
    + "".join(
        f"{multiple_choice(q, options)}Reasoning: {why}\nAnswer: {answer}\n\n"
        for q, options, why, answer in SHOTS
    )
)


def questions(num: int, seed: int = 0) -> list[str]:
    """``num`` different 4-option questions (the right option's place varies)."""
    rng = random.Random(seed)
    out = []
    for i in range(num):
        count, price = i + 2, rng.randint(2, 9)
        right = count * price
        options = [str(right), str(right + price), str(count + price), str(right - 1)]
        rng.shuffle(options)
        question = f"A shop sells pens for {price} dollars each. What do {count} pens cost?"
        out.append(multiple_choice(question, tuple(options)))
    return out


GUIDE = (
    "You are helping a small team plan their work. For every topic, first list three "
    "independent ideas, each in one short sentence, then write a one-sentence critique "
    "of each idea that names its main risk. Keep the ideas concrete: say who does what "
    "and by when. Prefer ideas that can be tried within a week and measured with a "
    "number the team already tracks. Avoid ideas that need a new tool, a new hire or "
    "the approval of another team. A good critique names the one thing most likely to "
    "go wrong and how the team would notice it early. Do not repeat the topic, do not "
    "number the sentences, and do not add a summary at the end.\n\n"
)
TOPICS = [
    "faster code reviews", "fewer flaky tests", "shorter release cycles", "better on-call",
    "clearer design docs", "smaller pull requests", "onboarding new engineers",
    "cheaper cloud bills",
]  # fmt: skip


def topics(num: int) -> list[str]:
    return [f"{TOPICS[i % len(TOPICS)]} (team {i})" for i in range(num)]


def two_gen_prompts(num: int) -> list[str]:
    return [
        f"Write a short note to colleague number {i} about the weekly meeting:" for i in range(num)
    ]


MORE = "\nNow add one sentence about the agenda:"
SELECT_PROMPT = FEW_SHOT + "Question: Which color do you get by mixing blue and yellow?\nAnswer:"
SELECT_CHOICES = [" green", " a dark shade of purple", " orange", " light red"]


def greedy(num_tokens: int) -> dict[str, Any]:
    """A fixed-length greedy gen's arguments (``sgl.gen`` names)."""
    return {"max_tokens": num_tokens, "temperature": 0, "ignore_eos": True}


# ---- the programs ---------------------------------------------------------------------


@sgl.function
def answer_choice(s, question):
    s += FEW_SHOT + question + "Answer:"
    s += sgl.select("answer", choices=[f" {letter}" for letter in LETTERS])


@sgl.function
def branch_twice(s, topic):
    s += GUIDE + f"Topic: {topic}\n"
    ideas = s.fork(3)
    ideas += lambda i: f"Idea {i + 1}:"
    ideas += sgl.gen("idea", **greedy(8))
    ideas.join()
    s += "".join(f"Idea {i + 1}:{idea}\n" for i, idea in enumerate(s["idea"]))
    critiques = s.fork(3)
    critiques += lambda i: f"Critique of idea {i + 1}:"
    critiques += sgl.gen("critique", **greedy(8))
    critiques.join()


@sgl.function
def two_gens(s, prompt):
    s += prompt
    s += sgl.gen("a", **greedy(16))
    s += MORE
    s += sgl.gen("b", **greedy(16))


@sgl.function
def pick(s, prompt, choices):
    s += prompt
    s += sgl.select("pick", choices=choices)


@sgl.function
def gen_like(s, prompt, num_tokens):
    s += prompt
    s += sgl.gen("out", **greedy(num_tokens))


# ---- one side's engine (a child process) ----------------------------------------------


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def check_states(states: list[sgl.ProgramState]) -> None:
    errors = [state.error() for state in states if state.error() is not None]
    if errors:
        raise RuntimeError(f"{len(errors)} of {len(states)} programs failed: {errors[0]!r}")


class Tasks:
    """The timed runs one engine serves; each returns {"value": ..., ...extras}."""

    def __init__(self, radix_cache: bool, sizes: Sizes) -> None:
        self.engine = sgl.Engine(
            model_path=str(pull_default_model(progress=False)),
            dtype=DTYPE,
            disable_radix_cache=not radix_cache,
        )
        self.backend = sgl.Runtime(engine=self.engine)
        self.sizes = sizes
        self.questions = [{"question": q} for q in questions(sizes.num_questions)]
        self.topics = [{"topic": t} for t in topics(sizes.num_branch_programs)]
        self.two_gen_prompts = two_gen_prompts(sizes.num_two_gen_programs)
        tokenize = self.backend.tokenizer
        self.num_choice_tokens = max(
            len(tokenize(c, add_special_tokens=False)["input_ids"]) for c in SELECT_CHOICES
        )

    def warm_up(self) -> None:
        """One small run of every program kind (batched decode rows, forks, scoring
        passes): the first passes of a process pay one-time costs."""
        self.engine.generate(["Hello", "Hi there"], greedy_params(4))
        check_states(answer_choice.run_batch(self.questions[:2], backend=self.backend))
        check_states(branch_twice.run_batch(self.topics[:1], backend=self.backend))
        prompts = [{"prompt": p} for p in self.two_gen_prompts[:2]]
        check_states(two_gens.run_batch(prompts, backend=self.backend))
        self.engine.flush_cache()

    def run(self, task: str) -> dict[str, float]:
        return getattr(self, task)()

    def few_shot_select(self) -> dict[str, float]:
        return self._batch(answer_choice, self.questions)

    def branching(self) -> dict[str, float]:
        return self._batch(branch_twice, self.topics)

    def two_gen_dsl(self) -> dict[str, float]:
        return self._batch(two_gens, [{"prompt": p} for p in self.two_gen_prompts])

    def two_gen_direct(self) -> dict[str, float]:
        self.engine.flush_cache()
        prompts, params = self.two_gen_prompts, greedy_params(16)

        def both_calls() -> None:
            firsts = self.engine.generate(prompts, params)
            seconds = [p + out["text"] + MORE for p, out in zip(prompts, firsts)]
            self.engine.generate(seconds, params)

        return {"value": len(prompts) / timed(both_calls)}

    def select_call(self) -> dict[str, float]:
        return self._per_call(pick, {"prompt": SELECT_PROMPT, "choices": SELECT_CHOICES})

    def gen_call(self) -> dict[str, float]:
        args = {"prompt": SELECT_PROMPT, "num_tokens": self.num_choice_tokens}
        return self._per_call(gen_like, args)

    def _batch(self, program: sgl.SglFunction, entries: list[dict]) -> dict[str, float]:
        """programs/s of one ``run_batch`` from an empty cache, and its hit rate."""
        self.engine.flush_cache()
        before = self.engine.get_stats()
        start = time.perf_counter()
        states = program.run_batch(entries, backend=self.backend)
        elapsed = time.perf_counter() - start
        check_states(states)
        after = self.engine.get_stats()
        prompt = after.num_prompt_tokens - before.num_prompt_tokens
        cached = after.num_cached_tokens - before.num_cached_tokens
        return {"value": len(entries) / elapsed, "hit_rate": cached / prompt if prompt else 0.0}

    def _per_call(self, program: sgl.SglFunction, args: dict) -> dict[str, float]:
        """Median ms of sequential calls, after one untimed call that caches the prompt."""
        check_states([program.run(backend=self.backend, **args)])
        times = [
            timed(lambda: program.run(backend=self.backend, **args))
            for _ in range(self.sizes.num_select_calls)
        ]
        return {"value": 1000 * statistics.median(times)}


def greedy_params(num_tokens: int) -> dict[str, Any]:
    """``greedy`` in ``Engine.generate``'s names."""
    return {"max_new_tokens": num_tokens, "temperature": 0, "ignore_eos": True}


def serve(radix_cache: bool, sizes: Sizes) -> None:
    """Child process: loads one engine, then answers each task named on stdin with
    its result as one JSON line on stdout."""
    tasks = Tasks(radix_cache, sizes)
    tasks.warm_up()
    print("ready", flush=True)
    for line in sys.stdin:
        print(json.dumps(tasks.run(line.strip())), flush=True)
    tasks.engine.shutdown()


class EngineProcess:
    """One engine in its own child process (this file with ``--serve``)."""

    def __init__(self, radix_cache: bool, quick: bool) -> None:
        cmd = [sys.executable, __file__, "--serve", "radix" if radix_cache else "none"]
        self.proc = subprocess.Popen(
            cmd + (["--quick"] if quick else []),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the engine process {cmd} did not start (see its stderr)")

    def run(self, task: str) -> dict[str, float]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(task + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the engine process died during {task!r} (see its stderr)")
        return json.loads(line)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()


# ---- the comparison -------------------------------------------------------------------


@dataclass(frozen=True)
class Side:
    name: str
    radix_cache: bool  # which engine process serves it
    task: str  # the Tasks method


@dataclass(frozen=True)
class Workload:
    """Two sides; the ratio is first / second, and ``target`` bounds it (at least
    when ``higher_is_better``, at most otherwise)."""

    metric: str
    sides: tuple[Side, Side]
    target: float
    higher_is_better: bool = True

    def met(self, ratio: float) -> bool:
        return ratio >= self.target if self.higher_is_better else ratio <= self.target


WORKLOADS = {
    "few_shot_select": Workload(
        "programs/s",
        (
            Side("radix_cache", True, "few_shot_select"),
            Side("no_sharing", False, "few_shot_select"),
        ),
        3.0,
    ),
    "branching": Workload(
        "programs/s",
        (Side("radix_cache", True, "branching"), Side("no_sharing", False, "branching")),
        3.0,
    ),
    "dsl_overhead": Workload(
        "programs/s",
        (Side("dsl", True, "two_gen_dsl"), Side("direct", True, "two_gen_direct")),
        0.9,
    ),
    "select_cost": Workload(
        "ms/call",
        (Side("select", True, "select_call"), Side("gen", True, "gen_call")),
        1.5,
        higher_is_better=False,
    ),
}

Runs = dict[str, dict[str, list[dict[str, float]]]]  # workload -> side -> one result per repeat


def compare(names: list[str], repeats: int, quick: bool) -> Runs:
    """Every repeat runs each workload's two sides back to back, alternating which
    goes first, so that both share the machine's drift."""
    needed = {side.radix_cache for name in names for side in WORKLOADS[name].sides}
    procs = {radix: EngineProcess(radix, quick) for radix in sorted(needed, reverse=True)}
    runs: Runs = {name: {side.name: [] for side in WORKLOADS[name].sides} for name in names}
    try:
        for repeat in range(repeats):
            for name in names:
                sides = WORKLOADS[name].sides
                for side in sides if repeat % 2 == 0 else sides[::-1]:
                    result = procs[side.radix_cache].run(side.task)
                    runs[name][side.name].append(result)
                    print(f"repeat {repeat} {name} {side.name}: {json.dumps(result)}", flush=True)
    finally:
        for proc in procs.values():
            proc.close()
    return runs


def summarize(runs: Runs) -> dict[str, dict[str, Any]]:
    """Per workload: each side's median, the ratio of the medians, the median of the
    per-repeat ratios, and whether that meets the target."""
    summary = {}
    for name, by_side in runs.items():
        workload = WORKLOADS[name]
        first, second = (by_side[side.name] for side in workload.sides)
        values = [[r["value"] for r in first], [r["value"] for r in second]]
        medians = [statistics.median(v) for v in values]
        paired = statistics.median(a / b for a, b in zip(*values, strict=True))
        summary[name] = {
            "metric": workload.metric,
            "medians": {side.name: m for side, m in zip(workload.sides, medians)},
            "ratio_of_medians": medians[0] / medians[1],
            "paired_ratio": paired,
            "target": f"{'>=' if workload.higher_is_better else '<='} {workload.target}",
            "met": workload.met(paired),
            "hit_rates": {
                side.name: statistics.median(r["hit_rate"] for r in by_side[side.name])
                for side in workload.sides
                if "hit_rate" in by_side[side.name][0]
            },
        }
    return summary


def print_table(summary: dict[str, dict[str, Any]]) -> None:
    print(
        f"{'workload':<16} {'metric':<11} {'side 1':>22} {'side 2':>22} "
        f"{'ratio':>7} {'paired':>7} {'target':>7} met"
    )
    for name, row in summary.items():
        cells = [f"{side} {value:.2f}" for side, value in row["medians"].items()]
        print(
            f"{name:<16} {row['metric']:<11} {cells[0]:>22} {cells[1]:>22} "
            f"{row['ratio_of_medians']:>6.2f}x {row['paired_ratio']:>6.2f}x "
            f"{row['target']:>7} {'yes' if row['met'] else 'NO'}"
        )
        if row["hit_rates"]:
            rates = ", ".join(f"{side} {rate:.1%}" for side, rate in row["hit_rates"].items())
            print(f"{'':<16} cache hit rate: {rates}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, help="timed runs per side (default 3; 1 quick)")
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke check")
    parser.add_argument("--out", type=Path, help=f"where to write the JSON (default {RESULTS})")
    parser.add_argument("--serve", choices=["radix", "none"], help=argparse.SUPPRESS)  # child
    args = parser.parse_args()
    sizes = QUICK if args.quick else Sizes()
    if args.serve:
        serve(args.serve == "radix", sizes)
        return
    repeats = args.repeats or (1 if args.quick else 3)
    if repeats < 1:
        parser.error("--repeats must be >= 1")
    runs = compare(args.workloads, repeats, args.quick)
    summary = summarize(runs)
    print_table(summary)
    out = args.out or (None if args.quick else RESULTS)
    if out is not None:
        report = {
            "dtype": DTYPE,
            "threads": torch.get_num_threads(),
            "repeats": repeats,
            "quick": args.quick,
            "sizes": dataclasses.asdict(sizes),
            "summary": summary,
            "runs": runs,
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2))
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
