"""radixlm's C++ kernel paths against its torch path, per pass kind, for each ISA build.

The default model in float32, whole model passes through the engine's own
runner (``ModelRunner.run``: the forward path it picks, the LM head and greedy
sampling of each request's last token), sides alternating run by run, medians.
For each ISA this CPU can run, one process: radixlm's kernels built for it
(``avx2``: ``-march=x86-64-v3``, ``avx512``: ``-march=x86-64-v4``) and torch's
own kernels held to it too (``ATEN_CPU_CAPABILITY``, ``ONEDNN_MAX_CPU_ISA``,
``MKL_ENABLE_INSTRUCTIONS``), so that on an AVX-512 machine the avx2 process
measures what an AVX2-only CPU would run on both sides. In each, two kernel
configurations are timed against the torch path (``attention_backend="torch",
cpu_layer_kernels=False``):

  attention  ``attention_backend="cpu"``: decode rows through the decode
             kernel, prefill rows through the extend kernel; layers in torch
  all        ``attention_backend="cpu", cpu_layer_kernels=True``: in addition,
             passes of up to 64 tokens through the few-row layer kernels (a pass
             of decode rows in one C++ call) and the elementwise kernels in the
             eager passes

Pass kinds: decode passes of 1, 8 and 32 rows (each row 200 cached tokens and
one new one), a 1,000-token prefill, and an extend of 512 new tokens on 2,000
cached. The figures decide the engine's defaults (``runtime/cpu_paths.py``):
a kernel path is the default for a pass kind and ISA only where this benchmark
measured it faster than the torch path with that ISA's build.

Usage: .venv/bin/python benchmarks/bench_cpu_paths.py [--repeats 7] [--out PATH]
Prints a table and writes benchmarks/results/cpu_paths.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from radixlm.kernels.cpu.native import cpu_isa, runnable_targets
from radixlm.runtime.attention import AttentionInputs
from radixlm.runtime.config import EngineConfig
from radixlm.runtime.entrypoints.assembly import Runtime, build_runtime
from radixlm.runtime.executor.cpu_threads import configure_cpu
from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.io.sampling_params import SamplingParams
from radixlm.runtime.sampling.sampler import SamplingRow

RESULTS = Path(__file__).parent / "results" / "cpu_paths.json"

# (cached tokens, new tokens) of each request of a pass.
PASSES: dict[str, list[tuple[int, int]]] = {
    "decode, 1 row": [(200, 1)],
    "decode, 8 rows": [(200, 1)] * 8,
    "decode, 32 rows": [(200, 1)] * 32,
    "prefill, 1,000 tokens": [(0, 1000)],
    "extend, 512 on 2,000 cached": [(2000, 512)],
}
CONFIGS = {
    "torch": {"attention_backend": "torch", "cpu_layer_kernels": False},
    "attention": {"attention_backend": "cpu", "cpu_layer_kernels": False},
    "all": {"attention_backend": "cpu", "cpu_layer_kernels": True},
}
NUM_SLOTS = 8192
# What holds torch's own kernels (ATen's vectorized ops, oneDNN, MKL) to an ISA.
TORCH_ISA_ENV = {
    "avx2": {
        "ATEN_CPU_CAPABILITY": "avx2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    },
    "avx512": {},
}


def make_batch(runtime: Runtime, requests: list[tuple[int, int]]) -> ForwardBatch:
    """A pass of ``requests`` over consecutive slots from 1, its rows' cached slots
    holding random K/V, every request sampling its last token greedily."""
    table = runtime.runner.attn_backend.req_to_token
    rows, new_slots, positions, next_slot = [], [], [], 1
    for r, (cached, new) in enumerate(requests):
        slots = torch.arange(next_slot, next_slot + cached + new)
        next_slot += cached + new
        table.write(r, 0, slots)
        rows.append(r)
        new_slots.append(slots[cached:])
        positions.append(torch.arange(cached, cached + new))
    extend_lens = torch.tensor([new for _, new in requests])
    attn = AttentionInputs(
        rows=torch.tensor(rows),
        prefix_lens=torch.tensor([cached for cached, _ in requests]),
        extend_lens=extend_lens,
        out_cache_loc=torch.cat(new_slots),
    )
    num_tokens = int(extend_lens.sum())
    greedy = SamplingRow(SamplingParams(temperature=0.0), (), frozenset())
    none = torch.empty(0, dtype=torch.int64)
    return ForwardBatch(
        input_ids=torch.randint(100, 40000, (num_tokens,)),
        positions=torch.cat(positions),
        attn=attn,
        sample_indices=extend_lens.cumsum(0) - 1,
        sampling_rows=(greedy,) * len(requests),
        return_logprobs=False,
        prompt_logprob_indices=none,
        prompt_logprob_targets=none,
        prompt_top_k=0,
    )


def build(config: dict, isa: str) -> Runtime:
    engine_config = EngineConfig.from_kwargs(
        dtype="float32", max_total_tokens=NUM_SLOTS, cpu_kernel_isa=isa, **config
    )
    runtime = build_runtime(engine_config)
    pool = runtime.runner.attn_backend.kv_pool
    gen = torch.Generator().manual_seed(0)
    for t in (pool.k, pool.v):  # K/V of the size real ones have (normed, ~unit)
        t.copy_(torch.randn(t.shape, generator=gen))
    return runtime


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def compare(sides: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Seconds of each side over ``repeats`` runs, alternating, after one warm-up each."""
    runs: dict[str, list[float]] = {name: [] for name in sides}
    for fn in sides.values():
        fn()
    for _ in range(repeats):
        for name, fn in sides.items():
            runs[name].append(timed(fn))
    return runs


