"""Which attention backend and small-batch runner an engine gets, and what a
user is told when a C++ kernel cannot serve."""

from __future__ import annotations

import logging

import pytest
import torch

from radixlm.kernels.native import KernelBuildError
from radixlm.runtime import assembly
from radixlm.runtime.assembly import build_runtime
from radixlm.runtime.config import ConfigError, EngineConfig
from radixlm.runtime.layers import attention
from radixlm.runtime.layers.attention import CpuAttentionBackend, TorchAttentionBackend
from radixlm.runtime.model_runner import ModelRunner


def _runner(model_dir, **kwargs) -> ModelRunner:
    config = EngineConfig.from_kwargs(model_path=str(model_dir), max_total_tokens=256, **kwargs)
    return build_runtime(config).runner


def _backend(model_dir, **kwargs) -> TorchAttentionBackend:
    return _runner(model_dir, **kwargs).attn_backend


def _broken_build(build_dir):
    raise KernelBuildError("no C++ compiler found: install g++ (or set CXX)")


def test_auto_picks_the_kernel_on_cpu(default_model_dir) -> None:
    backend = _backend(default_model_dir)
    assert isinstance(backend, CpuAttentionBackend)
    assert type(_backend(default_model_dir, attention_backend="torch")) is TorchAttentionBackend


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_dtypes(default_model_dir, dtype) -> None:
    backend = _backend(default_model_dir, dtype=str(dtype).removeprefix("torch."))
    assert isinstance(backend, CpuAttentionBackend)


def test_float16_falls_back_or_is_refused(default_model_dir) -> None:
    backend = _backend(default_model_dir, dtype="float16")
    assert type(backend) is TorchAttentionBackend
    with pytest.raises(ConfigError, match=r"attention_backend 'cpu'.*torch.float16"):
        _backend(default_model_dir, dtype="float16", attention_backend="cpu")


def test_a_failed_build_falls_back_with_a_warning_or_is_refused(
    default_model_dir, monkeypatch, caplog
) -> None:
    monkeypatch.setattr(attention, "load_extend_attention", _broken_build)
    with caplog.at_level(logging.WARNING, logger=assembly.__name__):
        backend = _backend(default_model_dir)
    assert type(backend) is TorchAttentionBackend
    assert "no C++ compiler found" in caplog.text
    with pytest.raises(ConfigError, match="attention_backend 'cpu': no C\\+\\+ compiler found"):
        _backend(default_model_dir, attention_backend="cpu")


def test_cpu_layer_kernels_serve_float32_when_asked(default_model_dir) -> None:
    runner = _runner(default_model_dir)
    assert runner.small_batch is not None
    assert runner.small_batch.backend is runner.attn_backend
    layer = runner.model.model.layers[0]
    assert layer.mlp.elementwise is not None and layer.self_attn.elementwise is not None
    assert runner.model.model.norm.elementwise is not None
    off = _runner(default_model_dir, cpu_layer_kernels=False)
    assert off.small_batch is None and off.model.model.norm.elementwise is None
    bf16 = _runner(default_model_dir, dtype="bfloat16")  # the few-row kernels only
    assert bf16.small_batch is not None and bf16.small_batch.step is not None
    assert bf16.model.model.norm.elementwise is None
    assert _runner(default_model_dir, dtype="float16").small_batch is None


def test_cpu_layer_kernels_that_fail_to_build_leave_the_eager_model(
    default_model_dir, monkeypatch, caplog
) -> None:
    monkeypatch.setattr(assembly, "load_small_batch_kernels", _broken_build)
    with caplog.at_level(logging.WARNING, logger=assembly.__name__):
        runner = _runner(default_model_dir)
    assert runner.small_batch is None and runner.model.model.norm.elementwise is None
    assert "cpu_layer_kernels" in caplog.text and "no C++ compiler found" in caplog.text
