"""Time to first token of a streamed, JSON-schema-constrained chat completion whose
grammar is cached: this checkout's server against the same server at another commit.

This is the request path's own cost (HTTP edge, checks, the hand-off to the engine
loop, the first pass and the first SSE event): the grammar is compiled by a warm-up
request first, so no compile is timed. Both servers (``radixlm serve``, float32,
the default model) run at once; requests alternate between them one at a time, so a
drift in the machine's speed hits both alike.

Usage: .venv/bin/python benchmarks/bench_request_path.py --against REV [--requests 40]
Prints each side's median TTFT and the median of the per-pair ratios (new / old), and
writes benchmarks/results/request_path_vs_REV.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine import install_commit  # noqa: E402
from serving.launch import LaunchOptions, launched  # noqa: E402

from radixlm.runtime.model_store import pull_default_model  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "city": {"type": "string", "maxLength": 20},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
GAP_S = 0.2  # between requests: the other server's threads go back to sleep


def body(question: int) -> dict:
    return {
        "model": "default",
        "messages": [{"role": "user", "content": f"Invent person number {question} as JSON."}],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": SCHEMA, "strict": True},
        },
        "temperature": 0,
        "max_tokens": 24,
        "stream": True,
    }


def ttft_s(client: httpx.Client, url: str, question: int) -> float:
    """Seconds from sending the request to the first SSE event carrying content."""
    start = time.perf_counter()
    with client.stream("POST", url + "/v1/chat/completions", json=body(question)) as r:
        r.raise_for_status()
        lines = r.iter_lines()
        for line in lines:
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[6:]).get("choices") or [{}]
            if choices[0].get("delta", {}).get("content"):
                took = time.perf_counter() - start
                for _ in lines:  # read the rest: the request ends normally
                    pass
                return took
    raise RuntimeError("the stream carried no content")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--against", required=True, metavar="REV")
    parser.add_argument("--requests", type=int, default=40, help="timed requests per side")
    args = parser.parse_args()
    rev = subprocess.run(
        ["git", "rev-parse", "--short", args.against], check=True, capture_output=True, text=True
    ).stdout.strip()
    model_dir = str(pull_default_model(progress=False))
    tmp = Path(tempfile.mkdtemp(prefix="radixlm-bench-"))
    times: dict[str, list[float]] = {"new": [], rev: []}
    try:
        site = install_commit(rev, tmp / "install")
        new = LaunchOptions(model_dir, "float32", tmp / "logs")
        old = LaunchOptions(model_dir, "float32", tmp / "logs", python_path=str(site))
        with (
            launched("radixlm", new) as new_url,
            launched("radixlm", old) as old_url,
            httpx.Client(timeout=120) as client,
        ):
            urls = {"new": new_url, rev: old_url}
            for url in urls.values():
                ttft_s(client, url, 0)  # compiles the grammar; warms the path
            for i in range(args.requests):
                order = list(urls.items()) if i % 2 == 0 else list(urls.items())[::-1]
                for side, url in order:
                    time.sleep(GAP_S)
                    times[side].append(ttft_s(client, url, i + 1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report = {
        "against": rev,
        "requests": args.requests,
        "median_ttft_ms": {side: 1000 * statistics.median(v) for side, v in times.items()},
        "paired_ratio": statistics.median(n / o for n, o in zip(times["new"], times[rev])),
        "ttft_s": times,
    }
    print(f"{'side':<10} {'median TTFT ms':>15}")
    for side, ms in report["median_ttft_ms"].items():
        print(f"{side:<10} {ms:>15.1f}")
    print(f"paired new/{rev}: {report['paired_ratio']:.3f}x (below 1: this checkout is faster)")
    out = RESULTS / f"request_path_vs_{rev}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