def measure(isa: str, repeats: int) -> dict:
    """This process's side of the table: the torch path and both kernel
    configurations with the ``isa`` build, on every pass kind."""
    runtimes = {"torch": build(CONFIGS["torch"], isa)}
    for name in ("attention", "all"):
        runtimes[name] = build(CONFIGS[name], isa)
    results = {}
    for pass_name, requests in PASSES.items():
        sides = {}
        for side, runtime in runtimes.items():
            batch = make_batch(runtime, requests)
            sides[side] = lambda runtime=runtime, batch=batch: runtime.runner.run(batch)
        runs = compare(sides, repeats)
        medians = {side: statistics.median(ts) for side, ts in runs.items()}
        results[pass_name] = {
            "requests": requests,
            "median_ms": {side: m * 1e3 for side, m in medians.items()},
            "ratio_vs_torch": {side: medians["torch"] / m for side, m in medians.items()},
            "runs_ms": {side: [t * 1e3 for t in ts] for side, ts in runs.items()},
        }
    return results


def run_isa(isa: str, repeats: int) -> dict:
    """``measure`` in a child process whose torch is held to ``isa``."""
    env = os.environ | TORCH_ISA_ENV[isa]
    cmd = [sys.executable, __file__, "--isa", isa, "--repeats", str(repeats)]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.splitlines()[-1])


def print_table(results: dict[str, dict]) -> None:
    isas = list(results)
    header = [f"{'pass (ms; ratio torch / side)':30}"]
    for isa in isas:
        header += [f"{isa + ' torch':>12}", f"{isa + ' attention':>18}", f"{isa + ' all':>18}"]
    print(" ".join(header))
    for pass_name in PASSES:
        cells = [f"{pass_name:30}"]
        for isa in isas:
            r = results[isa][pass_name]
            cells.append(f"{r['median_ms']['torch']:12.1f}")
            for side in ("attention", "all"):
                cells.append(f"{r['median_ms'][side]:11.1f} {r['ratio_vs_torch'][side]:5.2f}x")
        print(" ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--isa", help=argparse.SUPPRESS)  # child process
    args = parser.parse_args()
    configure_cpu(EngineConfig().resolved_num_threads)
    if args.isa:
        with torch.inference_mode():
            print(json.dumps(measure(args.isa, args.repeats)))
        return
    isas = [t.name for t in runnable_targets()]
    if not isas:
        raise SystemExit("this CPU has neither AVX2 nor AVX-512: there are no kernel builds")
    print(f"CPU {platform.processor() or platform.machine()}, widest ISA {cpu_isa()}", flush=True)
    results = {isa: run_isa(isa, args.repeats) for isa in isas}
    print_table(results)
    payload = {"repeats": args.repeats, "threads": torch.get_num_threads(), "cpu_isa": cpu_isa()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload | {"isas": results}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
