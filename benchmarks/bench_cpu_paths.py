"""radixlm's C++ kernel paths against its torch path, per pass kind, for each ISA build
and dtype; ``--write-table`` writes the engine's choice from them.

Whole model passes through the engine's own runner (``ModelRunner.run``: the forward
path it picks, the LM head and greedy sampling of each request's last token), sides
alternating run by run: medians, and paired ratios (the median of the per-repeat
ratios). The default model (or ``--model``: a directory, or ``llama-3.2-1b``, a
random-weight checkpoint of Llama-3.2-1B's shape written once by
``write_random_model``), in each of ``--dtypes`` (float32 and bfloat16). For each ISA
this CPU can run and each dtype, one process: radixlm's kernels built for it
(``avx2``: ``-march=x86-64-v3``, ``avx512``: ``-march=x86-64-v4``; the CPU's widest
ISA: ``-march=native``, the engine's default build, which adds the CPU's own
extensions such as AVX512-BF16 dot products) and torch's own
kernels held to it too (``ATEN_CPU_CAPABILITY``, ``ONEDNN_MAX_CPU_ISA``,
``MKL_ENABLE_INSTRUCTIONS``), so that on an AVX-512 machine the avx2 process measures
what an AVX2-only CPU would run on both sides. In each, two kernel configurations are
timed against the torch path (``attention_backend="torch", cpu_layer_kernels=False``):

  attention  ``attention_backend="cpu"``: decode rows through the decode
             kernel, prefill rows through the extend kernel; layers in torch
  all        ``attention_backend="cpu", cpu_layer_kernels=True``: in addition,
             passes of up to 64 tokens through the few-row layer kernels (a pass
             of decode rows in one C++ call) and the elementwise kernels in the
             eager passes

Pass kinds: decode passes of 1, 8 and 32 rows (each row 200 cached tokens and one new
one), a 1,000-token prefill, and an extend of 512 new tokens on 2,000 cached
(``--passes``: a subset, by key). Each pass kind of the engine's table is decided by
some of them (``KINDS``): decode attention and few-row layers by the decode passes,
extend attention by the prefill and the extend; its kernel is faster where the
geometric mean of those passes' ratios (the side without it / the side with it) is
above 1; ``decode2``, ``decode4`` and ``decode16`` (not run unless named) only
refine where the few-row layers stop. ``--write-table`` merges the verdicts, with the
medians, the CPU (its model name, ISA flags and AMX), the date and the command, into
``runtime/executor/cpu_paths_table.json`` under this CPU's kind ("amx" or "no_amx"),
replacing only the (ISA, dtype) rows this run measured: a run on an AMX machine adds
its rows beside the others. A row holds the kinds its run's passes decide (e.g.
``--passes decode1 decode8 decode32``: decode attention and few-row layers; the
engine takes the torch path for a kind no row has, and says so). A run on another
model (``--model``) is written beside its (ISA, dtype) row, under ``models`` with the
model's hidden size: the engine stops the few-row layers where the measured shape
nearest its own model's size says (a shape where oneDNN's products overtake the
kernel's at some rows stops there; the default model's and, in bfloat16 on a CPU
with AVX512-BF16, Llama-3.2-1B's measured none up to 32).

Usage: .venv/bin/python benchmarks/bench_cpu_paths.py [--repeats 7] [--dtypes float32
    bfloat16] [--isas avx2 avx512] [--threads N] [--model PATH|llama-3.2-1b]
    [--passes KEY ...] [--cpu-label EPYC-512] [--write-table] [--out PATH]
Prints a table and writes benchmarks/results/cpu_paths.json. Memory: three runtimes
of the model at once (the Llama shape in bfloat16 passed 16 GB resident).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from radixlm.kernels.cpu.native import cpu_flags, cpu_isa, runnable_targets
from radixlm.runtime.attention import AttentionInputs
from radixlm.runtime.config import EngineConfig
from radixlm.runtime.entrypoints.assembly import Runtime, build_runtime
from radixlm.runtime.executor import cpu_paths
from radixlm.runtime.executor.cpu_threads import configure_cpu
from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.io.sampling_params import SamplingParams
from radixlm.runtime.model_store import cache_root, default_model_dir
from radixlm.runtime.sampling.sampler import SamplingRow

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "cpu_paths.json"
TABLE = HERE.parent / "runtime" / "executor" / cpu_paths.TABLE_FILE
DTYPES = ("float32", "bfloat16")

# (cached tokens, new tokens) of each request of a pass, by key.
PASSES: dict[str, list[tuple[int, int]]] = {
    "decode1": [(200, 1)],
    "decode2": [(200, 1)] * 2,
    "decode4": [(200, 1)] * 4,
    "decode8": [(200, 1)] * 8,
    "decode16": [(200, 1)] * 16,
    "decode32": [(200, 1)] * 32,
    "prefill1000": [(0, 1000)],
    "extend512": [(2000, 512)],
}
PASS_NAMES = {
    "decode1": "decode, 1 row",
    "decode2": "decode, 2 rows",
    "decode4": "decode, 4 rows",
    "decode8": "decode, 8 rows",
    "decode16": "decode, 16 rows",
    "decode32": "decode, 32 rows",
    "prefill1000": "prefill, 1,000 tokens",
    "extend512": "extend, 512 on 2,000 cached",
}
# The passes a run takes unless --passes says: those that decide the kinds (decode2,
# decode4 and decode16 only refine where the few-row layers stop).
DEFAULT_PASSES = ("decode1", "decode8", "decode32", "prefill1000", "extend512")
# Each pass kind of the engine's table: (the passes that decide it, the side with its
# kernel, the side without): the few-row layers are what "all" adds to "attention".
KINDS: dict[str, tuple[tuple[str, ...], str, str]] = {
    "decode_attention": (("decode1", "decode8", "decode32"), "attention", "torch"),
    "extend_attention": (("prefill1000", "extend512"), "attention", "torch"),
    "few_row_layers": (("decode1", "decode8", "decode32"), "all", "attention"),
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


def build(config: dict, isa: str, dtype: str, model: Path | None) -> Runtime:
    model_path = {"model_path": str(model)} if model is not None else {}
    # The CPU's widest ISA is measured with the native build, the engine's default:
    # its extensions (AVX512-BF16 and VNNI dot products) are part of what it runs.
    build_isa = "native" if isa == cpu_isa() else isa
    engine_config = EngineConfig.from_kwargs(
        dtype=dtype, max_total_tokens=NUM_SLOTS, cpu_kernel_isa=build_isa, **model_path, **config
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


def all_kernels_table() -> cpu_paths.PathsTable:
    """A table whose every verdict is the kernel path, for the child processes: each
    side must take the kernels its configuration asks for, whatever the packaged
    table (the one this benchmark writes) says now."""
    entry = {"kinds": {kind: {"kernel_is_faster": True} for kind in cpu_paths.KINDS}}
    isas = {t.name: dict.fromkeys(DTYPES, entry) for t in runnable_targets()}
    return cpu_paths.PathsTable(dict.fromkeys(cpu_paths.CPU_KINDS, isas))


def measure(isa: str, dtype: str, model: Path | None, passes: list[str], repeats: int) -> dict:
    """This process's side of the table: the torch path and both kernel
    configurations with the ``isa`` build and a ``dtype`` model, on each of ``passes``."""
    runtimes = {name: build(config, isa, dtype, model) for name, config in CONFIGS.items()}
    results = {}
    for key in passes:
        sides = {}
        for side, runtime in runtimes.items():
            batch = make_batch(runtime, PASSES[key])
            sides[side] = lambda runtime=runtime, batch=batch: runtime.runner.run(batch)
        runs = compare(sides, repeats)
        medians = {side: statistics.median(ts) for side, ts in runs.items()}
        results[key] = {
            "pass": PASS_NAMES[key],
            "requests": PASSES[key],
            "median_ms": {side: m * 1e3 for side, m in medians.items()},
            "ratio_vs_torch": {side: paired_ratio(runs["torch"], ts) for side, ts in runs.items()},
            "runs_ms": {side: [t * 1e3 for t in ts] for side, ts in runs.items()},
        }
    return results


def run_child(isa: str, dtype: str, args: argparse.Namespace, model: Path | None) -> dict:
    """``measure`` in a child process whose torch is held to ``isa``."""
    env = os.environ | TORCH_ISA_ENV[isa]
    cmd = [sys.executable, __file__, "--child", isa, dtype, "--repeats", str(args.repeats)]
    cmd += ["--threads", str(args.threads)]
    cmd += ["--passes", *args.passes] + (["--model", str(model)] if model is not None else [])
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.splitlines()[-1])


def paired_ratio(baseline: list[float], kernel: list[float]) -> float:
    """The median of the per-repeat ratios baseline / kernel (the sides of a repeat
    ran back to back: a slow spell of the machine hits both)."""
    return statistics.median(b / k for b, k in zip(baseline, kernel, strict=True))


def decided_kinds(passes: set[str]) -> list[str]:
    """The table kinds whose deciding passes are all among ``passes`` (keys)."""
    return [kind for kind, (keys, _, _) in KINDS.items() if set(keys) <= passes]


def kind_verdicts(passes: dict[str, dict]) -> dict[str, dict]:
    """The verdict of each table kind whose deciding passes are all in one (ISA,
    dtype)'s measured ``passes``: those passes' medians without and with its kernel,
    their paired ratios, and whether the geometric mean of the ratios is above 1. A
    kind decided by decode passes lists every decode pass measured (where the engine
    stops taking its kernel: ``PathsTable.max_rows``), its mean still over its own."""
    verdicts = {}
    for kind in decided_kinds(set(passes)):
        keys, kernel, baseline = KINDS[kind]
        listed = list(keys)
        if all(key.startswith("decode") for key in keys):
            listed = sorted(
                (key for key in passes if key.startswith("decode")),
                key=lambda key: int(key.removeprefix("decode")),
            )
        rows = {}
        for key in listed:
            median, runs = passes[key]["median_ms"], passes[key]["runs_ms"]
            ratio = paired_ratio(runs[baseline], runs[kernel])
            rows[key] = {"torch_ms": median[baseline], "kernel_ms": median[kernel], "ratio": ratio}
        mean = math.exp(statistics.fmean(math.log(rows[key]["ratio"]) for key in keys))
        verdicts[kind] = {"kernel_is_faster": mean > 1.0, "ratio": mean, "passes": rows}
    return verdicts


def merge_table(
    table: dict, cpu: str, isa: str, dtype: str, entry: dict, model: str | None = None
) -> dict:
    """``table`` (the file's JSON; {} for none) with ``entry`` as the row of CPU kind
    ``cpu``, ``isa`` and ``dtype`` (the models measured beside the row it replaces
    kept), or, with ``model``, as that model's measurement beside the row (under its
    ``models``; the row must be there): every other row kept. Returns a new dict.

    Raises:
        ValueError: ``model`` given where the table has no such row."""
    rows = {c: {i: dict(d) for i, d in isas.items()} for c, isas in table.get("cpus", {}).items()}
    dtypes = rows.setdefault(cpu, {}).setdefault(isa, {})
    old = dtypes.get(dtype)
    if model is None:
        dtypes[dtype] = entry | ({"models": old["models"]} if old and "models" in old else {})
    elif old is None:
        raise ValueError(f"{cpu}/{isa}/{dtype}: no row to measure {model} beside")
    else:
        dtypes[dtype] = old | {"models": old.get("models", {}) | {model: entry}}
    return {"about": TABLE_ABOUT, "cpus": rows}


TABLE_ABOUT = (
    "Written by benchmarks/bench_cpu_paths.py --write-table (do not edit): for each CPU "
    "kind (amx, no_amx), kernel ISA build and model dtype, whether each pass kind's C++ "
    "kernel path is faster than torch's (on the default model; 'models': other shapes "
    "measured beside it, by hidden size); read by radixlm.runtime.executor.cpu_paths."
)


def describe_cpu(label: str | None) -> dict:
    """The CPU this process runs on: /proc/cpuinfo's model name, its vector flags,
    whether it has AMX, and ``label`` (default: the model name)."""
    flags = cpu_flags()
    model_name = _cpuinfo_field("model name") or "unknown"
    vector = sorted(f for f in flags if f.startswith(("avx", "amx")) or f in ("fma", "f16c"))
    return {
        "label": label or model_name,
        "model_name": model_name,
        "flags": vector,
        "amx": cpu_paths.cpu_kind(flags) == cpu_paths.AMX,
    }


def _cpuinfo_field(name: str) -> str | None:
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in info.splitlines():
        if line.split(":")[0].strip() == name:
            return line.split(":", 1)[1].strip()
    return None


def table_entry(verdicts: dict, cpu: dict, run: dict) -> dict:
    """One (ISA, dtype) row of the table: the CPU and how it was measured (``run``:
    date, command, model, repeats, threads, load), then each kind's verdict."""
    return {"cpu": cpu, **run, "kinds": verdicts}


