"""A few-shot multiple-choice evaluation: one program per question, run as a batch.

Every program starts with the same 5-shot prompt, so the runtime's radix cache
computes that prefix once and every question after it only pays for its own
tokens. ``sgl.select`` picks the most likely of the question's 4 choices, and the
accuracy is the share of picks that equal the answer. The questions ship in
``examples/data/arith_questions.jsonl`` (one JSON object a line: ``question``,
``choices``, ``answer``).

Run: ``.venv/bin/python examples/few_shot_eval.py`` (all 32 questions, about a
minute on a laptop CPU with the default model).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import radixlm as sgl

DATA_PATH = Path(__file__).parent / "data" / "arith_questions.jsonl"

# Worked examples, not in the question set; their text is the prefix all programs share.
SHOTS = [
    ("What is 14 + 9?", ["22", "23", "24", "25"], "23"),
    ("What is 40 - 15?", ["25", "24", "26", "35"], "25"),
    ("What is 6 * 7?", ["40", "41", "42", "43"], "42"),
    ("What is 31 + 22?", ["52", "63", "53", "54"], "53"),
    ("What is 9 * 4?", ["36", "34", "38", "35"], "36"),
]


def format_question(question: str, choices: list[str]) -> str:
    return f"Question: {question}\nChoices: {', '.join(choices)}\nAnswer:"


FEW_SHOT_PREFIX = "Answer each arithmetic question with one of its choices.\n\n" + "".join(
    f"{format_question(q, c)} {a}\n\n" for q, c, a in SHOTS
)


@sgl.function
def multiple_choice(s, question: str, choices: list[str]):
    s += FEW_SHOT_PREFIX
    s += format_question(question, choices) + " "
    s += sgl.select("pick", choices)


@dataclass(frozen=True)
class EvalResult:
    """What ``main`` measured: ``picks[i]`` is the choice picked for ``questions[i]``."""

    accuracy: float
    picks: list[str]
    questions: list[dict[str, Any]]
    num_cached_tokens: int  # prompt tokens the engine served from its prefix cache
    latency_s: float


def load_questions(num_questions: int | None = None) -> list[dict[str, Any]]:
    with DATA_PATH.open() as f:
        questions = [json.loads(line) for line in f if line.strip()]
    return questions[:num_questions]


def main(num_questions: int | None = None, backend: Any = None) -> EvalResult:
    """Evaluates the first ``num_questions`` questions (all by default) on ``backend``
    (default: the default backend) and prints the accuracy."""
    backend = backend or sgl.get_default_backend()
    questions = load_questions(num_questions)
    # Compute the shared few-shot prefix into the cache once, before the batch: the
    # programs of the batch reach the engine together, so none would find it there.
    # (``cache`` traces the body with placeholder arguments; ``select`` needs a real
    # list of choices, hence the bound one. The prefix ends before the question.)
    multiple_choice.bind(choices=questions[0]["choices"]).cache(backend=backend)
    cached_before = backend.engine.get_stats().num_cached_tokens
    start = time.perf_counter()
    states = multiple_choice.run_batch(
        [{"question": q["question"], "choices": q["choices"]} for q in questions],
        backend=backend,
    )
    latency = time.perf_counter() - start
    picks = [state["pick"] for state in states]
    num_correct = sum(pick == q["answer"] for pick, q in zip(picks, questions))
    accuracy = num_correct / len(questions)
    cached = backend.engine.get_stats().num_cached_tokens - cached_before
    print(f"accuracy {accuracy:.3f} ({num_correct}/{len(questions)}) in {latency:.1f} s")
    print(f"{cached} prompt tokens served from the prefix cache")
    return EvalResult(accuracy, picks, questions, cached, latency)


if __name__ == "__main__":
    runtime = sgl.Runtime()
    sgl.set_default_backend(runtime)
    try:
        main()
    finally:
        runtime.shutdown()
