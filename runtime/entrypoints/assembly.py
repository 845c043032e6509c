"""Builds every runtime component from an ``EngineConfig``, once, in dependency order:

model dir -> ArchConfig -> device -> [tensor-parallel ranks started, group joined]
          -> model shard: KV pool, req_to_token, attention backend, model (weights),
             CPU kernels (``build_model_shard``: what every rank builds)
          -> slot allocator, sampler, runner (CUDA graphs, compiled decode)
          -> scheduler, request builder (tokenizer)

Under tensor parallelism (``tp_size`` > 1) this process is rank 0: the other ranks
build only their model shard (radixlm.runtime.distributed.ranks) and run the passes
rank 0 sends them.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from radixlm.kernels.cpu.dequant import load_dequant_kernels
from radixlm.kernels.cpu.elementwise import load_elementwise_kernels
from radixlm.kernels.cpu.int8_group import load_int8_group_kernels
from radixlm.kernels.cpu.native import KERNEL_TARGETS, KernelBuildError, KernelTarget
from radixlm.kernels.cpu.small_batch import load_small_batch_kernels
from radixlm.kernels.cpu.token_bitmask import TokenBitmaskKernel, load_token_bitmask_kernel
from radixlm.runtime.attention import (
    NO_KERNEL_ISA,
    AttentionBackend,
    BackendContext,
    CpuAttentionOptions,
    default_registry,
    select_backend,
)
from radixlm.runtime.config import ConfigError, EngineConfig, cpu_threads_per_process
from radixlm.runtime.constrained import GrammarCompiler, JumpForward, TokenVocabulary
from radixlm.runtime.device import resolve_device
from radixlm.runtime.errors import ModelLoadError
from radixlm.runtime.executor.compiled_decode import CompiledDecode
from radixlm.runtime.executor.cpu_paths import (
    KERNEL,
    KERNEL_IS_FASTER,
    TORCH,
    CpuPaths,
    attention_paths,
)
from radixlm.runtime.executor.cuda_graph import CudaGraphCapture, DecodeGraphs, graph_batch_sizes
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.executor.small_batch import SmallBatchForward
from radixlm.runtime.io.request_builder import RequestBuilder
from radixlm.runtime.layers.linear import native_bf16
from radixlm.runtime.layers.quantization import (
    Quantization,
    QuantizationError,
    use_dequant_kernels,
)
from radixlm.runtime.mem_cache.kv_pool import KVPool, ReqToTokenTable, SlotAllocator
from radixlm.runtime.mem_cache.radix_cache import DisabledCache, RadixCache
from radixlm.runtime.model_store import ModelSource, cache_root, resolve_model_source
from radixlm.runtime.model_store.transformers_compat import import_hub_kernels
from radixlm.runtime.models import ArchConfig, DecoderForCausalLM, load_model, parse_dtype
from radixlm.runtime.reasoning import ReasoningMarkers, resolve_reasoning_format
from radixlm.runtime.sampling.sampler import Sampler
from radixlm.runtime.scheduling.scheduler import Scheduler
from radixlm.runtime.speculative.cost import calibrate, calibration_rows, scratch_pass_timer

if TYPE_CHECKING:
    from radixlm.runtime.distributed.group import TensorParallelGroup
    from radixlm.runtime.distributed.ranks import TensorParallelRanks
    from radixlm.runtime.speculative.controller import Speculator
    from radixlm.runtime.speculative.draft import DraftModel

__all__ = [
    "ModelShard",
    "Placement",
    "Runtime",
    "build_model_shard",
    "build_runtime",
    "resolve_dtype",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Placement:
    """Where the engine runs, as built.

    device: "cpu", or the GPU ("cuda:0"); attention_backend: the backend's name;
    cuda_graph_batch_sizes: the decode batch sizes replayed from CUDA graphs
    (empty: none, off a GPU, with ``disable_cuda_graph``, or with a backend that
    cannot be captured); weights: how the linear layers store their weights
    ("float32", "bfloat16", "int8", "int4 (group 32)", ...); weight_bytes: what
    the model's parameters and buffers take (a tied matrix once; float32 and
    bfloat16 layers on a CPU keep a second, oneDNN-blocked copy not counted here);
    overlap_schedule: whether the loop builds each pass while the one before it runs
    (``SchedulerConfig.overlap_schedule`` resolved for the device);
    grammar_mask_threads: the threads filling each pass's grammar masks
    (``SchedulerConfig.grammar_mask_threads`` resolved for the device).
    """

    device: str
    attention_backend: str
    cuda_graph_batch_sizes: tuple[int, ...] = ()
    weights: str = "float32"
    weight_bytes: int = 0
    tp_size: int = 1
    overlap_schedule: bool = False
    grammar_mask_threads: int = 1


@dataclass(frozen=True)
class Runtime:
    source: ModelSource
    arch: ArchConfig
    dtype: torch.dtype
    context_len: int
    tokenizer: Any
    allocator: SlotAllocator
    scheduler: Scheduler
    runner: ModelRunner
    request_builder: RequestBuilder
    cpu_paths: CpuPaths | None  # None off the CPU
    placement: Placement
    reasoning: ReasoningMarkers | None = None  # the reasoning parser's markers, if any


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


def resolve_model(config: EngineConfig) -> tuple[ModelSource, ArchConfig, str]:
    """The model's files, its config and the device it runs on."""
    model = config.model
    source = resolve_model_source(
        model.model_path, model.from_gguf(), revision=model.revision, gguf_file=model.gguf_file
    )
    return source, ArchConfig.from_model_dir(source.model_dir), _device(config)


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
    quantized = quantization is not None or source.gguf is not None
    dtype = resolve_dtype(config.model.dtype, device, quantized=quantized)
    context_len = _context_len(config, arch)
    local = arch if tp is None else tp.plan.local_arch()
    num_slots = _num_kv_slots(config, local, dtype, device)
    if tp is not None:  # every rank's pool mirrors rank 0's slots: the size all can hold
        num_slots = tp.min_int(num_slots)
    pool = KVPool(local.num_layers, num_slots, local.num_kv_heads, local.head_dim, dtype, device)
    req_to_token = ReqToTokenTable(config.scheduler.max_running_requests, context_len, device)
    isa = _target(config).resolved_isa() if device == "cpu" else None  # None: no C++ build
    backend = _attention_backend(config, local, dtype, device, pool, req_to_token, isa)
    model, weights = _load_model(source, backend, dtype, device, arch, quantization, tp)
    small_batch = _layer_kernels(config, model, backend, isa)  # None off the CPU (no isa)
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
    )


