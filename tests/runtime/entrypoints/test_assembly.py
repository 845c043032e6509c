"""Which attention backend and small-batch runner an engine gets, and what a
user is told when a C++ kernel cannot serve."""

from __future__ import annotations

import logging
import time

import pytest
import torch

from radixlm.kernels.cpu import native
from radixlm.kernels.cpu.native import KernelBuildError
from radixlm.runtime.attention import CpuAttentionBackend, TorchAttentionBackend
from radixlm.runtime.attention import cpu_kernels as attention
from radixlm.runtime.config import ConfigError, EngineConfig
from radixlm.runtime.constrained import GrammarCompiler
from radixlm.runtime.entrypoints import assembly
from radixlm.runtime.entrypoints.assembly import build_runtime
from radixlm.runtime.errors import ModelLoadError
from radixlm.runtime.executor import cpu_paths, model_shard
from radixlm.runtime.executor.cpu_paths import CPU_KINDS, KERNEL, TORCH, CpuPaths, PathsTable
from radixlm.runtime.executor.model_runner import ModelRunner
from tests.conftest import close_after_test
from tests.runtime.executor.test_cpu_paths import entry


def _runner(model_dir, **kwargs) -> ModelRunner:
    """A float32 runtime's runner unless told (auto is bfloat16 on a native-bf16 CPU)."""
    options = {"dtype": "float32", **kwargs}
    config = EngineConfig.from_kwargs(model_path=str(model_dir), max_total_tokens=256, **options)
    return close_after_test(build_runtime(config)).runner


def _backend(model_dir, **kwargs) -> TorchAttentionBackend:
    return _runner(model_dir, **kwargs).attn_backend


def _broken_build(build_dir, target):
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
    bf16 = _runner(default_model_dir, dtype="bfloat16")
    assert bf16.small_batch is not None and bf16.small_batch.step is not None
    assert bf16.model.model.norm.elementwise is not None
    assert _runner(default_model_dir, dtype="float16").small_batch is None


def test_cpu_layer_kernels_that_fail_to_build_leave_the_eager_model(
    default_model_dir, monkeypatch, caplog
) -> None:
    monkeypatch.setattr(model_shard, "load_small_batch_kernels", _broken_build)
    with caplog.at_level(logging.WARNING, logger=model_shard.__name__):
        runner = _runner(default_model_dir)
    assert runner.small_batch is None and runner.model.model.norm.elementwise is None
    assert "cpu_layer_kernels" in caplog.text and "no C++ compiler found" in caplog.text


def _paths(model_dir, **kwargs) -> CpuPaths | None:
    """The paths of a float32 runtime (auto picks bfloat16 on a CPU with native bf16)."""
    options = {"dtype": "float32", **kwargs}
    config = EngineConfig.from_kwargs(model_path=str(model_dir), max_total_tokens=256, **options)
    return close_after_test(build_runtime(config)).cpu_paths


def _row_limit_notes(isa: str) -> tuple[str, ...]:
    """The note a float32 runtime's paths carry where the packaged table bounds the
    few-row layers' passes for the ``isa`` build."""
    max_rows = cpu_paths.kernel_rule(isa, torch.float32).few_row_layers_max_rows
    if max_rows is None:
        return ()
    return (f"few-row layers up to {max_rows} rows: larger passes measured slower than the "
            "torch path",)  # fmt: skip


def test_the_chosen_paths_are_reported_and_logged(default_model_dir, caplog) -> None:
    with caplog.at_level(logging.INFO, logger=assembly.__name__):
        paths = _paths(default_model_dir)
    isa = native.cpu_isa()
    assert paths == CpuPaths(isa, KERNEL, KERNEL, KERNEL, KERNEL, notes=_row_limit_notes(isa))
    assert f"CPU paths ({native.cpu_isa()} kernels): decode attention kernel" in caplog.text
    torch_only = _paths(default_model_dir, attention_backend="torch", cpu_layer_kernels=False)
    assert torch_only == CpuPaths(None)
    bf16 = _paths(default_model_dir, dtype="bfloat16")
    assert (bf16.few_row_layers, bf16.elementwise) == (KERNEL, KERNEL)


@pytest.mark.parametrize("target", native.runnable_targets(), ids=lambda t: t.name)
def test_each_isa_build_serves_when_asked(default_model_dir, target) -> None:
    paths = _paths(default_model_dir, cpu_kernel_isa=target.name)
    notes = _row_limit_notes(target.isa)
    assert paths == CpuPaths(target.isa, KERNEL, KERNEL, KERNEL, KERNEL, notes=notes)


