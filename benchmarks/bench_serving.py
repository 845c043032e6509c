"""A serving load generator: streamed requests to an OpenAI-compatible server (or to
radixlm's in-process Engine), timed on the client, in the manner of SGLang's
bench_serving and vLLM's benchmark_serving. Loopback only; ``--num-prompts`` bounds
every run.

Sides (``--sides``, run one after the other on the same requests):
  engine    radixlm's Engine in this process (async streams): the no-HTTP reference
  radixlm   ``radixlm serve`` started here on a free loopback port, stopped after
  vllm      ``vllm serve`` (vLLM's CPU build, ``--vllm-python``) started the same way
  router_cache_aware, router_round_robin
            ``radixlm serve --dp R`` (``--router-replicas``, 2): R replicas sharing the
            cores, behind SGLang's router with that policy
  url       the server already at ``--base-url``
``--backend engine``, ``--launch radixlm|vllm|router_...`` and ``--base-url URL`` name one
side. HTTP sides send ``/v1/completions`` (``--api completions``) or SGLang's
``/generate`` (``--api generate``; the router sides need it: the router takes token-id
prompts only there). Each run also reports the side's prefix-cache hit rate (the
prompt tokens found cached over those looked up, from the servers' own counters).

On a GPU, ``--sides engine radixlm --max-total-tokens N`` gives the server's share of a
step (benchmarks/gpu_check.py's serving section runs it so).

Datasets (prompts are token ids of the model's vocabulary, so lengths are exact;
every request is forced to its output length): ``random`` and
``generated-shared-prefix`` (serving/datasets.py). Arrivals: Poisson at
``--request-rate`` (inf: all at once), at most ``--max-concurrency`` in flight.
Run i of a side (i-th rate) uses seed ``--seed + i`` for prompts and arrivals, the
same on every side, so no run finds the previous run's prompts in a prefix cache.

Usage:
  .venv/bin/python benchmarks/bench_serving.py --sides engine radixlm \
      --max-concurrency 32 --num-prompts 96 --random-input-len 200 --random-output-len 64
  .venv/bin/python benchmarks/bench_serving.py --sides radixlm vllm \
      --vllm-python /work/vllm-venv/bin/python --sweep-rates 0.5 1 2 --goodput ttft:2000 tpot:200
  .venv/bin/python benchmarks/bench_serving.py --api generate \
      --sides radixlm router_cache_aware router_round_robin --dataset generated-shared-prefix
Every side is up at once and the runs alternate side by side (``--repeats`` times
per rate), so a shared machine's drift hits them alike. Each run starts once the
machine is quiet (``serving.machine.wait_quiet``): a server still busy after its own
run (vLLM's CPU worker polls a core for ~1 s) would otherwise share the next side's
cores. Prints a table (one column
per side and rate, medians over repeats), each side's output tok/s over the first's
(the median of the per-repeat ratios) and goodput side by side; writes --out
(JSON) and, for a sweep, a PNG beside it (P99 TTFT and goodput against request
rate). Needs httpx (the dev extra) and matplotlib (the bench extra).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from serving.arrivals import arrival_offsets  # noqa: E402
from serving.clients import Client, EngineClient, GenerateClient, OpenAIClient  # noqa: E402
from serving.datasets import (  # noqa: E402
    BenchRequest,
    random_requests,
    shared_prefix_requests,
    token_pool,
)
from serving.launch import LaunchOptions, launched  # noqa: E402
from serving.machine import LoadMeter, wait_quiet  # noqa: E402
from serving.metrics import median_summary, parse_slo, summarize  # noqa: E402
from serving.prefix_cache import (  # noqa: E402
    CacheCounts,
    engine_counts,
    replica_urls,
    url_counts,
)
from serving.report import (  # noqa: E402
    Run,
    plot_sweep,
    print_ratios,
    print_table,
    run_label,
    summary_dict,
)
from serving.runner import run_workload  # noqa: E402

RESULTS = HERE / "results" / "serving.json"
ROUTER_SIDES = ("router_cache_aware", "router_round_robin")
SIDES = ("engine", "radixlm", "vllm", *ROUTER_SIDES, "url")
WARM_UP_REQUESTS = 4  # short ones, before a side's first run: first-call costs out of it


def build_requests(args: argparse.Namespace, pool: list[int], seed: int) -> list[BenchRequest]:
    if args.dataset == "random":
        return random_requests(
            pool, args.num_prompts, args.random_input_len, args.random_output_len,
            args.random_range_ratio, seed,
        )  # fmt: skip
    return shared_prefix_requests(
        pool, args.gsp_num_groups, args.gsp_prompts_per_group, args.gsp_system_prompt_len,
        args.gsp_question_len, args.gsp_output_len, seed,
    )  # fmt: skip


Side = tuple[Client, Callable[[], CacheCounts]]  # its client, its prefix-cache counters


@contextlib.contextmanager
def side_client(side: str, args: argparse.Namespace, model_dir: str) -> Iterator[Side]:
    """The side's client and cache counters, with its engine or server(s) up for as long
    as they are used."""
    client_type = GenerateClient if args.api == "generate" else OpenAIClient
    if side == "url":
        yield client_type("url", args.base_url, args.api_key), lambda: url_counts([args.base_url])
        return
    if side == "engine":
        import radixlm

        pool = {"max_total_tokens": args.max_total_tokens} if args.max_total_tokens else {}
        engine = radixlm.Engine(model_path=model_dir, dtype=args.dtype, **pool)
        try:
            yield EngineClient(engine), engine_counts(engine)
        finally:
            engine.shutdown()
        return
    options = LaunchOptions(
        model_dir=model_dir,
        dtype=args.dtype,
        log_dir=Path(tempfile.gettempdir()) / "bench_serving",
        vllm_python=args.vllm_python,
        max_queued_requests=max(256, args.num_prompts),
        extra_args=tuple(args.launch_args.split()) + radixlm_pool_args(side, args),
        replicas=args.router_replicas,
    )
    with launched(side, options) as url:
        servers = replica_urls(url) if side in ROUTER_SIDES else [url]
        yield client_type(side, url), lambda: url_counts(servers)


def radixlm_pool_args(side: str, args: argparse.Namespace) -> tuple[str, ...]:
    """--max-total-tokens for a launched radixlm (vLLM sizes its own pool)."""
    if not args.max_total_tokens or side == "vllm":
        return ()
    return ("--max-total-tokens", str(args.max_total_tokens))


async def warm_up(client: Client) -> None:
    async with client:
        warm = [BenchRequest(tuple(range(1000, 1016)), 8)] * WARM_UP_REQUESTS
        await run_workload(client, warm, [0.0] * len(warm), None)


async def measure(client: Client, requests, offsets, max_concurrency):
    async with client:
        return await run_workload(client, requests, offsets, max_concurrency)


def resolve_sides(args: argparse.Namespace) -> list[str]:
    named = [s for s in (args.backend, args.launch, "url" if args.base_url else None) if s]
    sides = args.sides or named
    if args.sides and (args.backend or args.launch):  # (--base-url serves the url side)
        raise SystemExit("give --sides, or one of --backend / --launch / --base-url")
    if len(sides) != 1 and not args.sides:
        raise SystemExit("name exactly one side (--backend, --launch, --base-url) or --sides")
    if "url" in sides and not args.base_url:
        raise SystemExit("the url side needs --base-url")
    if set(sides) & set(ROUTER_SIDES) and args.api != "generate":
        raise SystemExit("the router sides need --api generate (token-id prompts)")
    return sides


def main() -> None:
    # SIGTERM (a `timeout`, a kill) unwinds like Ctrl-C, so launched servers, which
    # run in sessions of their own, are stopped rather than left running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args = parse_args()
    sides = resolve_sides(args)
    slo = parse_slo(args.goodput)
    rates = args.sweep_rates or [args.request_rate]
    from transformers import AutoTokenizer

    from radixlm.runtime.model_store import pull_default_model

    model_dir = args.model_path or str(pull_default_model(progress=False))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    pool = token_pool(tokenizer.vocab_size, tokenizer.all_special_ids)
    report: dict = {"config": vars(args) | {"sides": sides, "rates": rates}, "runs": []}
    summaries: dict[tuple[str, float], list] = {(sd, r): [] for sd in sides for r in rates}
    hit_rates: dict[tuple[str, float], list[float]] = {key: [] for key in summaries}
    meter = LoadMeter()
    with contextlib.ExitStack() as stack:
        # Every side up at once, then run by run each side in turn: drift in a shared
        # machine's speed then hits every side alike (an idle side waits on its queue).
        up = {side: stack.enter_context(side_client(side, args, model_dir)) for side in sides}
        clients = {side: client for side, (client, _) in up.items()}
        for client in clients.values():
            asyncio.run(warm_up(client))
        for repeat in range(args.repeats):
            for i, rate in enumerate(rates):
                seed = args.seed + repeat * len(rates) + i  # new prompts: no cache hits
                requests = build_requests(args, pool, seed)
                offsets = arrival_offsets(len(requests), rate, seed)
                for side, client in clients.items():
                    waited = wait_quiet()  # the side before may still be busy (machine.py)
                    cache_before = up[side][1]()
                    meter.start()
                    results, duration = asyncio.run(
                        measure(client, requests, offsets, args.max_concurrency)
                    )
                    other = meter.stop()
                    cache = up[side][1]() - cache_before
                    summary = summarize(results, duration, slo)
                    summaries[(side, rate)].append(summary)
                    hit_rates[(side, rate)].append(cache.hit_rate)
                    record = run_record(side, rate, repeat, summary, results)
                    record["prefix_cache"] = vars(cache) | {"hit_rate": cache.hit_rate}
                    report["runs"].append(
                        record | {"other_load_cores": other, "quiet_wait_s": waited}
                    )
                    print(f"repeat {repeat} {run_label(side, rate)}: "
                          f"{summary.output_throughput:.1f} out tok/s, "
                          f"goodput {summary.goodput:.3f} req/s, cache hits "
                          f"{100 * cache.hit_rate:.1f}%, other processes "
                          f"{other if other is not None else float('nan'):.2f} cores, "
                          f"waited {waited:.2f} s for a quiet machine",
                          flush=True)  # fmt: skip
    runs: list[Run] = [(side, rate, median_summary(v)) for (side, rate), v in summaries.items()]
    runs.sort(key=lambda run: (rates.index(run[1]), sides.index(run[0])))
    if args.repeats > 1:
        print(f"medians of {args.repeats} repeats:")
    print_table(runs)
    median_hits = {key: statistics.median(v) for key, v in hit_rates.items()}
    width = max(14, *(len(run_label(sd, r)) + 2 for sd, r, _ in runs))
    print(
        f"{'cache hit rate (%)':22}"
        + "".join(f"{100 * median_hits[(sd, r)]:>{width}.1f}" for sd, r, _ in runs)
    )
    report["medians"] = [{"side": sd, "request_rate": r, "summary": summary_dict(s),
                          "prefix_cache_hit_rate": median_hits[(sd, r)]}
                         for sd, r, s in runs]  # fmt: skip
    report["paired_output_ratio"] = print_ratios(summaries, sides, rates)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"wrote {args.out}")
    if args.sweep_rates:
        png = args.out.with_suffix(".png")
        title = f"{args.dataset}, {args.num_prompts} prompts per run, {', '.join(sides)}"
        try:
            if plot_sweep(runs, png, title):
                print(f"wrote {png}")
        except ImportError:  # the figures are written; the plot needs the bench extra
            print("no plot: matplotlib is not installed (pip install -e '.[bench]')")


def run_record(side: str, rate: float, repeat: int, summary, results) -> dict:
    return {
        "side": side,
        "request_rate": rate,
        "repeat": repeat,
        "summary": summary_dict(summary),
        "requests": [
            {
                "prompt_tokens": r.num_prompt_tokens,
                "output_tokens": r.num_output_tokens,
                "ttft_ms": r.latency_ms("ttft") if r.ok else None,
                "tpot_ms": r.latency_ms("tpot") if r.ok else None,
                "e2e_ms": r.latency_ms("e2e"),
                "error": r.error,
            }
            for r in results
        ],
    }


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = p.add_argument_group("sides")
    g.add_argument("--sides", nargs="+", choices=SIDES, help="compare these, in this order")
    g.add_argument("--backend", choices=("engine",), help="the in-process Engine alone")
    g.add_argument("--launch", choices=("radixlm", "vllm", *ROUTER_SIDES),
                   help="start this server alone")  # fmt: skip
    g.add_argument("--base-url", help="an OpenAI-compatible server already running")
    g.add_argument("--api-key", help="for --base-url")
    g.add_argument("--vllm-python", default="", help="the Python of vLLM's own venv")
    g.add_argument("--launch-args", default="", help="extra flags for the launched servers")
    g.add_argument("--model-path", help="default: radixlm's default model")
    g.add_argument("--dtype", default="float32")
    g.add_argument("--api", choices=("completions", "generate"), default="completions",
                   help="what the HTTP sides are sent: /v1/completions or /generate")  # fmt: skip
    g.add_argument("--router-replicas", type=int, default=2, help="the router sides' engines")
    g.add_argument("--max-total-tokens", type=int, default=None,
                   help="radixlm's KV pool (engine and radixlm sides): a fixed size, so an "
                   "in-process engine and a server fit one GPU together")  # fmt: skip
    g = p.add_argument_group("dataset")
    g.add_argument("--dataset", choices=("random", "generated-shared-prefix"), default="random")
    g.add_argument("--num-prompts", type=int, default=96, help="random dataset's size")
    g.add_argument("--random-input-len", type=int, default=200)
    g.add_argument("--random-output-len", type=int, default=64)
    g.add_argument("--random-range-ratio", type=float, default=1.0,
                   help="lengths uniform in [L * ratio, L]; 1: fixed")  # fmt: skip
    g.add_argument("--gsp-num-groups", type=int, default=8)
    g.add_argument("--gsp-prompts-per-group", type=int, default=8)
    g.add_argument("--gsp-system-prompt-len", type=int, default=512)
    g.add_argument("--gsp-question-len", type=int, default=64)
    g.add_argument("--gsp-output-len", type=int, default=32)
    g.add_argument("--seed", type=int, default=1)
    g = p.add_argument_group("load and report")
    g.add_argument("--request-rate", type=float, default=float("inf"), help="req/s; inf")
    g.add_argument("--max-concurrency", type=int, default=None)
    g.add_argument("--sweep-rates", type=float, nargs="+", help="a run per rate; PNG")
    g.add_argument("--goodput", nargs="*", default=[], metavar="METRIC:MS",
                   help="SLOs (ttft, tpot, e2e in ms) a request must all meet")  # fmt: skip
    g.add_argument("--repeats", type=int, default=1, help="runs per side and rate (medians)")
    g.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    if args.dataset == "generated-shared-prefix":
        args.num_prompts = args.gsp_num_groups * args.gsp_prompts_per_group
    if args.max_concurrency is not None and args.max_concurrency < 1:
        p.error("--max-concurrency must be >= 1")
    return args


if __name__ == "__main__":
    main()
