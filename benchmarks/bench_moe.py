"""Mixture of experts at a realistic size: a random-weight model of Qwen3-30B-A3B's
shape (speed does not depend on the weights' values), radixlm's int4 against
llama.cpp's Q4_0 on the same weights, each side in its own process, one after the
other (the two together would not fit beside each other in 24 GiB).

The shape: hidden 2048, 32 query / 4 KV heads of 128, 128 experts of 768 (top 8,
renormalised), vocabulary 151,936 untied, 48 layers: ~19 GB of weights at int4, and a
bfloat16 checkpoint of 61 GB. So the model is measured at ``--layers`` depths (default
8 and 16: the deeper one is written, a shallower one is a view of its first layers);
two depths give a per-layer time and a fixed time (LM head, sampling, the engine's
own work), from which the 48-layer figure is extrapolated (a straight line; the
report says so), and ``--whole`` measures the 48 layers themselves (below).

Per side and depth, decode = one stream, 64 new tokens after a 16-token prompt, time
of a 64-token run less a 1-token run (63 decode steps; both prefill the prompt),
median of ``--repeats``:

  radixlm    ``quantization="int4", quantization_group_size=32`` (bfloat16
             activations; the LM head and embedding int8, the router bfloat16)
  llamacpp   ``llama-cpp-python`` in its own venv (``--llama-python``; n_threads=2,
             greedy) on a GGUF of the same checkpoint (``gguf_stream.py``: layer
             matrices Q4_0, vocabulary Q8_0, norms and router F32)

Reported: decode tok/s, weight bytes, active bytes per token (attention, router,
norms and top-8 of the experts of every layer, plus the LM head, at their stored
sizes; the one embedding row left out), the share of the memory-bandwidth limit
(active bytes x tok/s / bandwidth, a bfloat16 sum over 1 GiB measured before and
after the sides), and each process's memory (VmRSS; VmHWM, the peak; RssFile:
mapped file pages, llama.cpp's weights).

``--whole`` also runs the whole 48-layer model, both sides on one Q4_0 GGUF file
(radixlm loads it as int4 codes, its vocabulary Q8_0 as int8 groups): the written
depth's file deepened to 48 layers by copying its layers' bytes (``gguf_stream.
stack_layers``; layer l is layer l mod the written depth), so no 48-layer bfloat16
checkpoint (61 GB) is needed. It shows the model loading and decoding within the
machine's memory, and its measured speed beside the extrapolation.

``--profile`` runs torch.profiler over one MoE block's decode (1 token) in a process
of its own, loading a 1-layer view of the model without an engine.

Usage: .venv/bin/python benchmarks/bench_moe.py [--layers 8 16] [--repeats 3]
           [--sides radixlm llamacpp] [--llama-python PATH] [--whole] [--profile]
           [--out PATH]
Writes benchmarks/results/moe.json. The checkpoint (bfloat16, ~1.25 GB a layer) and
the GGUF files are written once under the radixlm cache (``bench-models/``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "peers"))
from bench_peers import SETTLE_S, RadixSide, SideProcess  # noqa: E402
from workloads import Call, Workload, save, serve  # noqa: E402

from radixlm.runtime.model_store import cache_root  # noqa: E402
from radixlm.runtime.models import write_random_model  # noqa: E402

RESULTS = HERE / "results" / "moe.json"
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "vocab_size": 151936,
    "hidden_size": 2048,
    "intermediate_size": 6144,  # unused: every layer is sparse
    "moe_intermediate_size": 768,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000.0,
    "tie_word_embeddings": False,
}
PROMPT = list(range(1000, 1016))  # 16 tokens
NEW_TOKENS = 64
RADIX_OPTIONS = {"quantization": "int4", "quantization_group_size": 32, "max_total_tokens": 4096}


# ---- models ---------------------------------------------------------------------------


def models_root() -> Path:
    return cache_root() / "bench-models"


def model_dir(layers: int, written: int) -> Path:
    """The checkpoint of ``layers`` layers: the ``written``-layer one, written once,
    or a view of its first layers (config, index and links to its shards)."""
    full = models_root() / f"qwen3-30b-a3b-shape-{written}l"
    if not (full / "model.safetensors.index.json").is_file():
        print(f"writing the {written}-layer checkpoint to {full} ...", flush=True)
        write_random_model(full, {**QWEN3_30B_A3B, "num_hidden_layers": written})
    if layers == written:
        return full
    view = models_root() / f"qwen3-30b-a3b-shape-{layers}l-of-{written}"
    if (view / "model.safetensors.index.json").is_file():
        return view
    view.mkdir(parents=True, exist_ok=True)
    config = json.loads((full / "config.json").read_text())
    (view / "config.json").write_text(json.dumps({**config, "num_hidden_layers": layers}))
    index = json.loads((full / "model.safetensors.index.json").read_text())
    kept = {
        name: file
        for name, file in index["weight_map"].items()
        if not name.startswith("model.layers.") or int(name.split(".")[2]) < layers
    }
    for file in set(kept.values()):
        link = view / file
        if not link.exists():
            link.symlink_to(full / file)
    own = ("config.json", "model.safetensors.index.json")
    for extra in full.iterdir():  # the tokenizer's files
        if extra.suffix != ".safetensors" and extra.name not in own:
            shutil.copy(extra, view / extra.name)
    (view / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": kept}, indent=1)
    )
    return view


def gguf_path(checkpoint: Path) -> Path:
    from gguf_stream import write_moe_gguf

    path = checkpoint.with_name(checkpoint.name + "-q4_0.gguf")
    if not path.is_file():
        print(f"writing {path} ...", flush=True)
        start = time.perf_counter()
        write_moe_gguf(checkpoint, path)
        print(f"  {time.perf_counter() - start:.0f} s", flush=True)
    return path


def whole_gguf(checkpoint: Path) -> Path:
    """The 48-layer Q4_0 file, deepened from ``checkpoint``'s (see ``--whole``)."""
    from gguf_stream import stack_layers

    layers = QWEN3_30B_A3B["num_hidden_layers"]
    path = models_root() / f"qwen3-30b-a3b-shape-{layers}l-q4_0.gguf"
    if not path.is_file():
        print(f"writing {path} ...", flush=True)
        config = json.loads((checkpoint / "config.json").read_text())
        stack_layers(gguf_path(checkpoint), path, layers, config)
    return path


