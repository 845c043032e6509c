"""What each weight storage costs in quality, and radixlm's GGUF serving against
llama.cpp on the same file: perplexity of the shipped public-domain text
(``benchmarks/data/tempest.txt``) by llama.cpp's method
(``radixlm.runtime.entrypoints.perplexity``), the same token windows for every side.

Sides: radixlm in float32, bfloat16, int8, int4 (groups of 32 and 64) and the default
model's GGUF (Q4_1) as it is; llama.cpp (``llama-cpp-python``, ``--llama-python``) on
that GGUF, evaluated window by window with all logits (peers/llamacpp_perplexity.py).

Usage: .venv/bin/python benchmarks/bench_perplexity.py [--context 512] [--max-windows N]
           [--llama-python PATH]
Prints perplexity per side and its ratio to bfloat16's (and radixlm's GGUF to
llama.cpp's), and writes benchmarks/results/perplexity.json.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import tempfile
from pathlib import Path

import radixlm
from radixlm.runtime.entrypoints.perplexity import DEFAULT_TEXT, measure_perplexity, text_windows
from radixlm.runtime.model_store import default_gguf_path, pull_default_model

HERE = Path(__file__).parent
RESULTS = HERE / "results" / "perplexity.json"
SIDES = {
    "float32": {"dtype": "float32"},
    "bfloat16": {"dtype": "bfloat16"},
    "int8": {"quantization": "int8"},
    "int4 (group 32)": {"quantization": "int4", "quantization_group_size": 32},
    "int4 (group 64)": {"quantization": "int4", "quantization_group_size": 64},
    "GGUF Q4_1": {"quantization": "gguf"},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--max-windows", type=int, default=None)
    parser.add_argument("--llama-python", default="", help="python of llama-cpp-python's venv")
    args = parser.parse_args()
    model_dir = pull_default_model(progress=False)
    text = DEFAULT_TEXT.read_text(encoding="utf-8")
    results: dict[str, dict] = {}
    windows = None
    for name, options in SIDES.items():
        with radixlm.Engine(model_path=str(model_dir), max_total_tokens=16384, **options) as eng:
            result = measure_perplexity(eng, text, args.context, args.max_windows)
            windows = windows or text_windows(eng.tokenizer, text, args.context, args.max_windows)
        results[name] = {"perplexity": result.perplexity, "tokens": result.num_scored_tokens}
        print(f"{name:18} {result.describe()}", flush=True)
    if Path(args.llama_python).is_file():
        with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
            json.dump(windows, f)
            f.flush()
            script = str(HERE / "peers" / "llamacpp_perplexity.py")
            cmd = [args.llama_python, script, str(default_gguf_path()), f.name]
            out = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
        results["llama.cpp, GGUF Q4_1"] = {
            "perplexity": math.exp(out["nll"]),
            "tokens": out["tokens"],
        }
        print(f"llama.cpp: perplexity {math.exp(out['nll']):.4f} over {out['tokens']} tokens")
    bf16 = results["bfloat16"]["perplexity"]
    print(f"\n{'weights':24} {'perplexity':>11} {'vs bf16':>9}")
    for name, r in results.items():
        print(f"{name:24} {r['perplexity']:11.4f} {r['perplexity'] / bf16 - 1:+9.2%}")
    if "llama.cpp, GGUF Q4_1" in results:
        ours = results["GGUF Q4_1"]["perplexity"]
        theirs = results["llama.cpp, GGUF Q4_1"]["perplexity"]
        print(f"radixlm's GGUF Q4_1 vs llama.cpp's: {ours / theirs - 1:+.2%}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    report = {"context": args.context, "max_windows": args.max_windows, "sides": results}
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
