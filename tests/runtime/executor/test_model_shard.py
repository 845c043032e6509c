"""The C++ kernel paths a model shard takes on the CPU follow the measured table's row
for the model's dtype (and the kernels' ISA), and the start-up line names fallbacks."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from radixlm.kernels.cpu import native
from radixlm.runtime.attention import CpuAttentionBackend, TorchAttentionBackend
from radixlm.runtime.config import EngineConfig
from radixlm.runtime.entrypoints import assembly
from radixlm.runtime.entrypoints.assembly import Runtime, build_runtime
from radixlm.runtime.executor import cpu_paths
from radixlm.runtime.executor.cpu_paths import (
    CPU_KINDS,
    KERNEL,
    TORCH,
    CpuPaths,
    KernelRule,
    PathsTable,
)
from radixlm.runtime.executor.model_shard import build_model_shard
from radixlm.runtime.models import write_random_model
from radixlm.runtime.models.build import resolve_model
from tests.conftest import close_after_test
from tests.runtime.executor.test_cpu_paths import entry
from tests.runtime.models.helpers import TINY

ISA = native.cpu_isa()
pytestmark = pytest.mark.skipif(ISA is None, reason="no AVX2: no C++ kernel build")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return write_random_model(tmp_path_factory.mktemp("tiny") / "model", TINY)


def _runtime(model_dir, dtype: str) -> Runtime:
    config = EngineConfig.from_kwargs(model_path=str(model_dir), max_total_tokens=256, dtype=dtype)
    return close_after_test(build_runtime(config))


def _table(float32: dict, bfloat16: dict | None) -> PathsTable:
    """Rows for this CPU's kernels under either CPU kind (AMX or not: no fallback)."""
    dtypes = {"float32": float32} | ({"bfloat16": bfloat16} if bfloat16 else {})
    return PathsTable(dict.fromkeys(CPU_KINDS, {ISA: dtypes}))


def test_the_model_dtype_picks_its_row(tiny_model, monkeypatch) -> None:
    """float32 says kernel everywhere, bfloat16 torch everywhere: each dtype's shard
    takes its own row's paths."""
    table = _table(entry(True, True, True), entry(False, False, False))
    monkeypatch.setattr(cpu_paths, "packaged_table", lambda: table)
    float32 = _runtime(tiny_model, "float32")
    assert float32.cpu_paths == CpuPaths(ISA, KERNEL, KERNEL, KERNEL, KERNEL)
    assert isinstance(float32.runner.attn_backend, CpuAttentionBackend)
    assert float32.runner.small_batch is not None
    bf16 = _runtime(tiny_model, "bfloat16")
    assert bf16.cpu_paths == CpuPaths(None)
    assert type(bf16.runner.attn_backend) is TorchAttentionBackend
    assert bf16.runner.small_batch is None


def test_a_kind_per_dtype(tiny_model, monkeypatch) -> None:
    """bfloat16 keeps its attention kernels but not the few-row layers; float32 the
    reverse of its extend kernel."""
    table = _table(entry(True, False, True), entry(True, True, False))
    monkeypatch.setattr(cpu_paths, "packaged_table", lambda: table)
    assert _runtime(tiny_model, "float32").cpu_paths == CpuPaths(ISA, KERNEL, TORCH, KERNEL, KERNEL)
    bf16 = _runtime(tiny_model, "bfloat16")
    assert bf16.cpu_paths == CpuPaths(ISA, KERNEL, KERNEL, TORCH, TORCH)
    assert bf16.runner.small_batch is None


def test_an_unmeasured_bfloat16_takes_its_float32_verdict_and_says_so(
    tiny_model, monkeypatch, caplog
) -> None:
    table = _table(entry(True, False, True), None)
    monkeypatch.setattr(cpu_paths, "packaged_table", lambda: table)
    with caplog.at_level(logging.INFO, logger=assembly.__name__):
        bf16 = _runtime(tiny_model, "bfloat16")
    why = (
        "decode_attention, extend_attention, few_row_layers: "
        f"bfloat16 not measured with the {ISA} build: its float32 verdict"
    )
    assert bf16.cpu_paths == CpuPaths(ISA, KERNEL, TORCH, KERNEL, KERNEL, notes=(why,))
    assert "decode attention kernel, extend attention torch" in caplog.text
    assert f"({why})" in caplog.text


def test_an_unmeasured_build_takes_torch_and_says_so(tiny_model, monkeypatch, caplog) -> None:
    monkeypatch.setattr(cpu_paths, "packaged_table", lambda: PathsTable({}))
    with caplog.at_level(logging.INFO, logger=assembly.__name__):
        bf16 = _runtime(tiny_model, "bfloat16")
    why = (
        "decode_attention, extend_attention, few_row_layers: "
        f"bfloat16 not measured with the {ISA} build, so the torch path"
    )
    assert bf16.cpu_paths == CpuPaths(None, notes=(why,))
    assert "CPU paths (no kernels): decode attention torch" in caplog.text
    assert f"({why})" in caplog.text


def test_the_shard_keeps_the_rule(tiny_model, monkeypatch) -> None:
    table = _table(entry(True, False, True), entry(True, True, False))
    monkeypatch.setattr(cpu_paths, "packaged_table", lambda: table)
    config = EngineConfig.from_kwargs(
        model_path=str(tiny_model), max_total_tokens=256, dtype="bfloat16"
    )
    shard = build_model_shard(config, *resolve_model(config))
    assert shard.kernel_rule == KernelRule(ISA, "bfloat16", True, True, False)


def test_the_few_row_layers_stop_where_the_table_measured_them_slower(
    tiny_model, monkeypatch, caplog
) -> None:
    row = entry(True, True, True)
    row["kinds"]["few_row_layers"]["passes"] = {
        "decode1": {"ratio": 1.4}, "decode8": {"ratio": 1.0}, "decode32": {"ratio": 0.8}
    }  # fmt: skip
    monkeypatch.setattr(cpu_paths, "packaged_table", lambda: _table(entry(True, True, True), row))
    with caplog.at_level(logging.INFO, logger=assembly.__name__):
        bf16 = _runtime(tiny_model, "bfloat16")
    small = bf16.runner.small_batch
    assert small is not None and small.max_rows == 8
    rows = [SimpleNamespace(input_ids=torch.zeros(n, dtype=torch.long)) for n in (1, 8, 9, 32)]
    assert [small.accepts(batch) for batch in rows] == [True, True, False, False]
    assert "few-row layers up to 8 rows: larger passes measured slower" in caplog.text
    assert _runtime(tiny_model, "float32").runner.small_batch.max_rows == 64
