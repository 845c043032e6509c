"""Which backend the registry picks for a request ("auto" or a name), and what a
user is told when the named one cannot serve. Every test builds its own registry
(``default_registry()`` is fresh on each call), so nothing leaks between tests."""

from __future__ import annotations

import logging
import re
from dataclasses import replace

import pytest
import torch

from radixlm.kernels.cpu import native
from radixlm.kernels.cpu.native import AVX2, NATIVE, KernelBuildError
from radixlm.runtime.attention import (
    TORCH_ENTRY,
    AttentionScoring,
    BackendContext,
    BackendEntry,
    BackendRegistry,
    CpuAttentionBackend,
    CpuAttentionOptions,
    KernelAttention,
    TorchAttentionBackend,
    TritonAttentionBackend,
    cpu_kernels,
    default_registry,
    kernel_attention,
    select_backend,
)
from radixlm.runtime.attention import registry as registry_module
from radixlm.runtime.config import ConfigError
from radixlm.runtime.mem_cache.kv_pool import KVPool, ReqToTokenTable
from radixlm.runtime.model_store import cache_root
from radixlm.runtime.models import ArchConfig

ARCH = ArchConfig(
    "LlamaForCausalLM",
    vocab_size=96,
    hidden_size=64,
    intermediate_size=112,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
)
FASTER = {"decode_attention": True, "extend_attention": True, "few_row_layers": True}


def _context(
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    arch: ArchConfig = ARCH,
) -> BackendContext:
    """A context on a CPU pool (``device`` is only what the registry is told)."""
    pool = KVPool(arch.num_layers, 16, arch.num_kv_heads, arch.head_dim, dtype)
    return BackendContext(
        arch=arch,
        dtype=dtype,
        device=device,
        kv_pool=pool,
        req_to_token=ReqToTokenTable(2, 32),
    )


def _cpu(isa: str | None = "native", faster: dict[str, bool] | None = None) -> BackendRegistry:
    """The default registry, its "cpu" entry built for ``isa`` and chosen by "auto"
    as ``faster`` (the engine's rule) says."""
    faster = FASTER if faster is None else faster
    options = CpuAttentionOptions(
        isa=native.cpu_isa() if isa == "native" else isa,
        target=NATIVE,
        build_dir=cache_root() / "kernels",
        decode_in_kernel=faster["decode_attention"],
        extend_in_kernel=faster["extend_attention"],
    )
    return default_registry(options)


class _FakeBackend(TorchAttentionBackend):
    name = "fake"


def _build_fake(context: BackendContext, by_name: bool) -> _FakeBackend:
    return _FakeBackend(context.kv_pool, context.req_to_token, context.arch.attention_scale)


def _broken_build(context: BackendContext, by_name: bool) -> TorchAttentionBackend:
    raise KernelBuildError("no C++ compiler found: install g++ (or set CXX)")


def test_the_default_registry_lists_torch_cpu_triton_and_is_fresh_each_time() -> None:
    first, second = default_registry(), default_registry()
    assert first.names() == ("torch", "cpu", "triton") and first is not second
    first.register(BackendEntry("fake", _build_fake))
    assert second.names() == ("torch", "cpu", "triton")


def test_on_a_gpu_auto_takes_triton_and_cpu_is_refused(caplog) -> None:
    with caplog.at_level(logging.INFO):
        backend = select_backend("auto", _context(device="cuda"))
    assert type(backend) is TritonAttentionBackend and backend.name == "triton"
    assert backend.graph_capturable and not kernel_attention(backend).decode
    assert not caplog.records  # nothing to say: the C++ kernels are for the CPU
    with pytest.raises(ConfigError) as e:
        select_backend("cpu", _context(device="cuda"))
    assert str(e.value) == "attention_backend 'cpu' runs on the CPU, not on 'cuda'"
    assert type(select_backend("torch", _context(device="cuda"))) is TorchAttentionBackend


