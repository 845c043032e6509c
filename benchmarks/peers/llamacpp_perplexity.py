"""llama.cpp's perplexity of a GGUF file on given token windows, by llama.cpp's method
(each window evaluated alone from an empty cache; the second half of its positions
scored), run with the Python of llama-cpp-python's own virtual environment; imports
only llama_cpp, numpy (its dependency) and the standard library.

Usage (by bench_perplexity.py): LLAMA_PYTHON llamacpp_perplexity.py GGUF WINDOWS_JSON
Prints one JSON line: {"nll": mean negative log-likelihood, "tokens": count}.
"""

from __future__ import annotations

import json
import math
import sys

import numpy as np
from llama_cpp import Llama


def main() -> None:
    gguf_path, windows_path = sys.argv[1], sys.argv[2]
    windows: list[list[int]] = json.loads(open(windows_path).read())
    context = len(windows[0])
    llm = Llama(
        model_path=gguf_path,
        n_ctx=context,
        n_batch=context,
        n_threads=2,
        logits_all=True,
        verbose=False,
    )
    total, count = 0.0, 0
    for window in windows:
        llm.reset()
        llm.eval(window)
        # row pos - 1 predicts the token at pos, for the second half's positions
        rows = np.asarray(llm.scores[context // 2 - 1 : context - 1], dtype=np.float64)
        top = rows.max(axis=1, keepdims=True)
        log_z = top[:, 0] + np.log(np.exp(rows - top).sum(axis=1))
        targets = np.asarray(window[context // 2 : context])
        total += math.fsum(log_z - rows[np.arange(len(targets)), targets])
        count += len(targets)
    print(json.dumps({"nll": total / count, "tokens": count}))


if __name__ == "__main__":
    main()