def write_table(
    path: Path, cpu: str, rows: dict[tuple[str, str], dict], model: str | None = None
) -> None:
    """Merges ``rows`` ((isa, dtype) -> entry) into the table at ``path`` under ``cpu``
    (``model``: as that model's measurements beside the rows, merge_table)."""
    table = json.loads(path.read_text()) if path.is_file() else {}
    for (isa, dtype), entry in rows.items():
        table = merge_table(table, cpu, isa, dtype, entry, model)
    cpu_paths.PathsTable.from_json(json.dumps(table))  # what the engine will read
    path.write_text(json.dumps(table, indent=1) + "\n")


def print_table(results: dict[str, dict[str, dict]]) -> None:
    """One line per (ISA, dtype, pass): the torch path's median and both kernel sides'."""
    print(f"{'isa':7} {'dtype':9} {'pass (ms; ratio torch / side)':30} {'torch':>9}", end="")
    print(f" {'attention':>16} {'all':>16}")
    for isa, dtypes in results.items():
        for dtype, passes in dtypes.items():
            for r in passes.values():
                median, ratio = r["median_ms"], r["ratio_vs_torch"]
                cells = [f"{isa:7} {dtype:9} {r['pass']:30} {median['torch']:9.1f}"]
                cells += [f"{median[s]:9.1f} {ratio[s]:5.2f}x" for s in ("attention", "all")]
                print(" ".join(cells))


