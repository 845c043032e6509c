"""Dense model families at a ~1B size, radixlm against vLLM's CPU build, bfloat16
both: random-weight models (speed does not depend on the weights' values) of

  llama-3.2-1b  Llama-3.2-1B's shape (the reference family: radixlm's C++ layer
                kernels take Llama-shaped layers)
  gemma-3-1b    Gemma 3 1B's shape: hidden 1152, 26 layers, 4 heads / 1 KV head of 256,
                GeGLU 6912, vocabulary 262,144, 5 sliding (512) : 1 global layers
  gemma-2-1b    Gemma 2 2B's layer (8 heads / 4 KV heads of 256, soft-caps 50 / 30,
                alternating sliding 4096 / global), its vocabulary (256,000) and 26
                layers, narrowed to hidden 1536, GeGLU 4608: 1.2B
  phi-4-mini-1b Phi-4-mini's layer (hidden 3072, 24 heads / 8 KV heads of 128, partial
                rotary 0.75, LongRoPE, vocabulary 200,064 tied) with 6 of its 32 layers:
                1.2B

Workloads (``peers/workloads.py``; greedy, every request forced to its token count),
bench_peers.py's on random word ids (the models' tokenizer is word-level; ``--workloads``
picks, default the first two): a single stream of 128 new tokens after a ~100-token
prompt; batches of 8 and 32 prompts of 90-110 tokens, 64 new each (output tok/s); a
1,000-token prompt and one new token (prompt tok/s); 32 questions of 10 tokens after
one shared 90-token "5-shot" prefix, 16 new each, in one call (seconds; the ratio is
vLLM's time over radixlm's); and batch_8's prompts alone, one new token each
(``batch_8_prompt``, seconds). Each side in its own process, both loaded
per family and run alternately workload by workload (bench_peers.py's scheme: the
other side stopped and 2 s idle before each run, prefix caches emptied before each
workload); medians of
``--repeats``.

With batch_8 and batch_8_prompt both run, each side's batch-8 decode step is what the
63 steps after the first token add to the prompt pass, repeat by repeat (the medians
under "decode_step_ms"); beside it, the share of the memory's read bandwidth that step
uses: the bytes of weights a step reads (every matrix and the LM head, bfloat16; an
untied embedding's table left out) per step time, over the bandwidth of a bfloat16 sum
over 1 GiB measured in this process before and after the runs (both sides stopped).

Usage: .venv/bin/python benchmarks/bench_families.py --vllm-python PATH [--repeats 3]
           [--families ...] [--out PATH]
Writes benchmarks/results/families.json. The checkpoints (2-2.5 GB each) are written
once under the radixlm cache (``bench-models/``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "peers"))
from bench_moe import RandomModelSide, models_root, process_memory  # noqa: E402
from bench_peers import SideProcess, process_tree, run_alone  # noqa: E402
from gpu_check import LLAMA_1B  # noqa: E402
from workloads import METRICS, Call, Workload, save, serve  # noqa: E402

from radixlm.runtime.models import write_random_model  # noqa: E402

RESULTS = HERE / "results" / "families.json"


def _layer_types(layers: int, every: int) -> list[str]:
    """Every ``every``-th layer global, the others sliding (Gemma's pattern)."""
    return [
        "full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(layers)
    ]


GEMMA = {"hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256, "head_dim": 256}
FAMILIES: dict[str, dict] = {
    "llama-3.2-1b": {"architectures": ["LlamaForCausalLM"], **LLAMA_1B},
    "gemma-3-1b": {
        "architectures": ["Gemma3ForCausalLM"], **GEMMA,
        "vocab_size": 262144, "hidden_size": 1152, "intermediate_size": 6912,
        "num_hidden_layers": 26, "num_attention_heads": 4, "num_key_value_heads": 1,
        "sliding_window": 512, "sliding_window_pattern": 6, "layer_types": _layer_types(26, 6),
        "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0,
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
    },
    "gemma-2-1b": {
        "architectures": ["Gemma2ForCausalLM"], **GEMMA,
        "vocab_size": 256000, "hidden_size": 1536, "intermediate_size": 4608,
        "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
        "sliding_window": 4096, "layer_types": _layer_types(26, 2),
        "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
        "rope_theta": 10_000.0, "max_position_embeddings": 8192, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
    },
    "phi-4-mini-1b": {
        "architectures": ["Phi3ForCausalLM"],
        "vocab_size": 200064, "hidden_size": 3072, "intermediate_size": 8192,
        "num_hidden_layers": 6, "num_attention_heads": 24, "num_key_value_heads": 8,
        "head_dim": 128, "partial_rotary_factor": 0.75, "hidden_act": "silu",
        "rope_theta": 10_000.0, "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096,
        "rope_scaling": {
            "type": "longrope",
            "short_factor": [1.0 + 0.02 * i for i in range(48)],
            "long_factor": [1.0 + 0.8 * i for i in range(48)],
        },
        "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "sliding_window": None,
    },
}  # fmt: skip
WORKLOADS = (
    "single_stream", "batch_8", "batch_8_prompt", "batch_32", "prefill_1000", "few_shot_one_call",
)  # fmt: skip
BATCH_8_REQUESTS = 8
BATCH_8_NEW = 64  # batch_8's new tokens a request: the first from the prompt pass
DEFAULT_WORKLOADS = ("single_stream", "batch_32")
# radixlm's sides: its defaults, and (Llama-shaped layers only take them) without the C++
# few-row layer kernels, to tell their share of a Llama pass from the eager layers'
RADIX_SIDES = {
    "radixlm": {"dtype": "bfloat16"},
    "radixlm_eager_layers": {"dtype": "bfloat16", "cpu_layer_kernels": False},
}


def model_dir(family: str) -> Path:
    path = models_root() / f"{family}-shape"
    if not (path / "model.safetensors.index.json").is_file():
        print(f"writing {path} ...", flush=True)
        write_random_model(path, FAMILIES[family])
    return path


def make_workloads(vocab: int) -> list[Workload]:
    rng = random.Random(1)
    top = min(vocab, 30000)

    def words(n: int) -> list[int]:
        return [rng.randrange(3, top) for _ in range(n)]

    prompts = [words(rng.randint(90, 110)) for _ in range(32)]
    shots = words(90)
    return [
        Workload("single_stream", [Call(prompts[:1], 128, forced=True)], "out"),
        Workload("batch_8", [Call(prompts[:BATCH_8_REQUESTS], BATCH_8_NEW, forced=True)], "out"),
        Workload("batch_8_prompt", [Call(prompts[:BATCH_8_REQUESTS], 1, forced=True)], "seconds"),
        Workload("batch_32", [Call(prompts, 64, forced=True)], "out"),
        Workload("prefill_1000", [Call([words(1000)], 1, forced=True)], "prompt"),
        Workload(
            "few_shot_one_call",
            [Call([shots + words(10) for _ in range(32)], 16, forced=True)],
            "seconds",
        ),
    ]


def faster(workload: str, radixlm: float, vllm: float) -> float:
    """radixlm's speed over vLLM's: a rate's ratio, or a time's inverse."""
    return radixlm / vllm if METRICS[workload][1] else vllm / radixlm


def decode_steps_ms(runs: dict[str, list[float]]) -> list[float]:
    """Each repeat's batch-8 decode step (ms): batch_8's seconds less its prompt pass's,
    over the steps after the first token."""
    out_tokens = BATCH_8_REQUESTS * BATCH_8_NEW
    return [
        (out_tokens / rate - prompt) / (BATCH_8_NEW - 1) * 1e3
        for rate, prompt in zip(runs["batch_8"], runs["batch_8_prompt"])
    ]


def step_bytes(family: str) -> int:
    """Bytes of bfloat16 weights one decode step reads: all but an untied embedding's."""
    config = FAMILIES[family]
    embedding = 0 if config["tie_word_embeddings"] else config["vocab_size"] * config["hidden_size"]
    return 2 * (parameters(family) - embedding)


def quiet_bandwidth(procs: dict[str, SideProcess]) -> float:
    """The memory's read bandwidth as bench_moe.py measures it (torch imported here),
    every side stopped meanwhile."""
    from bench_moe import bandwidth

    for proc in procs.values():
        proc.pause()
    return bandwidth()


def parameters(family: str) -> int:
    from safetensors import safe_open

    total = 0
    for file in model_dir(family).glob("*.safetensors"):
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                shape = f.get_slice(name).get_shape()
                total += math.prod(shape)
    return total


def tree_memory(pid: int) -> dict[str, float]:
    """process_memory summed over ``pid`` and its descendants (vLLM holds the model in
    its engine-core worker, a child of the process that answers); VmHWM summed is an
    upper bound of the peak."""
    total: dict[str, float] = {}
    for current in process_tree(pid):
        try:
            for key, mb in process_memory(current).items():
                total[key] = total.get(key, 0.0) + mb
        except OSError:
            continue
    return total


def measure_family(family: str, args: argparse.Namespace, scratch: Path) -> dict:
    """Both sides of one family, loaded together, alternating; medians and memory."""
    path = model_dir(family)
    workload_file = scratch / f"{family}.json"
    save(make_workloads(FAMILIES[family]["vocab_size"]), workload_file)
    commands = {
        side: [
            sys.executable, __file__, "--side", side, "--model", str(path),
            "--workload-file", str(workload_file),
        ]
        for side in RADIX_SIDES
    } | {
        "vllm": [
            args.vllm_python, str(HERE / "peers" / "vllm_side.py"), str(path), "bfloat16",
            str(workload_file),
        ],
    }  # fmt: skip
    procs, errors = {}, {}
    for side in args.sides:
        try:
            procs[side] = SideProcess(commands[side], dict(os.environ))
        except RuntimeError as e:  # a family the side does not serve: recorded, not fatal
            errors[side] = str(e)
            print(f"{family}: {side} did not start: {e}", flush=True)
    runs: dict[str, dict[str, list[float]]] = {s: {w: [] for w in args.workloads} for s in procs}
    split = {"batch_8", "batch_8_prompt"} <= set(args.workloads)
    bandwidths = [quiet_bandwidth(procs)] if split else []
    try:
        for _ in range(args.repeats):
            for workload in args.workloads:
                for side in procs:
                    runs[side][workload].append(run_alone(procs, side, workload))
                print(family, workload, {s: runs[s][workload][-1] for s in procs}, flush=True)
    finally:  # a stopped side would never read the end of its input
        for proc in procs.values():
            proc.resume()
    memory = {side: tree_memory(proc.proc.pid) for side, proc in procs.items()}
    for proc in procs.values():
        proc.close()
    medians = {s: {w: statistics.median(v) for w, v in by_w.items()} for s, by_w in runs.items()}
    ratios = {}
    if "radixlm" in medians and "vllm" in medians:
        ratios = {w: faster(w, medians["radixlm"][w], medians["vllm"][w]) for w in args.workloads}
    decode = {}
    if split:
        bandwidths.append(quiet_bandwidth(procs))
        gb_s = statistics.mean(bandwidths)
        for side in procs:
            steps = decode_steps_ms(runs[side])
            step = statistics.median(steps)
            decode[side] = {
                "steps_ms": steps,
                "median_ms": step,
                "bandwidth_share": step_bytes(family) / (step / 1e3) / (gb_s * 1e9),
            }
        print(f"{family}: bandwidth {bandwidths[0]:.1f} / {bandwidths[1]:.1f} GB/s; batch-8 "
              + ", ".join(f"{s} step {d['median_ms']:.1f} ms ({d['bandwidth_share']:.0%} of it)"
                          for s, d in decode.items()), flush=True)  # fmt: skip
    return {
        "parameters": parameters(family),
        "medians": medians,
        "ratios_radixlm_over_vllm": ratios,
        "decode_step_ms": decode,
        "bandwidth_gb_s": bandwidths,
        "runs": runs,
        "memory_mb": memory,
        "errors": errors,
    }


def print_table(results: dict[str, dict], sides: list[str], workloads: list[str]) -> None:
    print(f"{'family':15} {'params':>7} {'workload':18}" + "".join(f"{s:>22}" for s in sides))
    for family, r in results.items():
        for w in workloads:
            row = f"{family:15} {r['parameters'] / 1e9:6.2f}B {w:18}"
            for side in sides:
                v = r["medians"].get(side, {}).get(w)
                row += f"{v:22.2f}" if v is not None else f"{'-':>22}"
            ratio = r["ratios_radixlm_over_vllm"].get(w)
            print(row + (f"  radixlm / vLLM {ratio:.2f}x" if ratio is not None else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", choices=list(FAMILIES), default=list(FAMILIES))
    parser.add_argument("--sides", nargs="+", choices=(*RADIX_SIDES, "vllm"),
                        default=["radixlm", "vllm"])  # fmt: skip
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS,
                        default=list(DEFAULT_WORKLOADS))  # fmt: skip
    parser.add_argument("--vllm-python", default="", help="python of vLLM's own venv")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--side", choices=RADIX_SIDES, help=argparse.SUPPRESS)  # child
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--workload-file", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        return serve(RandomModelSide(str(args.model), **RADIX_SIDES[args.side]), args.workload_file)
    if "vllm" in args.sides and not Path(args.vllm_python).is_file():
        print("vllm: skipped (no --vllm-python given, or it does not exist)")
        args.sides.remove("vllm")
    scratch = tempfile.TemporaryDirectory()
    results = {f: measure_family(f, args, Path(scratch.name)) for f in args.families}
    print_table(results, args.sides, args.workloads)
    report = {
        "dtype": "bfloat16",
        "repeats": args.repeats,
        "workloads": args.workloads,
        "families": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
