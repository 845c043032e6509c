"""Builds every runtime component from an ``EngineConfig``, once, in dependency order:

model dir -> ArchConfig -> KV pool, slot allocator, req_to_token
          -> attention backend -> model (weights) -> sampler -> runner
          -> scheduler, request builder (tokenizer)
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from radixlm.kernels.cpu.elementwise import load_elementwise_kernels
from radixlm.kernels.cpu.native import KERNEL_TARGETS, KernelBuildError, KernelTarget
from radixlm.kernels.cpu.small_batch import load_small_batch_kernels
from radixlm.runtime.attention import (
    NO_KERNEL_ISA,
    AttentionBackend,
    BackendContext,
    select_backend,
)
from radixlm.runtime.config import ConfigError, EngineConfig
from radixlm.runtime.constrained import GrammarCompiler, JumpForward, TokenVocabulary
from radixlm.runtime.errors import ModelLoadError
from radixlm.runtime.executor.compiled_decode import CompiledDecode
from radixlm.runtime.executor.cpu_paths import KERNEL, KERNEL_IS_FASTER, TORCH, CpuPaths
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.executor.small_batch import SmallBatchForward
from radixlm.runtime.io.request_builder import RequestBuilder
from radixlm.runtime.mem_cache.kv_pool import KVPool, ReqToTokenTable, SlotAllocator
from radixlm.runtime.mem_cache.radix_cache import DisabledCache, RadixCache
from radixlm.runtime.model_store import cache_root, resolve_model_dir
from radixlm.runtime.models import ArchConfig, load_model, parse_dtype
from radixlm.runtime.sampling.sampler import Sampler
from radixlm.runtime.scheduling.scheduler import Scheduler

__all__ = ["Runtime", "build_runtime", "resolve_dtype"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Runtime:
    model_dir: Path
    arch: ArchConfig
    dtype: torch.dtype
    context_len: int
    tokenizer: Any
    allocator: SlotAllocator
    scheduler: Scheduler
    runner: ModelRunner
    request_builder: RequestBuilder
    cpu_paths: CpuPaths | None  # None off the CPU


def build_runtime(config: EngineConfig) -> Runtime:
    """Loads the model and wires the runtime. Raises ModelLoadError / ConfigError."""
    model_dir = resolve_model_dir(config.model.model_path)
    arch = ArchConfig.from_model_dir(model_dir)
    dtype = resolve_dtype(config.model.dtype, config.device)
    context_len = _context_len(config, arch)
    num_slots = _num_kv_slots(config, arch, dtype)
    pool = KVPool(
        arch.num_layers, num_slots, arch.num_kv_heads, arch.head_dim, dtype, config.device
    )
    allocator = SlotAllocator(num_slots)
    req_to_token = ReqToTokenTable(
        config.scheduler.max_running_requests, context_len, config.device
    )
    isa = _target(config).resolved_isa()  # the kernels' ISA on this CPU, None: no build
    backend = _attention_backend(config, arch, dtype, pool, req_to_token, isa)
    model = load_model(model_dir, backend, dtype, config.device, config=arch)
    tokenizer = _load_tokenizer(model_dir)
    compiled = None
    if config.model.enable_torch_compile:
        compiled = CompiledDecode(model, backend, config.model.torch_compile_max_bs)
        compiled.warm_up()
    sampler = Sampler(arch.vocab_size, seed=config.random_seed)
    small_batch = _layer_kernels(config, model, backend, isa)
    runner = ModelRunner(model, backend, sampler, compiled, small_batch)
    cpu_paths = _cpu_paths(config, backend, small_batch, model, isa)
    eos_ids = _eos_token_ids(model_dir, arch, tokenizer)
    vocab = TokenVocabulary.from_tokenizer(tokenizer, arch.vocab_size, eos_ids)
    grammars = GrammarCompiler(vocab, config.grammar)
    grammars.warm()  # its first worker starts now: the first constrained request need not wait
    builder = RequestBuilder(
        tokenizer,
        arch.vocab_size,
        context_len,
        allocator.capacity,
        eos_ids,
        grammars,
        config.grammar.jump_forward,
        config.scheduler.max_n,
    )
    cache_type = DisabledCache if config.cache.disable_radix_cache else RadixCache
    scheduler = Scheduler(
        config.scheduler,
        allocator,
        req_to_token,
        cache_type(allocator.free),
        vocab=vocab,
        jump=JumpForward(tokenizer, vocab),
    )
    return Runtime(
        model_dir,
        arch,
        dtype,
        context_len,
        tokenizer,
        allocator,
        scheduler,
        runner,
        builder,
        cpu_paths,
    )


def resolve_dtype(name: str, device: str) -> torch.dtype:
    """ "auto" -> bfloat16 on GPUs, float32 on CPUs.

    On the CPUs measured (AVX512-BF16, no AMX) float32 prefills ~1.3x faster than
    bfloat16 and decodes as fast (benchmarks/README.md), so bf16 is opt-in there.
    """
    if name != "auto":
        return parse_dtype(name)
    if device == "cuda":
        return torch.bfloat16
    return torch.float32


def _attention_backend(
    config: EngineConfig,
    arch: ArchConfig,
    dtype: torch.dtype,
    pool: KVPool,
    req_to_token: ReqToTokenTable,
    isa: str | None,
) -> AttentionBackend:
    """The backend ``attention_backend`` asks for (the registry's choice, see
    radixlm.runtime.attention.registry); "auto" takes the C++ kernels for the pass
    kinds where they are faster with this ``isa``'s build (``cpu_paths``)."""
    context = BackendContext(
        arch=arch,
        dtype=dtype,
        device=config.device,
        kv_pool=pool,
        req_to_token=req_to_token,
        isa=isa,
        target=_target(config),
        build_dir=cache_root() / "kernels",
        kernel_is_faster=KERNEL_IS_FASTER[isa] if isa is not None else {},
    )
    return select_backend(config.model.attention_backend, context)


