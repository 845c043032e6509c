"""Memory while loading: each weight storage's peak resident memory during the load
against the weights it ends up holding (the target: peak <= 1.3x the weights).

Storages (``--storages``; a shape each, random weights from ``write_random_model``):

  dense-*   a Qwen3 decoder of Llama-3.2-1B's width (hidden 2048, MLP 8192, 32 / 8
            heads of 64, vocabulary 128,256 tied), ``--dense-layers`` layers
  moe-*     Qwen3-30B-A3B's shape (``bench_moe.py``: 128 experts of 768, vocabulary
            151,936 untied), ``--moe-layers`` layers

  float32, bfloat16      the bfloat16 checkpoint loaded in that dtype
  int8, int4             quantized at load (``quantization=``, int4 in groups of 32)
  gguf-q4_0, gguf-q8_0   a GGUF of the checkpoint (``gguf_stream.py``: layer matrices
                         Q4_0 or Q8_0, vocabulary Q8_0), served at its precision
  ct-w4a16, ct-w8a16     compressed-tensors pack-quantized, 4-bit in groups of 128 /
                         8-bit in groups of 32 (int4 codes / int8 groups), written by
                         the ``compressed-tensors`` package's compressor
  fp8                    compressed-tensors FP8 per channel (a float layer)

Each load runs in a fresh process (``--child``) that imports torch and radixlm, opens
the model's source, then records its baseline; everything reported is above that
baseline (so the interpreter, torch's libraries and the import-time heap are not
counted). The parent samples the child's /proc status every ``--poll-ms`` for the
peak of RssAnon (anonymous memory: what the loader allocates; a sampled peak, so
spikes shorter than the period may be missed); the child resets its VmHWM after the
baseline (``/proc/self/clear_refs`` 5), so the peak of VmRSS is exact. VmRSS also
counts the checkpoint's file pages while they are mapped (safetensors and GGUF files
are read through mmap): clean page cache the kernel can drop, which no process holds.
The target is judged on RssAnon.

The weights: the model's parameters and buffers (``resident_bytes``) plus the copies
its kernels read beside them (``Linear.packed``: oneDNN's blocked layout of a float
weight, kept beside the weight on CPUs with oneDNN); the ratio is peak RssAnon over
that sum.

Usage: .venv/bin/python benchmarks/bench_load_memory.py [--storages ...]
           [--dense-layers 4] [--moe-layers 2] [--out PATH]
Writes benchmarks/results/load_memory.json. Checkpoints are written once under the
radixlm cache (``bench-models/load-memory/``).
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from bench_moe import QWEN3_30B_A3B  # noqa: E402

from radixlm.runtime.model_store import cache_root  # noqa: E402
from radixlm.runtime.models import write_random_model  # noqa: E402

RESULTS = HERE / "results" / "load_memory.json"
TARGET = 1.3
GB = 1e9
DENSE_1B_WIDTH = {
    "architectures": ["Qwen3ForCausalLM"],
    "vocab_size": 128256,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500_000.0,
    "tie_word_embeddings": True,
}
# storage suffix -> what the child loads: (source kind, dtype, quantization)
STORAGES = {
    "float32": ("float", "float32", None),
    "bfloat16": ("float", "bfloat16", None),
    "int8": ("float", "bfloat16", "int8"),
    "int4": ("float", "bfloat16", "int4"),
    "gguf-q4_0": ("gguf-q4_0", "bfloat16", None),
    "gguf-q8_0": ("gguf-q8_0", "bfloat16", None),
    "ct-w4a16": ("ct-w4a16", "bfloat16", None),
    "ct-w8a16": ("ct-w8a16", "bfloat16", None),
    "fp8": ("fp8", "bfloat16", None),
}
DEFAULT_STORAGES = [
    *(f"dense-{s}" for s in STORAGES),
    "moe-bfloat16",
    "moe-int8",
    "moe-int4",
    "moe-gguf-q4_0",
    "moe-ct-w4a16",
]


# ---- checkpoints ----------------------------------------------------------------------


def models_root() -> Path:
    return cache_root() / "bench-models" / "load-memory"


def float_dir(shape: str, layers: int) -> Path:
    config = DENSE_1B_WIDTH if shape == "dense" else QWEN3_30B_A3B
    path = models_root() / f"{shape}-{layers}l-bf16"
    if not (path / "model.safetensors.index.json").is_file():
        print(f"writing {path} ...", flush=True)
        write_random_model(path, {**config, "num_hidden_layers": layers})
    return path


def source(shape: str, layers: int, kind: str) -> Path:
    """The file or directory a storage loads, written once."""
    floats = float_dir(shape, layers)
    if kind == "float":
        return floats
    if kind.startswith("gguf-"):
        return _gguf(floats, kind.removeprefix("gguf-"))
    path = floats.with_name(f"{floats.name}-{kind}")
    if not (path / "model.safetensors.index.json").is_file():
        print(f"writing {path} ...", flush=True)
        _write_compressed(floats, path, *CT_SCHEMES[kind])
    return path


def _gguf(floats: Path, matrix_type: str) -> Path:
    import gguf
    from gguf_stream import write_moe_gguf

    path = floats.with_name(f"{floats.name}-{matrix_type}.gguf")
    if not path.is_file():
        print(f"writing {path} ...", flush=True)
        kind = gguf.GGMLQuantizationType[matrix_type.upper()]
        write_moe_gguf(floats, path, matrix_type=kind, vocab_type=gguf.GGMLQuantizationType.Q8_0)
    return path


# compressed-tensors format and weight arguments of each checkpoint storage
CT_SCHEMES: dict[str, tuple[str, dict]] = {
    "ct-w4a16": (
        "pack-quantized",
        {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 128},
    ),
    "ct-w8a16": (
        "pack-quantized",
        {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32},
    ),
    "fp8": (
        "float-quantized",
        {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel"},
    ),
}


def _write_compressed(floats: Path, path: Path, fmt: str, args: dict) -> None:
    """A compressed-tensors checkpoint of ``floats``, shard by shard, each linear
    weight (not the vocabulary, norms or routers) compressed by the package's own
    compressor."""
    from radixlm.runtime.model_store.transformers_compat import import_hub_kernels

    import_hub_kernels()  # compressed_tensors imports transformers
    from compressed_tensors.compressors.base import BaseCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from compressed_tensors.quantization.utils.helpers import calculate_qparams
    from safetensors.torch import load_file, save_file

    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**args))
    compressor = BaseCompressor.get_value_from_registry(fmt)
    part = path.with_name(path.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    part.mkdir(parents=True)
    weight_map: dict[str, str] = {}
    for file in sorted(floats.glob("*.safetensors")):
        tensors = load_file(file)
        for name in [n for n, t in tensors.items() if _quantized(n, t.dim())]:
            w = tensors.pop(name)
            low, high = _ranges(w.float(), args)
            scale, zero_point = calculate_qparams(low, high, scheme.weights)
            state = {"weight": w, "weight_scale": scale.to(w.dtype)}
            compressed = compressor.compress(state, scheme)
            module = name.removesuffix(".weight")
            tensors.update({f"{module}.{k}": v.contiguous() for k, v in compressed.items()})
        save_file(tensors, str(part / file.name))
        weight_map |= dict.fromkeys(tensors, file.name)
        del tensors
    for extra in floats.iterdir():
        if extra.suffix != ".safetensors" and extra.name != "model.safetensors.index.json":
            shutil.copy(extra, part / extra.name)
    config = json.loads((part / "config.json").read_text())
    groups = {"group_0": {"targets": ["Linear"], **scheme.model_dump(exclude={"targets"})}}
    config["quantization_config"] = json.loads(
        json.dumps(
            {
                "quant_method": "compressed-tensors",
                "format": fmt,
                "quantization_status": "compressed",
                "config_groups": groups,
                "ignore": ["lm_head"],
            },
            default=str,
        )
    )
    (part / "config.json").write_text(json.dumps(config, indent=1))
    index = {"metadata": {}, "weight_map": weight_map}
    (part / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    part.rename(path)


def _quantized(name: str, dims: int) -> bool:
    """A linear weight a quantizer converts: not the vocabulary, norms or routers."""
    vocabulary = "embed_tokens" in name or name.startswith("lm_head")
    router = name.endswith(("mlp.gate.weight", "shared_expert_gate.weight"))
    return dims == 2 and name.endswith(".weight") and not vocabulary and not router


def _ranges(w, args: dict):  # noqa: ANN001, ANN202
    """(min, max) over what one scale covers (a row, or a group of a row)."""
    if args["strategy"] == "channel":
        return w.amin(1, keepdim=True), w.amax(1, keepdim=True)
    grouped = w.reshape(w.shape[0], -1, args["group_size"])
    return grouped.amin(-1), grouped.amax(-1)


# ---- one load, in a child process -----------------------------------------------------


def _status(pid: int | str = "self") -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon, RssFile of a process, bytes."""
    wanted = ("VmRSS", "VmHWM", "RssAnon", "RssFile")
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in wanted:
            found[key] = int(value.split()[0]) * 1024
    return found