def build_runtime(config: EngineConfig) -> Runtime:
    """Loads the model and wires the runtime; under tensor parallelism, starts this
    node's other ranks first. Raises ModelLoadError / ConfigError / RankFailedError."""
    source, arch, device = resolve_model(config)
    if config.parallel.tp_size == 1:
        return _build_runtime(config, build_model_shard(config, source, arch, device), None)
    # here, not at the top: torch.distributed is loaded only by a tensor-parallel engine
    from radixlm.runtime.distributed.ranks import TensorParallelRanks

    ranks = TensorParallelRanks.start(config, arch, device)
    try:
        shard = build_model_shard(config, source, arch, device, ranks.group)
        return _build_runtime(config, shard, ranks)
    except BaseException:
        ranks.stop()
        raise


def _build_runtime(
    config: EngineConfig, shard: ModelShard, ranks: TensorParallelRanks | None
) -> Runtime:
    """The rest of the runtime around rank 0's (or the only) model shard."""
    source, arch, device, isa = shard.source, shard.arch, shard.device, shard.isa
    model, backend, pool, dtype = shard.model, shard.backend, shard.pool, shard.dtype
    model_dir, context_len, req_to_token = source.model_dir, shard.context_len, shard.req_to_token
    allocator = SlotAllocator(pool.num_slots)
    if ranks is not None:  # every pass carries the table's writes to the other ranks
        ranks.bind_table(req_to_token)
    tokenizer = _load_tokenizer(model_dir)
    compiled = None
    if config.model.enable_torch_compile and ranks is None:
        compiled = CompiledDecode(model, backend, config.model.torch_compile_max_bs)
        compiled.warm_up()
    elif config.model.enable_torch_compile:
        logger.warning("enable_torch_compile: off under tensor parallelism (eager passes)")
    sampler = Sampler(
        arch.vocab_size, seed=config.random_seed, cpu_bitmask=_bitmask_kernel(config, isa)
    )
    small_batch = shard.small_batch
    graphs = _decode_graphs(config, model, backend, device, tensor_parallel=ranks is not None)
    runner = ModelRunner(model, backend, sampler, compiled, small_batch, graphs, ranks)
    cpu_paths = _cpu_paths(device, backend, small_batch, model, isa)
    placement = Placement(
        str(pool.k.device),
        backend.name,
        graphs.batch_sizes if graphs is not None else (),
        shard.weights,
        _resident_bytes(model),
        config.parallel.tp_size,
        _overlaps(config.scheduler.overlap_schedule, device),
        _mask_threads(config, device),
    )
    logger.info("placement: %s", placement)
    eos_ids = _eos_token_ids(model_dir, arch, tokenizer)
    vocab = TokenVocabulary.from_tokenizer(tokenizer, arch.vocab_size, eos_ids)
    grammars = GrammarCompiler(vocab, config.grammar)
    grammars.warm()  # its first worker starts now: the first constrained request need not wait
    reasoning = _reasoning_markers(config, tokenizer, vocab)
    builder = RequestBuilder(
        tokenizer,
        arch.vocab_size,
        context_len,
        allocator.capacity,
        eos_ids,
        grammars,
        config.grammar.jump_forward,
        config.scheduler.max_n,
        config.limits,
        reasoning,
    )
    cache_type = DisabledCache if config.cache.disable_radix_cache else RadixCache
    scheduler = Scheduler(
        replace(config.scheduler, grammar_mask_threads=placement.grammar_mask_threads),
        allocator,
        req_to_token,
        cache_type(allocator.free),
        vocab=vocab,
        jump=JumpForward(tokenizer, vocab),
        speculative=config.speculation,
        draft=_draft_model(config, arch, device),
    )
    if scheduler.speculator is not None and ranks is None:
        _calibrate_speculation(config, scheduler.speculator, runner, device, context_len)
    return Runtime(
        source,
        arch,
        dtype,
        context_len,
        tokenizer,
        allocator,
        scheduler,
        runner,
        builder,
        cpu_paths,
        placement,
        reasoning,
    )