def test_the_rule_picks_the_torch_path_per_pass_kind(default_model_dir, monkeypatch) -> None:
    """Where the kernel is not faster for a pass kind on this ISA, "auto" takes torch
    for that kind only; "cpu" still insists on the attention kernels."""
    isa = native.cpu_isa()

    def table(decode: bool) -> PathsTable:  # this CPU's float32 rows, AMX or not
        return PathsTable(dict.fromkeys(CPU_KINDS, {isa: {"float32": entry(decode, False, False)}}))

    monkeypatch.setattr(cpu_paths, "packaged_table", lambda: table(True))
    paths = _paths(default_model_dir)
    assert paths == CpuPaths(isa, KERNEL, TORCH, TORCH, TORCH)
    assert _backend(default_model_dir).extend_kernel is None
    assert _paths(default_model_dir, attention_backend="cpu").extend_attention == KERNEL
    # the extend kernel rides on the decode one
    monkeypatch.setattr(cpu_paths, "packaged_table", lambda: table(False))
    assert type(_backend(default_model_dir)) is TorchAttentionBackend


def test_a_cpu_without_avx2_runs_the_torch_path_with_one_line(
    default_model_dir, monkeypatch, caplog
) -> None:
    monkeypatch.setattr(native, "_cpu_flags", lambda: frozenset({"sse4_2"}))
    with caplog.at_level(logging.WARNING):
        paths = _paths(default_model_dir)
    assert paths.isa is None and paths.notes
    assert (paths.decode_attention, paths.few_row_layers, paths.elementwise) == (TORCH,) * 3
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "neither AVX2 nor AVX-512" in warnings[0].getMessage()
    with pytest.raises(ConfigError, match="attention_backend 'cpu': this CPU has neither AVX2"):
        _backend(default_model_dir, attention_backend="cpu")


class _Planner:
    pass_cost = None

    def use_pass_cost(self, cost) -> None:
        self.pass_cost = cost


def _linear_timer(noisy_calls: int):
    """Pass times of a device where a verify pass costs more than the decode it replaces,
    the first ``noisy_calls`` decode passes of 8 rows slowed 20x (a busy machine)."""
    calls = {"noisy": noisy_calls}

    def time_pass(rows: int, tokens: int) -> float:
        if rows == tokens:
            seconds = 0.01 + 0.002 * rows
            if rows == 8 and calls["noisy"] > 0:
                calls["noisy"] -= 1
                seconds *= 20
            return seconds
        return 0.012 + 0.002 * rows + 0.001 * tokens

    return time_pass


@pytest.mark.parametrize("noisy_attempts, measured", [(1, True), (2, True), (3, False)])
def test_a_noisy_calibration_is_measured_again_before_the_fixed_model(
    monkeypatch, noisy_attempts, measured
) -> None:
    """Each attempt times 3 decode passes of 8 rows (the fastest counts): an attempt
    whose every one of them was slowed fits an implausible cost and is measured again;
    after 3 such attempts the planner keeps its fixed model."""
    monkeypatch.setattr(
        assembly, "scratch_pass_timer", lambda runner, ctx: _linear_timer(3 * noisy_attempts)
    )
    config = EngineConfig.from_kwargs(speculative="ngram", max_running_requests=8)
    planner = _Planner()
    assembly._calibrate_speculation(config, planner, None, "cpu", 2048)
    assert (planner.pass_cost is not None) == measured
    if measured:
        assert planner.pass_cost.decode(8) == pytest.approx(0.026)


def test_the_compile_worker_starts_before_the_model_loads_and_stops_if_it_fails(
    default_model_dir, monkeypatch
) -> None:
    """Its start (seconds of imports) overlaps the model's load, not the first passes;
    a load that fails stops it."""
    compilers: list[GrammarCompiler] = []

    class Recorded(GrammarCompiler):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            compilers.append(self)

    def failing_load(*args, **kwargs):
        deadline = time.monotonic() + 10  # its driver thread starts it: a moment
        while not compilers[0].workers.lane_pids("fast"):
            assert time.monotonic() < deadline, "the compile worker did not start"
            time.sleep(0.01)
        raise ModelLoadError("the weights are gone")

    monkeypatch.setattr(assembly, "GrammarCompiler", Recorded)
    monkeypatch.setattr(assembly, "build_model_shard", failing_load)
    config = EngineConfig.from_kwargs(model_path=str(default_model_dir), dtype="float32")
    with pytest.raises(ModelLoadError, match="the weights are gone"):
        build_runtime(config)
    assert compilers[0].workers.pids() == []
