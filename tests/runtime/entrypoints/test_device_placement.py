"""Device placement through the code paths a GPU takes, run on the CPU: the device
choice, the KV pool sized from (mocked) GPU memory, the Triton backend in a whole
engine (through Triton's interpreter), the placement report, and one host copy of
the results per step. A tiny random-weight model: no download."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import torch

from radixlm.runtime import device as device_module
from radixlm.runtime.attention import TorchAttentionBackend, TritonAttentionBackend
from radixlm.runtime.config import ConfigError, EngineConfig
from radixlm.runtime.device import resolve_device, to_device, to_host
from radixlm.runtime.entrypoints import assembly
from radixlm.runtime.entrypoints.assembly import Placement, build_runtime
from radixlm.runtime.executor import model_runner, model_shard
from radixlm.runtime.executor.cuda_graph import EagerReplay
from radixlm.runtime.layers.quantization import Quantization
from radixlm.runtime.mem_cache.kv_pool import KVPool, ReqToTokenTable
from radixlm.runtime.models import ArchConfig, build, load_model, write_random_model
from tests.conftest import assert_no_leaks
from tests.runtime.models.helpers import TINY

CONFIG = TINY  # head dim 16
# The C++ few-row kernels would take every pass of this tiny model: off, so the
# attention backends serve them.
OPTIONS = {
    "max_total_tokens": 512,
    "cpu_layer_kernels": False,
    "device": "cpu",
    "dtype": "float32",
}
PROMPTS = [[5, 9, 14, 20, 3], [7, 3, 3, 8, 20, 1, 44, 60, 61], [11, 12]]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_random_model(tmp_path_factory.mktemp("tiny"), CONFIG, torch.float32, seed=3)


def test_auto_is_the_gpu_when_torch_sees_one(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu" and resolve_device("cpu") == "cpu"
    with pytest.raises(ValueError, match="device 'cuda': torch sees no GPU here"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == "cuda" and resolve_device("cuda") == "cuda"
    assert EngineConfig().device == "auto"


def test_cuda_without_a_gpu_is_a_config_error(model_dir, monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    config = EngineConfig.from_kwargs(model_path=str(model_dir), device="cuda")
    with pytest.raises(ConfigError, match="device 'cuda': torch sees no GPU here"):
        build_runtime(config)


def test_host_tensors_stay_put_on_the_cpu() -> None:
    t = torch.arange(3)
    assert to_device(t, torch.device("cpu")) is t
    a, b = to_host(t, t + 1)
    assert a is t and torch.equal(b, t + 1)


def test_the_gpu_pool_takes_what_mem_fraction_static_leaves(monkeypatch) -> None:
    """SGLang's rule: weights + pool = fraction x total, less what is already in use."""
    gib = 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (70 * gib, 80 * gib))
    # 0.85 x 80 = 68 GiB; 10 GiB in use, 2 GiB of weights: 56 GiB of 1 MiB slots.
    assert model_shard._gpu_kv_slots(0.85, 2 * gib, 2**20) == 56 * 1024
    with pytest.raises(ConfigError, match="mem_fraction_static 0.1 leaves no room"):
        model_shard._gpu_kv_slots(0.1, 2 * gib, 2**20)