def child(path: Path, dtype_name: str, quantization: str | None) -> None:
    """Loads the model and prints one JSON line: the baseline and after-load status,
    the load's VmHWM, the weights' bytes. Prints "baseline" when the load starts."""
    import torch

    from radixlm.runtime.layers.linear import Linear
    from radixlm.runtime.layers.quantization import Quantization
    from radixlm.runtime.model_store import resolve_model_source
    from radixlm.runtime.models.build import build_model, resident_bytes
    from radixlm.runtime.models.config import ArchConfig

    torch.set_num_threads(2)
    model_source = resolve_model_source(path)
    arch = ArchConfig.from_model_dir(model_source.model_dir)
    quant = None if quantization is None else Quantization(quantization, 32)  # type: ignore[arg-type]
    dtype = getattr(torch, dtype_name)
    gc.collect()
    baseline = _status()
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    print("baseline", flush=True)
    start = time.perf_counter()
    # no attention backend: loading never calls one
    model, stored = build_model(model_source, None, dtype, "cpu", arch, quant)  # type: ignore[arg-type]
    seconds = time.perf_counter() - start
    gc.collect()
    after = _status()
    packed = {
        id(m.packed): m.packed.nbytes
        for m in model.modules()
        if isinstance(m, Linear) and m.packed is not None
    }
    report = {
        "baseline": baseline,
        "after": after,
        "stored": stored,
        "load_s": seconds,
        "weight_bytes": resident_bytes(model),
        "packed_bytes": sum(packed.values()),
    }
    print(json.dumps(report), flush=True)