def gguf_bytes(path: Path, top_k: int, experts: int) -> dict[str, int]:
    """The file's tensor bytes: all of them, and those a decode step reads (the
    embedding row left out, top_k of every stack of experts)."""
    import gguf

    total = active = 0
    for t in gguf.GGUFReader(path).tensors:
        total += t.n_bytes
        if t.name == "token_embd.weight":
            continue
        active += t.n_bytes * top_k // experts if "_exps." in t.name else t.n_bytes
    return {"weight_bytes": total, "active_bytes": active}


# ---- the sides ------------------------------------------------------------------------


def workloads() -> list[Workload]:
    return [
        Workload("decode_1", [Call([PROMPT], 1, forced=True)], "seconds"),
        Workload(f"decode_{NEW_TOKENS}", [Call([PROMPT], NEW_TOKENS, forced=True)], "seconds"),
    ]


class RandomModelSide(RadixSide):
    """bench_peers' radixlm side without its JSON-schema warm-up (the random model's
    word-level vocabulary has no JSON tokens)."""

    def warm_up(self) -> None:
        self.generate(Call([[100, 200, 300, 400]], 4, forced=True))

    def describe(self) -> dict:
        """Weight bytes and what one decode step reads, from the loaded modules."""
        model = self.engine._rt.runner.model  # no public seam for the module tree
        placement = self.engine.get_stats().placement
        active = _bytes(model.lm_head) + _bytes(model.model.norm)
        for layer in model.model.layers:
            experts = layer.mlp.experts
            active += _bytes(layer) - _bytes(experts)
            active += sum(_bytes(e) for e in experts) * layer.mlp.top_k // len(experts)
        return {
            "weights": placement.weights,
            "weight_bytes": placement.weight_bytes,
            "active_bytes": active,
        }


def _bytes(module) -> int:
    tensors = {id(t): t for t in (*module.parameters(), *module.buffers()) if t is not None}
    return sum(t.nbytes for t in tensors.values())