# Times the start-up calibration is measured before a noisy fit gives way to the fixed model.
CALIBRATION_ATTEMPTS = 3


def _calibrate_speculation(
    config: EngineConfig, speculator: Speculator, runner: ModelRunner, device: str, context_len: int
) -> None:
    """Measures the planner's pass costs on this device (``speculative_calibrate``): a few
    scratch passes, before any request holds KV. Only for the adaptive K (the only reader
    of the costs), and not under tensor parallelism, where every pass would cross to the
    other ranks."""
    spec = config.speculation
    rows = calibration_rows(torch.device(device).type, config.scheduler.max_running_requests)
    if not (spec.speculative_calibrate and spec.speculative_adaptive) or len(rows) < 2:
        return
    started = time.perf_counter()
    timer = scratch_pass_timer(runner, context_len)
    for _ in range(CALIBRATION_ATTEMPTS):  # a busy machine slows passes at random: again
        cost = calibrate(timer, rows, spec.speculative_num_tokens, repeats=3)
        if cost.plausible(rows):
            break
        logger.info("speculation: implausible pass costs %s (noise?): measuring again", cost)
    else:
        logger.warning("speculation: implausible pass costs %s (noise?): fixed model", cost)
        return
    seconds = time.perf_counter() - started
    speculator.use_pass_cost(cost)
    logger.info("speculation: pass costs %s (rows %s, %.2f s)", cost, rows, seconds)


def _draft_model(config: EngineConfig, arch: ArchConfig, device: str) -> DraftModel | None:
    """The draft model of ``speculative="draft"`` (None otherwise), loaded as the target
    was, with a KV pool of its own (``speculative_draft_max_total_tokens`` slots)."""
    spec = config.speculation
    if spec.speculative != "draft":
        return None
    # here, not at the top: the draft module builds its model with this module's helpers
    from radixlm.runtime.speculative.draft import DraftModel

    assert spec.speculative_draft_model_path is not None  # the config checked it
    draft = DraftModel.load(
        spec.speculative_draft_model_path,
        arch.vocab_size,
        config.model.dtype,
        spec.speculative_draft_max_total_tokens,
        device=device,
        seed=config.random_seed,
        max_running_requests=config.scheduler.max_running_requests,
    )
    logger.info("draft model: %s", spec.speculative_draft_model_path)
    return draft


