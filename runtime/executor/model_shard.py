"""What every rank builds: the model (its shard, under tensor parallelism), its KV pool
and ``req_to_token`` table, the attention backend over them and the few-row C++
layer kernels where they apply (``build_model_shard``). The engine's assembly
(radixlm.runtime.entrypoints.assembly) builds the rest of the runtime around rank 0's;
the other ranks (radixlm.runtime.distributed.ranks) and a draft model
(radixlm.runtime.speculative.draft) build only this.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixlm.kernels.cpu.dequant import load_dequant_kernels
from radixlm.kernels.cpu.elementwise import ROW_DTYPES, load_elementwise_kernels
from radixlm.kernels.cpu.int8_group import load_int8_group_kernels
from radixlm.kernels.cpu.native import KERNEL_TARGETS, KernelBuildError, KernelTarget
from radixlm.kernels.cpu.small_batch import load_small_batch_kernels
from radixlm.runtime.attention import (
    AttentionBackend,
    BackendContext,
    CpuAttentionOptions,
    default_registry,
    select_backend,
)
from radixlm.runtime.config import CHECKPOINT_QUANTIZATIONS, ConfigError, EngineConfig
from radixlm.runtime.executor.cpu_paths import KernelRule, kernel_rule
from radixlm.runtime.executor.small_batch import SmallBatchForward
from radixlm.runtime.layers.quantization import QuantizedLinear, use_dequant_kernels
from radixlm.runtime.mem_cache.kv_pool import KVPool, ReqToTokenTable
from radixlm.runtime.mem_cache.kv_quant import kv_format
from radixlm.runtime.model_store import ModelSource, cache_root
from radixlm.runtime.models import ArchConfig, DecoderForCausalLM
from radixlm.runtime.models.build import (
    build_model,
    context_length,
    quantized_checkpoint,
    resolve_dtype,
    weight_bytes,
)
from radixlm.runtime.models.moe import SparseMoE

if TYPE_CHECKING:
    from radixlm.runtime.distributed.group import TensorParallelGroup

__all__ = ["CPU_KV_MEMORY_GB", "ModelShard", "build_model_shard", "kernel_target", "kv_capacity"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelShard:
    """What every rank builds: the model (its shard, under tensor parallelism), its KV
    pool and ``req_to_token`` table, the attention backend over them, and the few-row
    C++ layer kernels' runner where they apply (None under tensor parallelism: they run
    whole layers, with no all-reduce between attention and the MLP).

    arch: the whole model's config; ``model.config`` is this rank's."""

    source: ModelSource
    arch: ArchConfig
    dtype: torch.dtype
    device: str
    context_len: int
    isa: str | None  # the C++ kernels' build; None: no C++ build (off the CPU)
    pool: KVPool
    req_to_token: ReqToTokenTable
    backend: AttentionBackend
    model: DecoderForCausalLM
    weights: str  # Placement.weights
    small_batch: SmallBatchForward | None
    kernel_rule: KernelRule | None  # the measured table's verdicts; None off the CPU


def build_model_shard(
    config: EngineConfig,
    source: ModelSource,
    arch: ArchConfig,
    device: str,
    tp: TensorParallelGroup | None = None,
) -> ModelShard:
    """The model and its KV memory on this rank (``tp``: this rank's group; every rank
    of it calls this at once, as the ranks agree on the pool's size)."""
    quantization = config.model.weight_quantization()
    quantized = quantization is not None or quantized_checkpoint(source)
    dtype = resolve_dtype(config.model.dtype, device, quantized=quantized)
    context_len = context_length(config, arch)
    local = arch if tp is None else tp.plan.local_arch()
    fmt = kv_format(config.cache.kv_cache_dtype, dtype)  # every rank's pool: one format
    num_slots = _num_kv_slots(config, local, dtype, device)
    if tp is not None:  # every rank's pool mirrors rank 0's slots: the size all can hold
        num_slots = tp.min_int(num_slots)
    rows = config.scheduler.max_running_requests
    pool = KVPool(
        local.num_layers, num_slots, local.num_kv_heads, local.head_dim, dtype, device, fmt, rows
    )
    req_to_token = ReqToTokenTable(rows, context_len, device)
    isa = kernel_target(config).resolved_isa() if device == "cpu" else None  # None: no C++
    # by the model's dtype, and its size for where the few-row layers stop
    rule = kernel_rule(isa, dtype, hidden_size=arch.hidden_size) if isa is not None else None
    backend = _attention_backend(config, local, dtype, device, pool, req_to_token, rule)
    expected = CHECKPOINT_QUANTIZATIONS.get(config.model.quantization or "")
    model, weights = build_model(source, backend, dtype, device, arch, quantization, tp, expected)
    small_batch = _layer_kernels(config, model, backend, rule)  # None off the CPU (no rule)
    return ModelShard(
        source,
        arch,
        dtype,
        device,
        context_len,
        isa,
        pool,
        req_to_token,
        backend,
        model,
        weights,
        small_batch,
        rule,
    )


def kernel_target(config: EngineConfig) -> KernelTarget:
    """The C++ kernels' build ``cpu_kernel_isa`` asks for."""
    return KERNEL_TARGETS[config.model.cpu_kernel_isa]


def _attention_backend(
    config: EngineConfig,
    arch: ArchConfig,
    dtype: torch.dtype,
    device: str,
    pool: KVPool,
    req_to_token: ReqToTokenTable,
    rule: KernelRule | None,
) -> AttentionBackend:
    """The backend ``attention_backend`` asks for (the registry's choice, see
    radixlm.runtime.attention.registry); "auto" takes the C++ kernels for the pass
    kinds where ``rule`` (the build's and dtype's row of ``cpu_paths``'s table) says
    they are faster. ``rule`` None: no C++ build."""
    context = BackendContext(
        arch=arch, dtype=dtype, device=device, kv_pool=pool, req_to_token=req_to_token
    )
    cpu = CpuAttentionOptions(
        isa=rule.isa if rule is not None else None,
        target=kernel_target(config),
        build_dir=cache_root() / "kernels",
        decode_in_kernel=rule is not None and rule.decode_attention,
        extend_in_kernel=rule is not None and rule.extend_attention,
    )
    return select_backend(config.model.attention_backend, context, default_registry(cpu))


def _layer_kernels(
    config: EngineConfig,
    model: torch.nn.Module,
    backend: AttentionBackend,
    rule: KernelRule | None,
) -> SmallBatchForward | None:
    """Where ``cpu_layer_kernels`` asks for them, ``rule`` says they are faster for
    the model's dtype with this build, and they apply: attaches the
    elementwise kernels to a float32 or bfloat16 model on CPU (quantized or not), the int4
    dequantizer to int4 weights and the int8-group products to int8-group weights,
    gives a quantized model's layers radixlm's few-row products
    (``QuantizedLinear.use_small_batch``) and its mixture-of-experts layers their
    one-call experts (``SparseMoE.use_cpu_experts``), and returns the few-row kernels' runner for
    float32 or bfloat16 weights, and for quantized ones the kernels read (their
    whole decode steps). None (with a warning when they cannot be built) otherwise."""
    if not config.model.cpu_layer_kernels or not isinstance(model, DecoderForCausalLM):
        return None
    if model.device.type != "cpu" or rule is None or not rule.few_row_layers:
        return None
    build_dir, target = cache_root() / "kernels", kernel_target(config)
    # the few-row kernels run whole layers: no all-reduce between a shard's blocks
    few_rows = SmallBatchForward.supports(model) and model.tp is None
    # radixlm's quantized products and experts take whole layers, as the few-row
    # kernels do: a shard's product is part of an all-reduced sum
    moe_layers = [m for m in model.modules() if isinstance(m, SparseMoE)]
    quantized_products = model.quantized and model.tp is None
    try:
        if model.quantized:
            use_dequant_kernels(
                model,
                load_dequant_kernels(build_dir, target),
                load_int8_group_kernels(build_dir, target),
            )
        if few_rows or model.dtype in ROW_DTYPES:
            elementwise = load_elementwise_kernels(build_dir, target)
        if few_rows or quantized_products:
            kernels = load_small_batch_kernels(build_dir, target)
    except KernelBuildError as e:
        logger.warning("cpu_layer_kernels: running the torch ops, as the kernels failed: %s", e)
        return None
    if model.dtype in ROW_DTYPES:
        model.use_elementwise_kernels(elementwise)
    if quantized_products:
        linears = [m for m in model.modules() if isinstance(m, QuantizedLinear)]
        taken = sum(linear.use_small_batch(kernels) for linear in linears)
        experts = sum(layer.use_cpu_experts(kernels) for layer in moe_layers)
        logger.info(
            "quantized products: %d of %d layers radixlm's; experts in one call in %d of %d "
            "mixture-of-experts layers", taken, len(linears), experts, len(moe_layers),
        )  # fmt: skip
    if model.config.moe is not None:  # its step needs the experts in one call, now known
        few_rows = SmallBatchForward.supports(model) and model.tp is None
    if not few_rows:
        return None
    return SmallBatchForward(model, backend, kernels, rule.few_row_layers_max_rows)


# The KV pool on a CPU when neither max_total_tokens nor kv_memory_gb says.
CPU_KV_MEMORY_GB = 2.0


def kv_capacity(config: EngineConfig, arch: ArchConfig, dtype: torch.dtype, device: str) -> int:
    """The tokens the KV pool ``config`` asks for holds (its slots less the padding
    one), as ``build_model_shard`` sizes it for a model of ``dtype`` on ``device``."""
    return _num_kv_slots(config, arch, dtype, device) - 1


def _num_kv_slots(config: EngineConfig, arch: ArchConfig, dtype: torch.dtype, device: str) -> int:
    """The pool's slots: ``max_total_tokens`` + the padding slot, else what the memory
    budget holds at ``kv_cache_dtype``'s bytes per token (a quantized pool's scales
    included: an int8 pool holds about twice a bfloat16 pool's tokens), less a KIVI
    pool's float windows (one per request row)."""
    cache = config.cache
    if cache.max_total_tokens is not None:
        return cache.max_total_tokens + 1  # + the padding slot
    fmt = kv_format(cache.kv_cache_dtype, dtype)
    shape = (arch.num_layers, arch.num_kv_heads, arch.head_dim)
    per_slot = KVPool.bytes_per_slot(*shape, dtype, fmt)
    windows = 0
    if fmt.kivi is not None:
        rows = config.scheduler.max_running_requests
        windows = fmt.kivi.window_bytes(arch.num_layers, rows, *shape[1:], dtype)
    if cache.kv_memory_gb is not None or device == "cpu":
        gb = cache.kv_memory_gb if cache.kv_memory_gb is not None else CPU_KV_MEMORY_GB
        budget = int(gb * 2**30) - windows
        if windows and budget < 2 * per_slot:
            raise ConfigError(
                f"kv_memory_gb {gb:g} leaves no room for the KV pool beside a KIVI pool's "
                f"float windows ({windows / 2**20:,.0f} MiB for "
                f"{config.scheduler.max_running_requests} request rows): raise it, or lower "
                "max_running_requests"
            )
        return budget // per_slot
    weights = weight_bytes(arch, dtype, config.model.weight_quantization())
    return _gpu_kv_slots(cache.mem_fraction_static, weights + windows, per_slot)


def _gpu_kv_slots(fraction: float, weights: int, per_slot: int) -> int:
    """SGLang's rule: weights + KV pool take ``fraction`` of the GPU's memory, less
    what is already in use (other processes included). Raises ConfigError when
    that leaves no room."""
    free, total = torch.cuda.mem_get_info()
    budget = int(total * fraction) - (total - free) - weights
    slots = budget // per_slot
    if slots < 2:
        gib = 2**30
        raise ConfigError(
            f"mem_fraction_static {fraction} leaves no room for the KV pool: "
            f"{total / gib:.1f} GiB GPU, {(total - free) / gib:.1f} GiB in use, "
            f"weights {weights / gib:.1f} GiB (raise it, or set max_total_tokens)"
        )
    return slots