def process_memory(pid: int) -> dict[str, float]:
    """MB: VmRSS, VmHWM (peak RSS), RssAnon and RssFile (mapped file pages)."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            fields[key] = int(rest.split()[0]) / 1024
    return fields


def measure(cmd: list[str], repeats: int) -> dict:
    """One side's process: an unmeasured round, then ``repeats`` rounds of the 64- and
    1-token runs; decode tok/s per round; its memory once done."""
    proc = SideProcess(cmd, dict(os.environ))
    long, short = f"decode_{NEW_TOKENS}", "decode_1"
    proc.run(long)
    runs = []
    for _ in range(repeats):
        time.sleep(SETTLE_S)
        t_long = proc.run(long)
        time.sleep(SETTLE_S)
        t_short = proc.run(short)
        tok_s = (NEW_TOKENS - 1) / (t_long - t_short)
        runs.append({"t64_s": t_long, "t1_s": t_short, "tok_s": tok_s})
        print(f"  {runs[-1]}", flush=True)
    memory = process_memory(proc.proc.pid)
    proc.close()
    return {
        "decode_tok_s": statistics.median(r["tok_s"] for r in runs),
        "runs": runs,
        "memory_mb": memory,
    }


def radixlm_child(model: Path, workload_file: Path, info: Path) -> None:
    # a GGUF file says its own storage: Q4_0 layers load as int4 codes in groups of 32
    options = {"max_total_tokens": 4096} if model.suffix == ".gguf" else RADIX_OPTIONS
    side = RandomModelSide(str(model), **options)
    info.write_text(json.dumps(side.describe()))
    serve(side, workload_file)


# ---- the profile ----------------------------------------------------------------------


def profile_child(model: Path) -> None:
    """One MoE block's decode (1 token) under torch.profiler, no engine: its time, the
    int4 products' share, the ops that take the rest (a JSON line)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    from radixlm.runtime.executor.cpu_threads import configure_cpu
    from radixlm.runtime.layers.quantization import Quantization
    from radixlm.runtime.models import load_model

    configure_cpu(2)
    quant = Quantization("int4", 32)
    with torch.inference_mode():
        net = load_model(model, None, torch.bfloat16, "cpu", quantization=quant)  # type: ignore[arg-type]
        block = net.model.layers[0].mlp
        x = torch.randn(1, net.config.hidden_size, dtype=torch.bfloat16)  # (T=1, hidden)
        times = []
        for _ in range(300):
            start = time.perf_counter()
            block(x)
            times.append(time.perf_counter() - start)
        calls = 50
        # 10 warm-up steps: the profiler's own start-up left out
        plan = schedule(wait=0, warmup=10, active=calls, repeat=1)
        with profile(activities=[ProfilerActivity.CPU], schedule=plan) as prof:
            for _ in range(10 + calls):
                block(x)
                prof.step()
    events = prof.key_averages()
    total_us = sum(e.self_cpu_time_total for e in events)
    ops = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)
    top = [
        {"op": e.key, "calls": e.count / calls, "self_us": e.self_cpu_time_total / calls}
        for e in ops[:15]
    ]  # per block call
    int4 = sum(e.self_cpu_time_total for e in events if "int4pack_mm" in e.key)
    experts = block.experts
    active = _bytes(block.gate) + sum(_bytes(e) for e in experts) * block.top_k // len(experts)
    print(json.dumps({
        "block_ms": statistics.median(times[100:]) * 1e3,
        "profiled_self_us_per_block": total_us / calls,
        "int4_products_us_per_block": int4 / calls,
        "active_bytes": active,
        "top_ops": top,
        "table": events.table(sort_by="self_cpu_time_total", row_limit=15),
    }), flush=True)  # fmt: skip


# ---- the parent -----------------------------------------------------------------------


def bandwidth() -> float:
    import torch
    from bench_quant_kernels import bandwidth_gb_s

    from radixlm.runtime.executor.cpu_threads import configure_cpu

    configure_cpu(torch.get_num_threads())
    with torch.inference_mode():
        return bandwidth_gb_s(5)


def fit(depths: list[int], step_ms: list[float]) -> dict[str, float]:
    """Least squares step_ms = fixed + per_layer x depth, and the 48-layer step."""
    n = len(depths)
    mx, my = sum(depths) / n, sum(step_ms) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(depths, step_ms)) / sum(
        (x - mx) ** 2 for x in depths
    )
    fixed = my - slope * mx
    full = QWEN3_30B_A3B["num_hidden_layers"]
    return {
        "per_layer_ms": slope,
        "fixed_ms": fixed,
        "step_ms_48": fixed + full * slope,
        "tok_s_48": 1e3 / (fixed + full * slope),
    }


def side_commands(side: str, checkpoint: Path, args, workload_file: Path, info: Path) -> list[str]:
    """``checkpoint``: a checkpoint directory (llama.cpp reads its GGUF file) or a GGUF
    file both sides read."""
    if side == "llamacpp":
        script = str(HERE / "peers" / "llamacpp_side.py")
        gguf = checkpoint if checkpoint.suffix == ".gguf" else gguf_path(checkpoint)
        return [args.llama_python, script, str(gguf), str(workload_file)]
    return [
        sys.executable, __file__, "--side", "radixlm", "--model", str(checkpoint),
        "--workload-file", str(workload_file), "--info", str(info),
    ]  # fmt: skip