def _device(config: EngineConfig) -> str:
    try:
        return resolve_device(config.device)
    except ValueError as e:
        raise ConfigError(str(e)) from e


def resolve_dtype(name: str, device: str, quantized: bool = False) -> torch.dtype:
    """ "auto" -> bfloat16 on GPUs, for quantized weights (the activations' dtype of
    torch's quantized CPU kernels) and on CPUs that compute bf16 natively
    (AVX512-BF16 or AMX: ``native_bf16``); float32 on other CPUs.

    The rule is measured: on an AMD AVX512-BF16 CPU bfloat16 ran every workload of
    ``bench_peers.py`` faster than float32 (benchmarks/README.md, "Against vLLM's CPU
    build, llama.cpp and transformers" and "CPU paths and kernels"), and on an AVX2-only
    CPU bf16 has no kernels but emulation. The choice is logged.
    """
    if name != "auto":
        dtype = parse_dtype(name)
        if quantized and device == "cpu" and dtype == torch.float16:
            raise ConfigError("quantized weights on a CPU take float32 or bfloat16, not float16")
        return dtype
    if device == "cuda" or quantized:
        return torch.bfloat16
    if native_bf16():
        logger.info("dtype auto: bfloat16 (this CPU computes bf16 natively: AVX512-BF16 or AMX)")
        return torch.bfloat16
    logger.info("dtype auto: float32 (this CPU has no native bf16: no AVX512-BF16, no AMX)")
    return torch.float32


def _load_model(
    source: ModelSource,
    backend: AttentionBackend,
    dtype: torch.dtype,
    device: str,
    arch: ArchConfig,
    quantization: Quantization | None,
    tp: TensorParallelGroup | None = None,
) -> tuple[DecoderForCausalLM, str]:
    """The model (``tp``: this rank's shard) with its weights, and what they are stored
    as (Placement.weights); a quantization a layer cannot take is a ConfigError."""
    if source.gguf is not None:
        # imports gguf, which an engine on a model directory never needs
        from radixlm.runtime.models.gguf_loader import load_gguf_model

        return load_gguf_model(source.gguf, backend, dtype, device, arch, tp)
    try:
        model = load_model(source.model_dir, backend, dtype, device, arch, quantization, tp)
    except QuantizationError as e:
        raise ConfigError(f"quantization {quantization.describe()}: {e}") from e  # type: ignore[union-attr]
    return model, quantization.describe() if quantization else str(dtype).removeprefix("torch.")


def _resident_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters and buffers (a shared tensor counted once)."""
    tensors = {id(t): t for t in (*model.parameters(), *model.buffers())}
    return sum(t.nbytes for t in tensors.values())


def _attention_backend(
    config: EngineConfig,
    arch: ArchConfig,
    dtype: torch.dtype,
    device: str,
    pool: KVPool,
    req_to_token: ReqToTokenTable,
    isa: str | None,
) -> AttentionBackend:
    """The backend ``attention_backend`` asks for (the registry's choice, see
    radixlm.runtime.attention.registry); "auto" takes the C++ kernels for the pass
    kinds where they are faster with this ``isa``'s build (``cpu_paths``)."""
    context = BackendContext(
        arch=arch, dtype=dtype, device=device, kv_pool=pool, req_to_token=req_to_token
    )
    faster = KERNEL_IS_FASTER[isa] if isa is not None else {}
    cpu = CpuAttentionOptions(
        isa=isa,
        target=_target(config),
        build_dir=cache_root() / "kernels",
        decode_in_kernel=faster.get("decode_attention", False),
        extend_in_kernel=faster.get("extend_attention", False),
    )
    return select_backend(config.model.attention_backend, context, default_registry(cpu))