def _layer_kernels(
    config: EngineConfig, model: torch.nn.Module, backend: AttentionBackend, isa: str | None
) -> SmallBatchForward | None:
    """Where ``cpu_layer_kernels`` asks for them and they apply (float32 or
    bfloat16 on CPU): returns the few-row kernels' runner, and attaches the
    elementwise kernels to a float32 model. None (with a warning when they
    cannot be built) otherwise."""
    if not config.model.cpu_layer_kernels or not SmallBatchForward.supports(model):
        return None
    if isa is None or not KERNEL_IS_FASTER[isa]["few_row_layers"]:
        return None
    try:
        kernels = load_small_batch_kernels(cache_root() / "kernels", _target(config))
        elementwise = load_elementwise_kernels(cache_root() / "kernels", _target(config))
    except KernelBuildError as e:
        logger.warning("cpu_layer_kernels: running the torch ops, as the kernels failed: %s", e)
        return None
    if model.dtype == torch.float32:
        model.use_elementwise_kernels(elementwise)
    return SmallBatchForward(model, backend, kernels)


def _context_len(config: EngineConfig, arch: ArchConfig) -> int:
    wanted = config.model.context_length
    if wanted is None:
        return arch.max_context_len
    if wanted > arch.max_context_len:
        raise ConfigError(
            f"context_length {wanted} exceeds the model's maximum {arch.max_context_len}"
        )
    return wanted


def _num_kv_slots(config: EngineConfig, arch: ArchConfig, dtype: torch.dtype) -> int:
    if config.cache.max_total_tokens is not None:
        return config.cache.max_total_tokens + 1  # + the padding slot
    per_slot = KVPool.bytes_per_slot(arch.num_layers, arch.num_kv_heads, arch.head_dim, dtype)
    return int(config.cache.kv_memory_gb * 2**30) // per_slot


def _load_tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot load the tokenizer in {str(model_dir)!r}: {e}") from e


def _eos_token_ids(model_dir: Path, arch: ArchConfig, tokenizer: Any) -> frozenset[int]:
    """The model's end tokens: config.json, generation_config.json and the tokenizer's."""
    ids = set(arch.eos_token_ids)
    gen = model_dir / "generation_config.json"
    if gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        ids |= set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)


def _target(config: EngineConfig) -> KernelTarget:
    return KERNEL_TARGETS[config.model.cpu_kernel_isa]


def _cpu_paths(
    config: EngineConfig,
    backend: AttentionBackend,
    small_batch: SmallBatchForward | None,
    model: torch.nn.Module,
    isa: str | None,
) -> CpuPaths | None:
    """The paths the built runtime takes (what was built, not what was asked), logged
    in one line; None off the CPU."""
    if config.device != "cpu":
        return None
    decode = KERNEL if backend.decode_in_kernel else TORCH
    extend = KERNEL if backend.extend_in_kernel else TORCH
    few_rows = KERNEL if small_batch is not None else TORCH
    elementwise = KERNEL if model.model.norm.elementwise is not None else TORCH
    used = KERNEL in (decode, extend, few_rows, elementwise)
    paths = CpuPaths(
        isa if used else None,
        decode,
        extend,
        few_rows,
        elementwise,
        notes=() if isa else (NO_KERNEL_ISA + ": the torch path throughout",),
    )
    logger.log(logging.INFO if isa else logging.WARNING, "%s", paths.describe())
    return paths
