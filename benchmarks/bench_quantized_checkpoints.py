"""What serving a downloaded quantized checkpoint costs and gains: each format
(AWQ, GPTQ, compressed-tensors, FP8) against the bfloat16 model it was made from.

Checkpoints are written in each library's layout by the test suite's writers
(``tests/runtime/models/quantized_checkpoints.py``: round-to-nearest codes, min-max
scales; the compressed-tensors ones by that package's own compressors). Real AWQ and
GPTQ files choose their codes by calibration, so their quality is at least this.

  quality   perplexity of the shipped public-domain text on the default model
            (``radixlm.runtime.entrypoints.perplexity``, windows of 512), its delta
            against bfloat16's, and against the float32 twin of the file's values (what
            serving the file costs beyond the quantization itself); group sides in
            groups of 32 there (the default model's own), 128 on the speed model
  speed     a random-weight model of Llama-3.2-1B's width (``--layers`` of its 16
            layers; speed does not depend on the weights' values), each side in its own
            process: load seconds (Engine construction), single-stream decode tok/s (64
            new tokens after a 16-token prompt, less the 1-token run) and batch-32
            decode tok/s (32 prompts of 16 tokens, 33 new tokens each, less 1), medians
            of 3

Usage: .venv/bin/python benchmarks/bench_quantized_checkpoints.py [--sides ...]
           [--layers 4] [--max-windows 16] [--skip-quality] [--skip-speed]
Writes benchmarks/results/quantized_checkpoints.json.
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
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the writers live with the tests
from bench_quant import model_dir as llama_1b_dir  # noqa: E402

from radixlm.runtime.entrypoints.perplexity import DEFAULT_TEXT, measure_perplexity  # noqa: E402
from radixlm.runtime.model_store import cache_root, pull_default_model  # noqa: E402
from tests.runtime.models import quantized_checkpoints as qc  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "quantized_checkpoints.json"


def _ct(fmt: str, bits: int, kind: str, strategy: str, **more: object) -> Callable:
    args = {"num_bits": bits, "type": kind, "symmetric": True, "strategy": strategy, **more}
    return lambda src, dst, ref=False: qc.write_compressed_tensors(
        src, dst, fmt, args, reference=ref
    )


# side -> writer(float dir, destination); None: the float model itself
SIDES: dict[str, Callable | None] = {
    "bfloat16": None,
    "AWQ 4-bit g128": lambda s, d, ref=False: qc.write_awq(s, d, 128, reference=ref),
    "GPTQ 4-bit g128": lambda s, d, ref=False: qc.write_gptq(s, d, 4, 128, reference=ref),
    "GPTQ 8-bit g128": lambda s, d, ref=False: qc.write_gptq(s, d, 8, 128, reference=ref),
    "CT W4A16 g128": _ct("pack-quantized", 4, "int", "group", group_size=128),
    "CT W8A16 channel": _ct("pack-quantized", 8, "int", "channel"),
    "CT W8A8 int8": _ct("int-quantized", 8, "int", "channel"),
    "CT W8A8 FP8 channel": _ct("float-quantized", 8, "float", "channel"),
    "FP8 128x128 blocks": lambda s, d, ref=False: qc.write_fp8_blocks(s, d, (128, 128), ref),
}


def _quality_writer(side: str) -> Callable | None:
    """The side's writer for the default model: its group sides in groups of 32, the
    default model's own (its float weights are its Q4_1 GGUF dequantized: groups of 32;
    any other size straddles them, docs/quantization.md)."""
    if side == "bfloat16":
        return None
    if "g128" not in side:
        return SIDES[side]
    if side.startswith("AWQ"):
        return lambda s, d, ref=False: qc.write_awq(s, d, 32, reference=ref)
    if side.startswith("GPTQ"):
        bits = int(side.split()[1][0])
        return lambda s, d, ref=False: qc.write_gptq(s, d, bits, 32, reference=ref)
    return _ct("pack-quantized", 4, "int", "group", group_size=32)


def written(side: str, source: Path, root: Path, writer: Callable | None) -> Path:
    """The side's checkpoint of ``source`` (written once under ``root``)."""
    if writer is None:
        return source
    path = root / side.replace(" ", "_")
    if not (path / "config.json").is_file():
        shutil.rmtree(path, ignore_errors=True)
        writer(source, path)
    return path