def _layer_kernels(
    config: EngineConfig, model: torch.nn.Module, backend: AttentionBackend, isa: str | None
) -> SmallBatchForward | None:
    """Where ``cpu_layer_kernels`` asks for them and they apply: attaches the
    elementwise kernels to a float32 model on CPU (quantized or not), the int4
    dequantizer to int4 weights and the int8-group products to int8-group weights,
    and returns the few-row kernels' runner for float32
    or bfloat16 weights. None (with a warning when they cannot be built) otherwise."""
    if not config.model.cpu_layer_kernels or not isinstance(model, DecoderForCausalLM):
        return None
    if model.device.type != "cpu" or isa is None or not KERNEL_IS_FASTER[isa]["few_row_layers"]:
        return None
    build_dir, target = cache_root() / "kernels", _target(config)
    # the few-row kernels run whole layers: no all-reduce between a shard's blocks
    few_rows = SmallBatchForward.supports(model) and model.tp is None
    try:
        if not few_rows:  # quantized weights
            use_dequant_kernels(
                model,
                load_dequant_kernels(build_dir, target),
                load_int8_group_kernels(build_dir, target),
            )
        if few_rows or model.dtype == torch.float32:
            elementwise = load_elementwise_kernels(build_dir, target)
        if few_rows:
            kernels = load_small_batch_kernels(build_dir, target)
    except KernelBuildError as e:
        logger.warning("cpu_layer_kernels: running the torch ops, as the kernels failed: %s", e)
        return None
    if model.dtype == torch.float32:
        model.use_elementwise_kernels(elementwise)
    return SmallBatchForward(model, backend, kernels) if few_rows else None


def _context_len(config: EngineConfig, arch: ArchConfig) -> int:
    wanted = config.model.context_length
    if wanted is None:
        return arch.max_context_len
    if wanted > arch.max_context_len:
        raise ConfigError(
            f"context_length {wanted} exceeds the model's maximum {arch.max_context_len}"
        )
    return wanted


def _decode_graphs(
    config: EngineConfig,
    model: torch.nn.Module,
    backend: AttentionBackend,
    device: str,
    tensor_parallel: bool = False,
) -> DecodeGraphs | None:
    """CUDA graphs of decode passes, captured now, where they apply: on a GPU, with a
    backend that can be captured, unless ``disable_cuda_graph``; not under tensor
    parallelism (the other ranks replay no graph of their own)."""
    if device != "cuda" or config.model.disable_cuda_graph:
        return None
    if tensor_parallel:
        logger.info("CUDA graphs: off under tensor parallelism (eager passes)")
        return None
    if not backend.graph_capturable:
        logger.info("CUDA graphs: off, as attention backend %r cannot be captured", backend.name)
        return None
    if isinstance(model, DecoderForCausalLM) and model.config.moe is not None:
        # the experts a pass runs depend on its tokens (sized by values: no capture)
        logger.info("CUDA graphs: off, as mixture-of-experts passes cannot be captured")
        return None
    max_bs = config.scheduler.max_running_requests  # no decode pass has more rows
    if config.model.cuda_graph_max_bs is not None:
        max_bs = min(config.model.cuda_graph_max_bs, max_bs)
    graphs = DecodeGraphs(model, backend, graph_batch_sizes(max_bs), CudaGraphCapture())
    start = time.perf_counter()
    graphs.capture_all()
    logger.info(
        "CUDA graphs: captured decode batch sizes %s in %.1f s",
        graphs.batch_sizes,
        time.perf_counter() - start,
    )
    return graphs


# The KV pool on a CPU when neither max_total_tokens nor kv_memory_gb says.
CPU_KV_MEMORY_GB = 2.0


def _num_kv_slots(config: EngineConfig, arch: ArchConfig, dtype: torch.dtype, device: str) -> int:
    cache = config.cache
    if cache.max_total_tokens is not None:
        return cache.max_total_tokens + 1  # + the padding slot
    per_slot = KVPool.bytes_per_slot(arch.num_layers, arch.num_kv_heads, arch.head_dim, dtype)
    if cache.kv_memory_gb is not None or device == "cpu":
        gb = cache.kv_memory_gb if cache.kv_memory_gb is not None else CPU_KV_MEMORY_GB
        return int(gb * 2**30) // per_slot
    weight_bytes = _weight_bytes(arch, dtype, config.model.weight_quantization())
    return _gpu_kv_slots(cache.mem_fraction_static, weight_bytes, per_slot)


