"""bench_mlp_chunks.py's candidates set the MLP's chunking as they say."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import bench_mlp_chunks as bench  # noqa: E402

from radixlm.runtime.layers.factory import LayerFactory  # noqa: E402
from radixlm.runtime.models import mlp  # noqa: E402


def test_a_candidate_is_the_rows_of_a_chunk_or_none(monkeypatch) -> None:
    for name in ("MLP_CHUNK_BYTES", "MLP_CHUNK_MIN_ROWS"):  # restored after the test
        monkeypatch.setattr(mlp, name, getattr(mlp, name))
    layer = mlp.MLP(32, 8192, False, "silu", LayerFactory(torch.bfloat16, "cpu"))
    x = torch.empty(1000, 32, dtype=torch.bfloat16)
    bench.use(bench.WHOLE)
    assert layer._chunk_rows(x) >= 1000
    bench.use("128")
    assert layer._chunk_rows(x) == 128
    bench.use("512")
    assert layer._chunk_rows(x) == 512
