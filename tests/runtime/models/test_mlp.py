"""The gated MLP: a long pass of a float MLP on CPU goes through in row chunks
(``MLP_CHUNK_BYTES``) and computes what one pass over every row computes."""

from __future__ import annotations

import pytest
import torch

from radixlm.runtime.layers.factory import LayerFactory
from radixlm.runtime.layers.quantization import Quantization
from radixlm.runtime.models import mlp as mlp_module
from radixlm.runtime.models.mlp import MLP


def float_mlp(hidden: int, inter: int, dtype: torch.dtype) -> MLP:
    torch.manual_seed(0)
    mlp = MLP(hidden, inter, False, "silu", LayerFactory(dtype, "cpu"))
    with torch.no_grad():
        for parameter in mlp.parameters():
            parameter.normal_(0.0, 0.2)
    for linear in (mlp.gate_up_proj, mlp.down_proj):
        linear.prepare()
    return mlp


@pytest.mark.parametrize("activation", ["silu", "gelu"])
def test_a_long_pass_in_chunks_computes_what_one_pass_does(
    monkeypatch: pytest.MonkeyPatch, activation: str
) -> None:
    mlp = float_mlp(16, 24, torch.float32)
    mlp.activation = activation
    x = torch.randn(35, 16)
    whole = mlp(x)  # 48 x 4-byte gate/up values a row: 35 rows are 6,720 bytes
    calls: list[int] = []
    mlp.gate_up_proj.register_forward_hook(lambda _m, args, _out: calls.append(args[0].shape[0]))
    monkeypatch.setattr(mlp_module, "MLP_CHUNK_BYTES", 48 * 4 * 10)
    monkeypatch.setattr(mlp_module, "MLP_CHUNK_MIN_ROWS", 4)
    chunked = mlp(x)
    assert calls == [10, 10, 10, 5]
    assert chunked.shape == (35, 16)
    torch.testing.assert_close(chunked, whole)


def test_chunks_keep_a_minimum_of_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    mlp = float_mlp(16, 24, torch.float32)
    monkeypatch.setattr(mlp_module, "MLP_CHUNK_BYTES", 1)
    monkeypatch.setattr(mlp_module, "MLP_CHUNK_MIN_ROWS", 8)
    calls: list[int] = []
    mlp.gate_up_proj.register_forward_hook(lambda _m, args, _out: calls.append(args[0].shape[0]))
    mlp(torch.randn(20, 16))
    assert calls == [8, 8, 4]


@pytest.mark.parametrize(
    ("inter", "dtype", "rows"),
    [
        (8192, torch.bfloat16, 256),  # Llama-3.2-1B: 32 KB a row, 8 MiB at 256 rows
        (1536, torch.bfloat16, 1365),  # the default model
        (1536, torch.float32, 682),
        (28672, torch.bfloat16, 256),  # past 8 MiB at the minimum of rows
    ],
)
def test_chunk_rows_keep_the_gate_up_output_within_the_bytes(
    inter: int, dtype: torch.dtype, rows: int
) -> None:
    mlp = MLP(32, inter, False, "silu", LayerFactory(dtype, "cpu"))  # weights unset
    assert mlp._chunk_rows(torch.empty(5000, 32, dtype=dtype)) == rows


def test_a_quantized_mlp_takes_every_row_at_once() -> None:
    """Its linears choose their own path by rows (quant_kernel_max_rows)."""
    factory = LayerFactory(torch.bfloat16, "cpu", Quantization("int4", 32))
    mlp = MLP(64, 8192, False, "silu", factory)
    assert mlp._chunk_rows(torch.empty(5000, 64, dtype=torch.bfloat16)) == 5000