def test_grammar_mask_threads_are_one_on_the_cpu_and_the_spare_cores_on_a_gpu(
    monkeypatch,
) -> None:
    """None: the CPU's cores are the model's; a GPU engine's host cores, less the
    engine loop's, at most MAX_AUTO_MASK_THREADS; a number is kept."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    auto = EngineConfig()
    assert assembly._mask_threads(auto, "cpu") == 1
    assert assembly._mask_threads(auto, "cuda:0") == assembly.MAX_AUTO_MASK_THREADS == 4
    assert assembly._mask_threads(EngineConfig.from_kwargs(tp_size=8), "cuda:0") == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(3)))
    assert assembly._mask_threads(auto, "cuda:0") == 2
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(1)))
    assert assembly._mask_threads(auto, "cuda:0") == 1
    assert assembly._mask_threads(EngineConfig.from_kwargs(grammar_mask_threads=6), "cpu") == 6


@pytest.mark.parametrize("method", [None, "int8"])
def test_the_weight_count_is_the_loaded_models(model_dir, method) -> None:
    arch = ArchConfig.from_model_dir(model_dir)
    pool = KVPool(arch.num_layers, 4, arch.num_kv_heads, arch.head_dim, torch.float32)
    backend = TorchAttentionBackend(pool, ReqToTokenTable(1, 4), arch.attention_scale)
    quantization = Quantization(method) if method else None
    dtype = torch.bfloat16 if method else torch.float32
    model = load_model(model_dir, backend, dtype, config=arch, quantization=quantization)
    loaded = build.resident_bytes(model)
    assert loaded == sum(t.nbytes for t in {*model.parameters(), *model.buffers()})
    assert build.weight_bytes(arch, dtype, quantization) == loaded
    if method is None:
        assert build.weight_bytes(arch, torch.bfloat16, None) == loaded // 2


def _greedy(model_dir: Path, **options) -> tuple[list[list[int]], object]:
    import radixlm

    with radixlm.Engine(model_path=str(model_dir), **{**OPTIONS, **options}) as eng:
        params = {"max_new_tokens": 6, "temperature": 0.0, "ignore_eos": True}
        outs = eng.generate(input_ids=PROMPTS, sampling_params=params)
        # a second round on cached prefixes: extend passes over the pool
        again = eng.generate(input_ids=[p + [2, 3] for p in PROMPTS], sampling_params=params)
        assert_no_leaks(eng)
        stats = eng.get_stats()
    return [o["output_ids"] for o in outs + again], stats


def test_an_engine_on_the_triton_backend_generates_what_torch_does(model_dir, caplog) -> None:
    with caplog.at_level(logging.INFO, logger=assembly.__name__):
        triton_ids, stats = _greedy(model_dir, attention_backend="triton")
    torch_ids, torch_stats = _greedy(model_dir, attention_backend="torch")
    assert triton_ids == torch_ids
    weights = stats.placement.weight_bytes
    assert weights > 0 and torch_stats.placement.weight_bytes == weights
    arch = ArchConfig.from_model_dir(model_dir)
    per_token = 2 * arch.num_layers * arch.num_kv_heads * arch.head_dim * 4  # float32 K, V
    kv = {"kv_format": "float32", "kv_bytes_per_token": per_token}
    assert stats.placement == Placement("cpu", "triton", (), "float32", weights, **kv)
    assert torch_stats.placement == Placement("cpu", "torch", (), "float32", weights, **kv)
    assert "placement: Placement(device='cpu', attention_backend='triton'" in caplog.text
    assert stats.passes.eager > 0 and stats.passes.graphed == 0  # no graphs off a GPU


def test_a_step_copies_its_results_to_the_host_once(model_dir, monkeypatch) -> None:
    calls: list[int] = []

    def counting(*tensors):
        calls.append(len(tensors))
        return device_module.start_to_host(*tensors)

    monkeypatch.setattr(model_runner, "start_to_host", counting)
    import radixlm

    with radixlm.Engine(model_path=str(model_dir), **OPTIONS) as eng:
        params = {"max_new_tokens": 4, "temperature": 0.0, "ignore_eos": True}
        eng.generate(input_ids=PROMPTS, sampling_params=params)
        plain = len(calls)
        eng.generate(
            input_ids=PROMPTS, sampling_params=params, return_logprob=True, top_logprobs_num=2
        )
        steps = eng.get_stats().num_steps
    # one call per sampling pass (4 steps each, the prefill's included), all tensors at once
    assert plain == 4 and calls[:plain] == [1] * plain
    assert len(calls) - plain == 4 and set(calls[plain:]) == {4}  # ids, logprobs, top-k pair
    assert steps >= len(calls)


def test_decode_graphs_are_captured_on_a_gpu_as_configured(model_dir, monkeypatch, caplog) -> None:
    """``build_runtime``'s CUDA-graph step with the recording swapped for ``EagerReplay``:
    the sizes reach ``max_running_requests`` (``cuda_graph_max_bs`` may stop them
    sooner); off with
    ``disable_cuda_graph``, off a GPU, and with a backend that cannot be captured."""
    monkeypatch.setattr(assembly, "CudaGraphCapture", EagerReplay)
    arch = ArchConfig.from_model_dir(model_dir)
    pool = KVPool(arch.num_layers, 64, arch.num_kv_heads, arch.head_dim, torch.float32)
    table = ReqToTokenTable(4, 64)
    triton = TritonAttentionBackend(pool, table, arch.attention_scale)
    model = load_model(model_dir, triton, torch.float32, config=arch)

    def graphs(device: str, backend=triton, **options):
        config = EngineConfig.from_kwargs(model_path=str(model_dir), **options)
        return assembly._decode_graphs(config, model, backend, device)

    with caplog.at_level(logging.INFO, logger=assembly.__name__):
        captured = graphs("cuda", cuda_graph_max_bs=12, max_running_requests=64)
    assert captured is not None and captured.batch_sizes == (1, 2, 4, 8, 12)
    assert "CUDA graphs: captured decode batch sizes (1, 2, 4, 8, 12)" in caplog.text
    capped = graphs("cuda", cuda_graph_max_bs=128, max_running_requests=3)
    assert capped is not None and capped.batch_sizes == (1, 2, 3)
    every = graphs("cuda", max_running_requests=27)  # by default: every decode batch
    assert every is not None and every.batch_sizes == (1, 2, 4, 8, 16, 24, 27)
    assert graphs("cuda", disable_cuda_graph=True) is None
    assert graphs("cpu") is None
    torch_backend = TorchAttentionBackend(pool, table, arch.attention_scale)
    with caplog.at_level(logging.INFO, logger=assembly.__name__):
        assert graphs("cuda", backend=torch_backend) is None
    assert "CUDA graphs: off, as attention backend 'torch' cannot be captured" in caplog.text


def test_a_quantized_pool_on_triton_generates_what_torch_does(model_dir) -> None:
    """int8 K/V stored by the rotate-and-store launch and read by the decode and
    extend kernels (a cached prefix on the second round), as the torch backend
    stores and reads them: the same greedy tokens."""
    triton_ids, stats = _greedy(model_dir, attention_backend="triton", kv_cache_dtype="int8")
    torch_ids, _ = _greedy(model_dir, attention_backend="torch", kv_cache_dtype="int8")
    assert triton_ids == torch_ids
    assert stats.placement.kv_format == "int8"
    arch = ArchConfig.from_model_dir(model_dir)  # one byte a value, a bfloat16 scale a head
    assert stats.placement.kv_bytes_per_token == (
        2 * arch.num_layers * arch.num_kv_heads * (arch.head_dim + 2)
    )


def test_the_pool_size_follows_the_first_option_given(model_dir, monkeypatch) -> None:
    """max_total_tokens, else kv_memory_gb, else 2 GiB on a CPU and the
    mem_fraction_static rule on a GPU; "auto" is bfloat16 on a GPU."""
    gib = 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (80 * gib, 80 * gib))
    arch = ArchConfig.from_model_dir(model_dir)
    per_slot = KVPool.bytes_per_slot(
        arch.num_layers, arch.num_kv_heads, arch.head_dim, torch.float32
    )

    def slots(device: str, **options) -> int:
        config = EngineConfig.from_kwargs(model_path=str(model_dir), **options)
        return model_shard._num_kv_slots(config, arch, torch.float32, device)

    assert slots("cuda", max_total_tokens=100, kv_memory_gb=1.0) == 101  # + the padding slot
    assert slots("cuda", kv_memory_gb=1.0) == slots("cpu", kv_memory_gb=1.0) == gib // per_slot
    assert slots("cpu") == 2 * gib // per_slot
    # a quantized pool: one byte a value and a bfloat16 scale per token and head
    int8_slot = 2 * arch.num_layers * arch.num_kv_heads * (arch.head_dim + 2)
    assert slots("cpu", kv_memory_gb=1.0, kv_cache_dtype="int8") == gib // int8_slot
    weights = build.weight_bytes(arch, torch.float32)
    assert slots("cuda", mem_fraction_static=0.5) == (40 * gib - weights) // per_slot
    assert build.resolve_dtype("auto", "cuda") == torch.bfloat16
    assert build.resolve_dtype("auto", "cpu", quantized=True) == torch.bfloat16


@pytest.mark.parametrize(("native", "dtype"), [(True, torch.bfloat16), (False, torch.float32)])
def test_auto_dtype_on_a_cpu_follows_its_native_bf16(monkeypatch, caplog, native, dtype) -> None:
    monkeypatch.setattr(build, "native_bf16", lambda: native)
    with caplog.at_level(logging.INFO, logger=build.__name__):
        assert build.resolve_dtype("auto", "cpu") == dtype
    assert f"dtype auto: {str(dtype).removeprefix('torch.')}" in caplog.text
    assert build.resolve_dtype("float32", "cpu") == torch.float32  # asked for, not auto
