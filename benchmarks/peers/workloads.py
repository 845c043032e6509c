"""The peer-comparison workloads, as plain data every side reads (standard library only:
a peer's side runs in that peer's own virtual environment, without radixlm).

The parent (``bench_peers.py``) tokenizes the prompts once and writes them to a JSON
file; each side loads it with ``load`` and serves ``run`` requests by workload name.
Every workload is greedy. Unconstrained ones force each request to generate exactly
its stated number of tokens (EOS ignored, minimum = maximum); the JSON-schema one
stops where the object ends.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["METRICS", "Call", "Unsupported", "Workload", "load", "save", "serve", "value", "ANSWER"]

# workload -> (what its value is, whether larger is better)
METRICS: dict[str, tuple[str, bool]] = {
    "single_stream": ("tok/s, 128 new tokens", True),
    "batch_8": ("out tok/s, 8 x 64 new", True),
    "batch_8_prompt": ("s, batch_8's prompt pass", False),
    "batch_32": ("out tok/s, 32 x 64 new", True),
    "prefill_1000": ("prompt tok/s", True),
    "few_shot_one_call": ("s, 32 x 16 new, one call", False),
    "few_shot_sequential": ("s, 32 x 16 new, 32 calls", False),
    "json_schema": ("out tok/s, constrained", True),
}


@dataclass(frozen=True)
class Call:
    """One generate call: its prompts (token ids) and how many tokens each makes."""

    prompts: list[list[int]]
    max_new_tokens: int
    forced: bool  # every request makes exactly max_new_tokens (EOS ignored)
    json_schema: dict | None = None


@dataclass(frozen=True)
class Workload:
    """Calls made one after the other; the value is throughput or seconds (METRICS).

    count: "out" (completion tokens), "prompt" (prompt tokens) or "seconds".
    """

    name: str
    calls: list[Call]
    count: str


def save(workloads: list[Workload], path: Path) -> None:
    data = [
        {
            "name": w.name,
            "count": w.count,
            "calls": [c.__dict__ for c in w.calls],
        }
        for w in workloads
    ]
    path.write_text(json.dumps(data))


def load(path: Path) -> dict[str, Workload]:
    data = json.loads(Path(path).read_text())
    return {
        w["name"]: Workload(w["name"], [Call(**c) for c in w["calls"]], w["count"]) for w in data
    }


def value(workload: Workload, seconds: float, completion_tokens: int) -> float:
    """The workload's figure from its wall time and the completion tokens it made."""
    if workload.count == "seconds":
        return seconds
    if workload.count == "prompt":
        return sum(len(p) for c in workload.calls for p in c.prompts) / seconds
    return completion_tokens / seconds


ANSWER = "@@bench_peers@@ "  # what starts a line the parent reads


class Unsupported(Exception):
    """A side cannot run this workload (transformers has no JSON-schema constraint)."""


def serve(side: object, path: Path) -> None:
    """A side's process: loads the workloads, warms ``side`` up, says "ready", then for
    each workload name on stdin resets the side's prefix cache, runs the workload's
    calls and answers its value (JSON; null when unsupported) on stdout, after
    ``ANSWER`` (a peer may print its own lines to stdout too).

    ``side`` has ``generate(call) -> completion tokens``, ``reset()`` and ``warm_up()``.
    """
    workloads = load(path)
    side.warm_up()  # type: ignore[attr-defined]
    print(ANSWER + "ready", flush=True)
    for line in sys.stdin:
        workload = workloads[line.strip()]
        side.reset()  # type: ignore[attr-defined]
        try:
            start = time.perf_counter()
            tokens = sum(side.generate(call) for call in workload.calls)  # type: ignore[attr-defined]
            result = value(workload, time.perf_counter() - start, tokens)
        except Unsupported:
            result = None
        print(ANSWER + json.dumps(result), flush=True)