def run_profile(written: int) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--side", "profile", "--model", str(model_dir(1, written))],
        capture_output=True,
        text=True,
    )
    if out.returncode:
        raise SystemExit(f"profile failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    print(result.pop("table"))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sides", nargs="+", choices=("radixlm", "llamacpp"),
                        default=["radixlm", "llamacpp"])  # fmt: skip
    parser.add_argument("--llama-python", default="", help="python of llama-cpp-python's venv")
    parser.add_argument("--whole", action="store_true",
                        help="also run the whole 48-layer model from one GGUF file")  # fmt: skip
    parser.add_argument("--profile", action="store_true", help="profile one MoE block too")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--side", choices=("radixlm", "profile"), help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--workload-file", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--info", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side == "radixlm":
        return radixlm_child(args.model, args.workload_file, args.info)
    if args.side == "profile":
        return profile_child(args.model)
    written = max(args.layers)  # the written checkpoint's depth; the others are views
    sides = list(args.sides)
    if "llamacpp" in sides and not Path(args.llama_python).is_file():
        print("llamacpp: skipped (no --llama-python given, or it does not exist)")
        sides.remove("llamacpp")
    scratch = tempfile.TemporaryDirectory()
    workload_file, info = Path(scratch.name) / "workloads.json", Path(scratch.name) / "info.json"
    save(workloads(), workload_file)
    checkpoints = {n: model_dir(n, written) for n in sorted(args.layers)}
    if "llamacpp" in sides:
        for path in checkpoints.values():
            gguf_path(path)
    runs = dict(checkpoints)  # depth -> what the sides load
    if args.whole:
        runs[QWEN3_30B_A3B["num_hidden_layers"]] = whole_gguf(checkpoints[written])
    bw_before = bandwidth()
    print(f"bandwidth {bw_before:.1f} GB/s", flush=True)
    by_depth: dict[int, dict] = {}
    config = QWEN3_30B_A3B
    for layers, checkpoint in runs.items():
        results = {}
        for side in sides:
            print(f"{layers} layers, {side}:", flush=True)
            cmd = side_commands(side, checkpoint, args, workload_file, info)
            results[side] = measure(cmd, args.repeats)
            if side == "radixlm":
                results[side] |= json.loads(info.read_text())
            else:
                top_k, experts = config["num_experts_per_tok"], config["num_experts"]
                gguf = checkpoint if checkpoint.suffix == ".gguf" else gguf_path(checkpoint)
                results[side] |= gguf_bytes(gguf, top_k, experts)
        by_depth[layers] = results
    bw_after = bandwidth()
    bw = (bw_before + bw_after) / 2
    print(f"bandwidth {bw_after:.1f} GB/s after; shares use the mean, {bw:.1f}")
    for layers, results in by_depth.items():
        for side, r in results.items():
            r["bandwidth_share"] = r["active_bytes"] * r["decode_tok_s"] / (bw * 1e9)
            print(
                f"{layers:3} layers {side:9}: decode {r['decode_tok_s']:6.2f} tok/s, "
                f"active {r['active_bytes'] / 1e6:7.1f} MB/token "
                f"({r['bandwidth_share']:.0%} of bandwidth), weights "
                f"{r['weight_bytes'] / 1e9:.2f} GB, RSS {r['memory_mb']['VmRSS']:.0f} MB "
                f"(peak {r['memory_mb']['VmHWM']:.0f}, file {r['memory_mb']['RssFile']:.0f})"
            )
        if len(results) == 2:
            ratio = results["radixlm"]["decode_tok_s"] / results["llamacpp"]["decode_tok_s"]
            results["ratio_radixlm_over_llamacpp"] = ratio
            print(f"{layers:3} layers radixlm / llama.cpp: {ratio:.2f}x")
    fits = {}
    if len(checkpoints) >= 2:
        depths = list(checkpoints)  # the whole model's run is measured, not fitted
        for side in sides:
            steps = [1e3 / by_depth[n][side]["decode_tok_s"] for n in depths]
            fits[side] = fit(depths, steps)
            f = fits[side]
            print(
                f"{side}: {f['per_layer_ms']:.2f} ms a layer + {f['fixed_ms']:.2f} ms fixed; "
                f"48 layers extrapolated: {f['step_ms_48']:.1f} ms, {f['tok_s_48']:.2f} tok/s"
            )
    report = {
        "config": config,
        "prompt_tokens": len(PROMPT),
        "new_tokens": NEW_TOKENS,
        "repeats": args.repeats,
        "bandwidth_gb_s": {"before": bw_before, "after": bw_after},
        "by_layers": by_depth,
        "fit_48_layers_extrapolated": fits,
    }
    if args.profile:
        report["profile_moe_block"] = run_profile(written)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