def test_on_a_cpu_triton_is_only_taken_by_name_under_the_interpreter(monkeypatch) -> None:
    assert type(select_backend("auto", _context(), _cpu(isa=None))) is TorchAttentionBackend
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert type(select_backend("triton", _context())) is TritonAttentionBackend
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ConfigError) as e:
        select_backend("triton", _context())
    assert str(e.value) == (
        "attention_backend 'triton': Triton runs on GPUs (on a CPU only under "
        "TRITON_INTERPRET=1, for tests)"
    )


def test_triton_refuses_a_head_dim_its_kernels_do_not_take(caplog) -> None:
    arch = replace(ARCH, hidden_size=72, num_heads=18, head_dim=4)
    with caplog.at_level(logging.INFO, logger=registry_module.__name__):
        assert type(select_backend("auto", _context("cuda", arch=arch))) is TorchAttentionBackend
    reason = (
        "its kernels do not take torch.float32 with head dim 4 (they take head dims "
        "16 to 256 in float16, bfloat16 or float32)"
    )
    assert caplog.messages == [f"attention_backend 'auto': using 'torch', as {reason}"]
    with pytest.raises(ConfigError, match=f"^attention_backend 'triton': {re.escape(reason)}$"):
        select_backend("triton", _context("cuda", arch=arch))


@pytest.mark.parametrize(
    "dtype, arch",
    [
        (torch.float16, ARCH),
        (torch.float32, replace(ARCH, hidden_size=72, num_heads=18, head_dim=4)),
    ],
    ids=["float16", "18 heads of dim 4"],
)
def test_a_model_the_kernels_do_not_take_gets_torch_or_is_refused(
    dtype: torch.dtype, arch: ArchConfig, caplog
) -> None:
    reason = (
        f"its kernels do not take {dtype} with {arch.num_heads} heads and "
        f"{arch.num_kv_heads} KV heads of dim {arch.head_dim} (it takes float32 and "
        "bfloat16, head dims that are multiples of 16 up to 256, and at most 8 query "
        "heads per KV head)"
    )
    with caplog.at_level(logging.INFO, logger=registry_module.__name__):
        backend = select_backend("auto", _context(dtype=dtype, arch=arch))
    assert type(backend) is TorchAttentionBackend
    assert caplog.messages == [f"attention_backend 'auto': using 'torch', as {reason}"]
    with pytest.raises(ConfigError) as e:
        select_backend("cpu", _context(dtype=dtype, arch=arch))
    assert str(e.value) == f"attention_backend 'cpu': {reason}"


def test_a_cpu_without_a_kernel_isa_gets_torch_silently_or_is_refused(caplog) -> None:
    with caplog.at_level(logging.INFO):
        assert type(select_backend("auto", _context(), _cpu(isa=None))) is TorchAttentionBackend
    assert not caplog.records  # the start-up CpuPaths line says it, once
    with pytest.raises(ConfigError) as e:
        select_backend("cpu", _context(), _cpu(isa=None))
    assert str(e.value) == (
        "attention_backend 'cpu': this CPU has neither AVX2 nor AVX-512, which "
        "radixlm's C++ kernels need"
    )


@pytest.mark.skipif(native.cpu_isa() is None, reason="the C++ kernels need AVX2 or AVX-512")
def test_auto_follows_the_kernel_is_faster_rule_and_cpu_insists() -> None:
    backend = select_backend("auto", _context())
    assert type(backend) is CpuAttentionBackend and backend.name == "cpu"
    assert kernel_attention(backend) == KernelAttention(decode=True, extend=True)
    no_extend = {**FASTER, "extend_attention": False}
    backend = select_backend("auto", _context(), _cpu(faster=no_extend))
    assert type(backend) is CpuAttentionBackend and not kernel_attention(backend).extend
    assert kernel_attention(select_backend("cpu", _context(), _cpu(faster=no_extend))).extend
    no_decode = {**FASTER, "decode_attention": False}  # the extend kernel rides on it
    assert type(select_backend("auto", _context(), _cpu(faster=no_decode))) is TorchAttentionBackend
    assert type(select_backend("cpu", _context(), _cpu(faster=no_decode))) is CpuAttentionBackend


