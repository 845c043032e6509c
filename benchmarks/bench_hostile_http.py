"""What a hostile request costs the server now, in one run, two parts:

  stop strings   the stop matcher's memory and set-up time for one stop string of
                 1,024 / 4,096 (the default caps) / 30,000 / 100,000 characters, and the
                 time to scan a 4,000-character output: the previous design (every
                 proper prefix of every stop in a set: memory and time grow with the
                 square of a stop's length) beside the automaton (linear)
  /health        the wait of GET /health, polled every 10 ms, on an idle server and
                 while the largest response the default limits allow is built (30
                 samples x 310 positions x 21 entries = 195,300 logprob entries, about
                 7 MB of JSON), against a target of 100 ms

Medians and ratios are printed and written as JSON.

Usage: .venv/bin/python benchmarks/bench_hostile_http.py [--skip-server]
           [--out benchmarks/results/hostile_http.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path

from radixlm.runtime.io.stop_strings import ROOT, StopStrings

RESULTS = Path(__file__).parent / "results" / "hostile_http.json"
STOP_LENGTHS = (1_024, 4_096, 30_000, 100_000)
PREFIX_SET_MAX = 30_000  # past this the previous design takes many GB: not run
OUTPUT = ("The quick brown fox jumps over the lazy dog. " * 100)[:4_000]
LARGEST = {
    "input_ids": list(range(1000, 1300)),
    "return_logprob": True,
    "logprob_start_len": 0,
    "top_logprobs_num": 20,
    "sampling_params": {"max_new_tokens": 10, "n": 30, "temperature": 0.0, "ignore_eos": True},
}


class PrefixSetMatcher:
    """The previous matcher's state: every proper prefix of every stop string."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.prefixes = {s[:k] for s in stops for k in range(1, len(s))}
        self.longest = max((len(s) - 1 for s in stops), default=0)

    def scan(self, text: str) -> int:
        """The held-back suffix length after ``text`` (its per-feed work)."""
        for k in range(min(len(text), self.longest), 0, -1):
            if text[-k:] in self.prefixes:
                return k
        return 0


def measured(build: Callable[[], object]) -> tuple[object, float, float]:
    """(the object, seconds to build it, MB it holds)."""
    tracemalloc.start()
    start = time.perf_counter()
    built = build()
    seconds = time.perf_counter() - start
    held = tracemalloc.get_traced_memory()[0] / 1e6
    tracemalloc.stop()
    return built, seconds, held


def scan_seconds(scan: Callable[[str], object], text: str, piece: int = 4) -> float:
    """Feeding ``text`` a token's worth (``piece`` characters) at a time."""
    start = time.perf_counter()
    for i in range(0, len(text), piece):
        scan(text[i : i + piece])
    return time.perf_counter() - start


def automaton_costs(stop: str, output: str) -> dict:
    automaton, build_s, mb = measured(lambda: StopStrings([stop]))
    state = ROOT

    def feed(piece: str) -> None:
        nonlocal state
        state, _ = automaton.scan(state, piece)  # type: ignore[attr-defined]

    return {"automaton_mb": mb, "automaton_build_s": build_s,
            "automaton_scan_s": scan_seconds(feed, output)}  # fmt: skip


def prefix_set_costs(stop: str, output: str) -> dict:
    matcher, build_s, mb = measured(lambda: PrefixSetMatcher([stop]))
    pending = ""

    def feed(piece: str) -> None:  # the previous feed: pending + new text, suffix held
        nonlocal pending
        text = pending + piece
        pending = text[len(text) - matcher.scan(text) :]  # type: ignore[attr-defined]

    return {"prefix_set_mb": mb, "prefix_set_build_s": build_s,
            "prefix_set_scan_s": scan_seconds(feed, output)}  # fmt: skip


def stop_costs(lengths: Sequence[int] = STOP_LENGTHS, output: str = OUTPUT) -> list[dict]:
    rows = []
    for length in lengths:
        row = {"stop_chars": length, **automaton_costs("y" * length, output)}
        if length <= PREFIX_SET_MAX:
            row |= prefix_set_costs("y" * length, output)
            row["memory_ratio"] = row["prefix_set_mb"] / max(row["automaton_mb"], 1e-9)
        rows.append(row)
    return rows


def health_waits(base_url: str, seconds: float | None, during: Callable[[], object] | None):
    """/health waits polled every 10 ms for ``seconds``, or while ``during()`` runs."""
    import httpx

    waits: list[float] = []
    done = threading.Event()

    def poll() -> None:
        with httpx.Client(base_url=base_url, timeout=30) as client:
            while not done.is_set():
                start = time.perf_counter()
                client.get("/health")
                waits.append(time.perf_counter() - start)
                time.sleep(0.01)

    poller = threading.Thread(target=poll)
    poller.start()
    result = None
    try:
        result = during() if during is not None else time.sleep(seconds or 0)
    finally:
        done.set()
        poller.join()
    return waits, result


def health_costs() -> dict:
    import httpx

    sys.path.insert(0, str(Path(__file__).parents[1]))
    from radixlm import Engine
    from radixlm.runtime.model_store import pull_default_model
    from tests.servers import running_server

    engine = Engine(model_path=str(pull_default_model(progress=False)), dtype="float32")
    try:
        with (
            running_server(engine) as server,
            httpx.Client(base_url=server.base_url, timeout=120) as client,
        ):
            client.post("/generate", json=LARGEST)  # warm: prefix cached, pages touched
            idle, _ = health_waits(server.base_url, 3.0, None)
            busy, response = health_waits(
                server.base_url, None, lambda: client.post("/generate", json=LARGEST)
            )
            assert response.status_code == 200, response.text
            size = len(response.content)
    finally:
        engine.shutdown()
    return {
        "response_mb": size / 1e6,
        "idle_median_ms": 1000 * statistics.median(idle),
        "idle_max_ms": 1000 * max(idle),
        "busy_median_ms": 1000 * statistics.median(busy),
        "busy_max_ms": 1000 * max(busy),
        "busy_polls": len(busy),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--skip-server", action="store_true", help="the stop part only")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    stops = stop_costs()
    print(f"{'stop chars':>10} {'prefix-set MB':>14} {'automaton MB':>13} {'ratio':>7} "
          f"{'scan old ms':>12} {'scan new ms':>12}")  # fmt: skip
    for r in stops:
        old_mb = f"{r['prefix_set_mb']:.1f}" if "prefix_set_mb" in r else "(GBs)"
        ratio = f"{r['memory_ratio']:.0f}x" if "memory_ratio" in r else "-"
        old_scan = f"{1000 * r['prefix_set_scan_s']:.1f}" if "prefix_set_scan_s" in r else "-"
        print(f"{r['stop_chars']:>10} {old_mb:>14} {r['automaton_mb']:>13.2f} {ratio:>7} "
              f"{old_scan:>12} {1000 * r['automaton_scan_s']:>12.1f}")  # fmt: skip
    result: dict = {"stop_strings": stops}
    if not args.skip_server:
        health = health_costs()
        result["health"] = health
        print(f"/health wait, idle: median {health['idle_median_ms']:.1f} ms, max "
              f"{health['idle_max_ms']:.1f} ms; while a {health['response_mb']:.1f} MB logprob "
              f"response is built: median {health['busy_median_ms']:.1f} ms, max "
              f"{health['busy_max_ms']:.1f} ms over {health['busy_polls']} polls "
              f"(target: 100 ms)")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