def _gpu_kv_slots(fraction: float, weight_bytes: int, per_slot: int) -> int:
    """SGLang's rule: weights + KV pool take ``fraction`` of the GPU's memory, less
    what is already in use (other processes included). Raises ConfigError when
    that leaves no room."""
    free, total = torch.cuda.mem_get_info()
    budget = int(total * fraction) - (total - free) - weight_bytes
    slots = budget // per_slot
    if slots < 2:
        gib = 2**30
        raise ConfigError(
            f"mem_fraction_static {fraction} leaves no room for the KV pool: "
            f"{total / gib:.1f} GiB GPU, {(total - free) / gib:.1f} GiB in use, "
            f"weights {weight_bytes / gib:.1f} GiB (raise it, or set max_total_tokens)"
        )
    return slots


def _weight_bytes(
    arch: ArchConfig, dtype: torch.dtype, quantization: Quantization | None = None
) -> int:
    """The model's parameters and buffers in ``dtype``, counted on the meta device
    (an untied config whose checkpoint has no ``lm_head`` counts one too many; int4
    codes count a byte each, as they take while loading)."""
    model = DecoderForCausalLM(arch, None, dtype, "meta", quantization)  # type: ignore[arg-type]
    return _resident_bytes(model)


def _load_tokenizer(model_dir: Path) -> Any:
    import_hub_kernels()
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


def _reasoning_markers(
    config: EngineConfig, tokenizer: Any, vocab: TokenVocabulary
) -> ReasoningMarkers | None:
    """The reasoning parser's markers in this tokenizer (None: no parser, named or detected)."""
    template = getattr(tokenizer, "chat_template", None)
    fmt = resolve_reasoning_format(config.model.reasoning_parser, template)
    if fmt is None:
        return None
    logger.info("reasoning parser: %s", fmt.name)
    return ReasoningMarkers.from_tokenizer(fmt, tokenizer, vocab)


def _bitmask_kernel(config: EngineConfig, isa: str | None) -> TokenBitmaskKernel | None:
    """The C++ grammar-mask pass for the sampler on CPU (None: the torch ops)."""
    if isa is None:
        return None
    try:
        return load_token_bitmask_kernel(cache_root() / "kernels", _target(config))
    except KernelBuildError as e:
        logger.warning("grammar masks: running the torch ops, as the kernel failed: %s", e)
        return None


def _target(config: EngineConfig) -> KernelTarget:
    return KERNEL_TARGETS[config.model.cpu_kernel_isa]


def _cpu_paths(
    device: str,
    backend: AttentionBackend,
    small_batch: SmallBatchForward | None,
    model: torch.nn.Module,
    isa: str | None,
) -> CpuPaths | None:
    """The paths the built runtime takes (what was built, not what was asked), logged
    in one line; None off the CPU."""
    if device != "cpu":
        return None
    decode, extend = attention_paths(backend)
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


def _overlaps(choice: str, device: str) -> bool:
    """``overlap_schedule`` for ``device``: "auto" is on for a GPU only (on the CPU a
    pass runs on the loop thread, so there is nothing to overlap it with)."""
    return choice == "on" or (choice == "auto" and device.startswith("cuda"))


# The most grammar mask threads a GPU engine starts by itself. About a third of a
# pass's fill stays serial on a pool (the GIL-held part of each row, the hand-off:
# benchmarks/README.md, "Constrained decoding"), so 4 threads take most of what a pool
# can, well under a large batch's decode step; more would mostly contend for the GIL
# with the engine loop, which launches the device's passes.
MAX_AUTO_MASK_THREADS = 4


def _mask_threads(config: EngineConfig, device: str) -> int:
    """``grammar_mask_threads`` for ``device``. None is 1 on the CPU: the model's OpenMP
    team holds every core while the masks fill, so more fill threads only take cores
    from it (benchmarks/README.md, "Constrained decoding": 2 threads gain nothing).
    On a GPU the host's cores are free while the device computes: the cores of this
    process's share less one for the engine loop, at most ``MAX_AUTO_MASK_THREADS``
    (benchmarks/README.md, "Constrained decoding")."""
    chosen = config.scheduler.grammar_mask_threads
    if chosen is not None:
        return chosen
    if not device.startswith("cuda"):
        return 1
    cores = cpu_threads_per_process(config.parallel.ranks_per_node)
    return max(1, min(MAX_AUTO_MASK_THREADS, cores - 1))