def test_a_failed_build_falls_back_with_a_warning_or_is_refused(caplog) -> None:
    registry = BackendRegistry(TORCH_ENTRY)
    registry.register(BackendEntry("broken", _broken_build))
    with caplog.at_level(logging.WARNING):
        backend = registry.select("auto", _context())
    assert type(backend) is TorchAttentionBackend
    assert caplog.messages == [
        "attention_backend 'auto': using 'torch', as the kernels failed: "
        "no C++ compiler found: install g++ (or set CXX)"
    ]
    with pytest.raises(ConfigError) as e:
        registry.select("broken", _context())
    assert str(e.value) == (
        "attention_backend 'broken': no C++ compiler found: install g++ (or set CXX)"
    )


def test_a_registered_backend_is_selected_by_name_and_by_auto_where_preferred() -> None:
    registry = default_registry()
    registry.register(BackendEntry("fake", _build_fake, preferred=lambda context: False))
    assert registry.names() == ("torch", "cpu", "triton", "fake")
    assert type(registry.select("fake", _context(device="cuda"))) is _FakeBackend
    assert type(registry.select("auto", _context(device="cuda"))) is TritonAttentionBackend
    preferred = BackendRegistry(TORCH_ENTRY)
    preferred.register(BackendEntry("fake", _build_fake, device_type="cuda"))
    assert type(select_backend("auto", _context(device="cuda"), preferred)) is _FakeBackend
    assert type(select_backend("auto", _context(), preferred)) is TorchAttentionBackend
    with pytest.raises(ConfigError, match="runs on the GPU, not on 'cpu'"):
        preferred.select("fake", _context())


def test_names_are_checked() -> None:
    registry = default_registry()
    with pytest.raises(ValueError, match="'cpu' is registered already"):
        registry.register(BackendEntry("cpu", _build_fake))
    with pytest.raises(ValueError, match="'auto'"):
        registry.register(BackendEntry("auto", _build_fake))
    with pytest.raises(
        ConfigError, match=r"one of \('auto', 'torch', 'cpu', 'triton'\), got 'tpu'"
    ):
        registry.select("tpu", _context())


def test_an_entry_can_be_unavailable_on_this_machine() -> None:
    registry = BackendRegistry(TORCH_ENTRY)
    registry.register(
        BackendEntry("fake", _build_fake, unavailable=lambda context: "no such chip here")
    )
    assert type(registry.select("auto", _context())) is TorchAttentionBackend
    with pytest.raises(ConfigError, match="^attention_backend 'fake': no such chip here$"):
        registry.select("fake", _context())


@pytest.mark.skipif(native.cpu_isa() is None, reason="the C++ kernels need AVX2 or AVX-512")
def test_the_cpu_entry_builds_as_its_options_say(tmp_path, monkeypatch) -> None:
    """The "cpu" backend's own options (ISA, target, build dir) reach its build through
    its entry; the shared context carries none of them. It is no torch backend."""
    built = []

    def load(build_dir, target):
        built.append((build_dir, target))
        raise KernelBuildError("stop here")

    monkeypatch.setattr(cpu_kernels, "load_extend_attention", load)
    options = CpuAttentionOptions(native.cpu_isa(), AVX2, tmp_path, extend_in_kernel=False)
    with pytest.raises(ConfigError, match="^attention_backend 'cpu': stop here$"):
        default_registry(options).select("cpu", _context())
    assert built == [(tmp_path, AVX2)]
    assert not issubclass(CpuAttentionBackend, TorchAttentionBackend)
    assert kernel_attention(select_backend("torch", _context())) == KernelAttention()


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_every_backend_serves_a_model_with_windows_and_a_softcap(device, monkeypatch) -> None:
    """No backend refuses sliding windows or a soft-cap: each is built with the
    model's scoring, by name and by "auto"."""
    arch = replace(ARCH, layer_windows=(8, None), attn_logit_softcap=30.0)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # "triton" by name on a CPU
    names = ["torch", "triton"]
    if device == "cpu" and native.cpu_isa() is not None:
        names.append("cpu")
    for name in [*names, "auto"]:
        backend = select_backend(name, _context(device, arch=arch))
        assert backend.scoring == AttentionScoring((8, None), 30.0), name
        assert name == "auto" or backend.name == name
