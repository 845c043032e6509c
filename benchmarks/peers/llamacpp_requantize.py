"""Other llama.cpp types of a GGUF file, by llama.cpp's own quantizer (run with the
Python of llama-cpp-python's venv): what ``bench_peers.py --gguf`` compares on.

The default model's GGUF is Q4_1; requantizing it (``allow_requantize``) gives its
Q4_0 and Q4_K_M files as llama.cpp lays them out (a Q4_K_M of this model is mostly
Q5_0: K types need rows that are multiples of 256, and its rows are 576 wide).

Usage: PEER_PYTHON benchmarks/peers/llamacpp_requantize.py SOURCE.gguf OUT_DIR [TYPE ...]
TYPE: Q4_0, Q4_K_M (default both), or another of llama.cpp's LLAMA_FTYPE_MOSTLY_* names.
Writes OUT_DIR/<source stem without its type>.<TYPE>.gguf.
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import llama_cpp


def main() -> None:
    source, out_dir = Path(sys.argv[1]), Path(sys.argv[2])
    types = sys.argv[3:] or ["Q4_0", "Q4_K_M"]
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = source.stem.rsplit(".", 1)[0]
    for name in types:
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{name}")
        params.allow_requantize = True
        params.nthread = 2
        out = out_dir / f"{stem}.{name}.gguf"
        status = llama_cpp.llama_model_quantize(
            str(source).encode(), str(out).encode(), ctypes.byref(params)
        )
        if status:
            raise SystemExit(f"{name}: llama_model_quantize failed ({status})")
        print(out)


if __name__ == "__main__":
    main()