def measure(path: Path, dtype: str, quantization: str | None, poll_ms: float) -> dict:
    """Runs ``child`` and samples its RssAnon from the baseline on; the figures in GB."""
    cmd = [sys.executable, __file__, "--child", str(path), "--dtype", dtype]
    if quantization:
        cmd += ["--quantization", quantization]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    peak_anon = 0
    while proc.poll() is None:
        if "baseline\n" in lines:
            try:
                peak_anon = max(peak_anon, _status(proc.pid)["RssAnon"])
            except (FileNotFoundError, KeyError, ProcessLookupError):
                break
        time.sleep(poll_ms / 1000)
    reader.join()
    if proc.wait() != 0 != 0:
        raise RuntimeError(f"the load of {path} failed (exit {proc.returncode})")
    report = json.loads(lines[-1])
    base, after = report["baseline"], report["after"]
    held = report["weight_bytes"] + report["packed_bytes"]
    peak_anon = max(peak_anon, after["RssAnon"]) - base["RssAnon"]
    return {
        "stored": report["stored"],
        "load_s": round(report["load_s"], 1),
        "weights_gb": report["weight_bytes"] / GB,
        "packed_copies_gb": report["packed_bytes"] / GB,
        "held_gb": held / GB,
        "peak_anon_gb": peak_anon / GB,
        "peak_rss_gb": (after["VmHWM"] - base["VmRSS"]) / GB,
        "after_anon_gb": (after["RssAnon"] - base["RssAnon"]) / GB,
        "ratio_anon": peak_anon / held,
        "ratio_rss": (after["VmHWM"] - base["VmRSS"]) / held,
        "baseline_rss_gb": base["VmRSS"] / GB,
    }


# ---- the table --------------------------------------------------------------------------


def _row(name: str, r: dict) -> str:
    mark = "" if r["ratio_anon"] <= TARGET else "  over"
    return (
        f"{name:<20} {r['held_gb']:7.2f} {r['packed_copies_gb']:7.2f} {r['peak_anon_gb']:8.2f} "
        f"{r['ratio_anon']:6.2f} {r['peak_rss_gb']:8.2f} {r['ratio_rss']:6.2f} "
        f"{r['load_s']:6.1f}  {r['stored']}{mark}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--storages", nargs="+", default=DEFAULT_STORAGES)
    parser.add_argument("--dense-layers", type=int, default=4)
    parser.add_argument("--moe-layers", type=int, default=2)
    parser.add_argument("--poll-ms", type=float, default=5.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--dtype", default="bfloat16", help=argparse.SUPPRESS)
    parser.add_argument("--quantization", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, args.dtype, args.quantization)
        return
    layers: dict[str, int] = {"dense": args.dense_layers, "moe": args.moe_layers}
    results: dict[str, dict] = {}
    print(
        f"{'storage':<20} {'weights':>7} {'of them':>7} {'peak':>8} {'ratio':>6} "
        f"{'peak':>8} {'ratio':>6} {'load':>6}\n"
        f"{'':<20} {'GB':>7} {'packed':>7} {'anon GB':>8} {'':>6} {'RSS GB':>8} {'RSS':>6} "
        f"{'s':>6}",
        flush=True,
    )
    for name in args.storages:
        shape, _, storage = name.partition("-")
        kind, dtype, quantization = STORAGES[storage]
        path = source(shape, layers[shape], kind)
        results[name] = measure(path, dtype, quantization, args.poll_ms)
        print(_row(name, results[name]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "cpu": _cpu(),
        "layers": layers,
        "target": TARGET,
        "poll_ms": args.poll_ms,
        "judged_on": "peak RssAnon above the child's baseline / (parameters + buffers + "
        "packed kernel copies)",
    }
    args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    print(f"wrote {args.out}")


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


if __name__ == "__main__":
    main()
