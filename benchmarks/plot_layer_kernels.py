"""Plots the product cases of bench_layer_kernels.py: time of all 120 layer matrices
against the number of rows, for the few-row kernel, MKL's GEMM and oneDNN's matmul
on the blocked copies; the line at 64 rows is where the runtime hands passes from the
kernel to the eager model (``radixlm.kernels.cpu.small_batch.MAX_ROWS``).

Usage: .venv/bin/python benchmarks/plot_layer_kernels.py [results/layer_kernels.json]
Needs matplotlib (``pip install -e ".[bench]"``); writes results/layer_kernels.png.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "layer_kernels.json"
LABELS = {
    "kernel": "radixlm few-row kernel",
    "torch": "MKL (F.linear)",
    "onednn": "oneDNN, blocked",
}


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else RESULTS
    seconds = json.loads(path.read_text())["seconds"]
    rows = {int(m.group(1)): sides for case, sides in seconds.items()
            if (m := re.fullmatch(r"layers, (\d+) row\(s\)", case))}  # fmt: skip
    xs = sorted(rows)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for side, label in LABELS.items():
        points = [(x, rows[x][side] * 1e3) for x in xs if side in rows[x]]
        if points:
            ax.plot(*zip(*points), marker="o", label=label)
    ax.axvline(64, color="grey", linestyle=":", label="MAX_ROWS (64)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("rows in the pass")
    ax.set_ylabel("ms, all 120 layer matrices (float32)")
    ax.set_title("Default model's layer products, 2 threads (medians)")
    ax.grid(alpha=0.3)
    ax.legend()
    out = path.with_suffix(".png")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