def quality(sides: list[str], max_windows: int) -> dict[str, dict[str, float]]:
    """Perplexity of each side served, and of its float twin: a float32 checkpoint of
    the values the file stands for (what serving the file costs beyond them)."""
    import radixlm

    source = pull_default_model(progress=False)
    text = DEFAULT_TEXT.read_text(encoding="utf-8")

    def perplexity(path: Path, options: dict) -> float:
        with radixlm.Engine(model_path=str(path), max_total_tokens=8192, **options) as eng:
            return measure_perplexity(eng, text, 512, max_windows).perplexity

    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        base = perplexity(source, {"dtype": "bfloat16"})
        results["bfloat16"] = {"served": base}
        print(f"{'bfloat16':22} perplexity {base:.4f}", flush=True)
        for side in sides:
            writer = _quality_writer(side)
            if writer is None:
                continue
            shutil.rmtree(Path(tmp) / "file", ignore_errors=True)
            files = writer(source, Path(tmp) / "file", True)
            twin = qc.write_float_twin(files, Path(tmp) / "twin")
            served, exact = perplexity(files.path, {}), perplexity(twin, {"dtype": "float32"})
            results[side] = {"served": served, "twin": exact}
            print(
                f"{side:22} perplexity {served:.4f} ({served / base - 1:+.2%} against bfloat16;"
                f" its float32 twin {exact:.4f}, served {served / exact - 1:+.2%})",
                flush=True,
            )
    return results


def speed_side(path: Path, options: dict) -> dict:
    """Child process: one engine's figures as one JSON line."""
    import radixlm

    start = time.perf_counter()
    engine = radixlm.Engine(model_path=str(path), max_total_tokens=8192, **options)
    load_s = time.perf_counter() - start
    with engine:
        prompts = [[1000 + 37 * k + i for i in range(16)] for k in range(32)]

        def timed(ids: list, n: int) -> float:
            engine.flush_cache()
            params = {"temperature": 0, "max_new_tokens": n, "ignore_eos": True}
            begin = time.perf_counter()
            engine.generate(input_ids=ids, sampling_params=params)
            return time.perf_counter() - begin

        timed(prompts[0], 4)  # warm-up
        single = [63 / (timed(prompts[0], 64) - timed(prompts[0], 1)) for _ in range(3)]
        batch = [32 * 32 / (timed(prompts, 33) - timed(prompts, 1)) for _ in range(3)]
        placement = engine.get_stats().placement
    return {
        "load_s": load_s,
        "single_tok_s": statistics.median(single),
        "batch32_tok_s": statistics.median(batch),
        "weight_mb": placement.weight_bytes / 1e6,
        "weights": placement.weights,
    }


def speed(sides: list[str], layers: int) -> dict[str, dict]:
    source = llama_1b_dir(layers)
    root = cache_root() / "bench-models" / f"quantized-llama-1b-{layers}l"
    results = {}
    for side in sides:
        path = written(side, source, root, SIDES[side])
        options = {"dtype": "bfloat16"} if side == "bfloat16" else {}
        cmd = [sys.executable, __file__, "--child", str(path), json.dumps(options)]
        out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
        if out.returncode:
            raise SystemExit(f"{side} failed:\n{out.stderr[-3000:]}")
        r = json.loads(out.stdout.strip().splitlines()[-1])
        results[side] = r
        base = results.get("bfloat16", r)
        print(
            f"{side:22} load {r['load_s']:5.1f} s  single {r['single_tok_s']:6.1f} tok/s "
            f"({r['single_tok_s'] / base['single_tok_s']:.2f}x)  batch-32 "
            f"{r['batch32_tok_s']:7.1f} tok/s ({r['batch32_tok_s'] / base['batch32_tok_s']:.2f}x)"
            f"  {r['weight_mb']:.0f} MB  [{r['weights']}]",
            flush=True,
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sides", nargs="+", default=list(SIDES), choices=SIDES)
    parser.add_argument("--layers", type=int, default=4, help="of Llama-3.2-1B's 16")
    parser.add_argument("--max-windows", type=int, default=16)
    parser.add_argument("--skip-quality", action="store_true")
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(speed_side(Path(args.child[0]), json.loads(args.child[1]))), flush=True)
        return
    sides = ["bfloat16", *[s for s in args.sides if s != "bfloat16"]]
    # a part skipped keeps its figures from the last run
    report = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    report.update({"layers": args.layers, "max_windows": args.max_windows})
    if not args.skip_quality:
        report["perplexity"] = quality(sides, args.max_windows)
    if not args.skip_speed:
        report["speed"] = speed(sides, args.layers)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
