"""Engine in a thread of the HTTP server vs the engine alone: 32 concurrent streams.

Both sides in one script run, same model, same workload (32 chat-sized prompts,
64 new tokens each, ignore_eos, greedy). The HTTP client runs in a child process
(as a real client would, off the server's GIL). Prints output tok/s of each side
and their ratio; `--runs` alternates the sides.

    .venv/bin/python benchmarks/bench_server.py --runs 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import textwrap
import threading
import time

NUM_STREAMS, NEW_TOKENS = 32, 64

CLIENT = textwrap.dedent(
    """
    import asyncio, json, sys, time, httpx
    url, n, new = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    async def one(c, i):
        body = {"model": "default", "prompt": f"Question {i}: tell me about the sea.",
                "max_tokens": new, "ignore_eos": True, "temperature": 0, "stream": True}
        async with c.stream("POST", "/v1/completions", json=body) as r:
            async for _ in r.aiter_lines():
                pass
    async def main():
        async with httpx.AsyncClient(base_url=url, timeout=600) as c:
            t = time.perf_counter()
            await asyncio.gather(*(one(c, i) for i in range(n)))
            print(json.dumps({"seconds": time.perf_counter() - t}))
    asyncio.run(main())
    """
)


def in_process(engine) -> float:
    from radixlm.runtime.io import GenerateRequest, SamplingParams

    params = SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True, temperature=0)
    reqs = [
        GenerateRequest(text=f"Question {i}: tell me about the sea.", sampling_params=params)
        for i in range(NUM_STREAMS)
    ]

    async def one(req):
        async for _ in engine.async_stream_requests([req]):
            pass

    async def main():
        t = time.perf_counter()
        await asyncio.gather(*(one(r) for r in reqs))
        return time.perf_counter() - t

    return NUM_STREAMS * NEW_TOKENS / asyncio.run(main())


def over_http(base_url: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", CLIENT, base_url, str(NUM_STREAMS), str(NEW_TOKENS)],
        capture_output=True,
        text=True,
        check=True,
    )
    return NUM_STREAMS * NEW_TOKENS / json.loads(out.stdout.strip().splitlines()[-1])["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    import uvicorn

    from radixlm import Engine
    from radixlm.runtime.entrypoints.http import ServerConfig, ServerState, build_app

    engine = Engine(dtype="float32", max_total_tokens=16384)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    state = ServerState.create(engine, ServerConfig(port=port))
    server = uvicorn.Server(uvicorn.Config(build_app(state), port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    base = f"http://127.0.0.1:{port}"
    in_process(engine)  # warm-up
    results: dict[str, list[float]] = {"in_process": [], "http": []}
    for _ in range(args.runs):
        results["in_process"].append(in_process(engine))
        results["http"].append(over_http(base))
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"{NUM_STREAMS} streams x {NEW_TOKENS} tokens, output tok/s (median of {args.runs})")
    print(f"  in-process engine: {med['in_process']:.1f}   runs {results['in_process']}")
    print(f"  through HTTP:      {med['http']:.1f}   runs {results['http']}")
    print(f"  ratio http / in-process: {med['http'] / med['in_process']:.3f}")
    server.should_exit = True
    engine.shutdown()


if __name__ == "__main__":
    main()