def print_verdicts(verdicts: dict[tuple[str, str], dict]) -> None:
    for (isa, dtype), kinds in verdicts.items():
        cells = [
            f"{k} {v['ratio']:.2f}x: {'kernel' if v['kernel_is_faster'] else 'torch'}"
            for k, v in kinds.items()
        ]
        print(f"{isa} {dtype}: " + ", ".join(cells))


def model_dir(choice: str | None) -> Path | None:
    """``--model``: None (the default model), a directory, or ``llama-3.2-1b``: the
    random-weight checkpoint of that shape, written once (bench_families.py's too)."""
    if choice != "llama-3.2-1b":
        return Path(choice) if choice else None
    sys.path.insert(0, str(HERE))
    from gpu_check import LLAMA_1B

    from radixlm.runtime.models import write_random_model

    path = cache_root() / "bench-models" / "llama-3.2-1b-shape"
    if not (path / "model.safetensors.index.json").is_file():
        print(f"writing {path} ...", flush=True)
        write_random_model(path, {"architectures": ["LlamaForCausalLM"], **LLAMA_1B})
    return path


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument(
        "--threads",
        type=int,
        default=EngineConfig().resolved_num_threads,
        help="torch's and the kernels' threads (default: the engine's; 1 on a busy machine)",
    )
    parser.add_argument("--dtypes", nargs="+", choices=DTYPES, default=list(DTYPES))
    isas = [t.name for t in runnable_targets()]
    parser.add_argument("--isas", nargs="+", choices=isas, default=isas)
    parser.add_argument("--passes", nargs="+", choices=list(PASSES), default=list(DEFAULT_PASSES))
    parser.add_argument("--model", help="a model directory, or llama-3.2-1b (random weights)")
    parser.add_argument("--cpu-label", help="the CPU's name in the table (e.g. EPYC-512)")
    parser.add_argument("--write-table", action="store_true", help=f"merge into {TABLE}")
    parser.add_argument("--table", type=Path, default=TABLE, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--child", nargs=2, metavar=("ISA", "DTYPE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not isas:
        parser.error("this CPU has neither AVX2 nor AVX-512: there are no kernel builds")
    if args.write_table and not decided_kinds(set(args.passes)):
        parser.error(f"--write-table: --passes decide no kind of the table ({KINDS})")
    return args


def main() -> None:
    args = parse_args()
    configure_cpu(args.threads)
    if args.child:
        isa, dtype = args.child
        model = Path(args.model) if args.model else None
        cpu_paths.packaged_table = all_kernels_table  # this process only: see the function
        with torch.inference_mode():
            print(json.dumps(measure(isa, dtype, model, args.passes, args.repeats)))
        return
    isas = args.isas
    model, cpu = model_dir(args.model), describe_cpu(args.cpu_label)
    print(f"CPU {cpu['label']} ({cpu['model_name']}), widest ISA {cpu_isa()}, AMX {cpu['amx']}")
    load_before = os.getloadavg()
    results = {isa: {d: run_child(isa, d, args, model) for d in args.dtypes} for isa in isas}
    load_after = os.getloadavg()
    print_table(results)
    model_path = model or default_model_dir()
    run = {
        "date": datetime.date.today().isoformat(),
        "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "model": model_path.name,
        "hidden_size": json.loads((model_path / "config.json").read_text())["hidden_size"],
        "repeats": args.repeats,
        "threads": torch.get_num_threads(),
        "load_avg_1m": [round(load_before[0], 2), round(load_after[0], 2)],
    }
    payload = {**run, "cpu": cpu, "cpu_isa": cpu_isa(), "isas": results}
    verdicts = {(i, d): kind_verdicts(results[i][d]) for i in isas for d in args.dtypes}
    print_verdicts(verdicts)
    payload["verdicts"] = {f"{i} {d}": v for (i, d), v in verdicts.items()}
    if args.write_table:
        rows = {key: table_entry(v, cpu, run) for key, v in verdicts.items() if v}
        kind = cpu_paths.AMX if cpu["amx"] else cpu_paths.NO_AMX
        beside = None if model is None else model_path.name  # a shape beside the default's
        write_table(args.table, kind, rows, beside)
        print(f"wrote {args.table} ({kind} rows{f', {beside} beside them' if beside else ''})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
