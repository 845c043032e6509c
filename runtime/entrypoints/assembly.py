"""Builds every runtime component from an ``EngineConfig``, once, in dependency order:

model dir -> ArchConfig -> device (radixlm.runtime.models.build)
          -> [tensor-parallel ranks started, group joined]
          -> model shard: KV pool, req_to_token, attention backend, model (weights),
             CPU kernels (radixlm.runtime.executor.model_shard: what every rank builds)
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
from typing import Any

import torch

from radixlm.kernels.cpu.native import KernelBuildError
from radixlm.kernels.cpu.small_batch import MAX_ROWS
from radixlm.kernels.cpu.token_bitmask import TokenBitmaskKernel, load_token_bitmask_kernel
from radixlm.runtime.attention import NO_KERNEL_ISA, AttentionBackend
from radixlm.runtime.config import EngineConfig, cpu_threads_per_process
from radixlm.runtime.constrained import GrammarCompiler, JumpForward, TokenVocabulary
from radixlm.runtime.distributed.ranks import TensorParallelRanks
from radixlm.runtime.errors import ModelLoadError
from radixlm.runtime.executor.compiled_decode import CompiledDecode
from radixlm.runtime.executor.cpu_paths import (
    KERNEL,
    TORCH,
    CpuPaths,
    KernelRule,
    attention_paths,
)
from radixlm.runtime.executor.cuda_graph import CudaGraphCapture, DecodeGraphs, graph_batch_sizes
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.executor.model_shard import ModelShard, build_model_shard, kernel_target
from radixlm.runtime.executor.small_batch import SmallBatchForward
from radixlm.runtime.io.request_builder import RequestBuilder
from radixlm.runtime.mem_cache.kv_pool import KVPool, SlotAllocator
from radixlm.runtime.mem_cache.radix_cache import DisabledCache, RadixCache
from radixlm.runtime.model_store import ModelSource, cache_root
from radixlm.runtime.model_store.transformers_compat import import_hub_kernels
from radixlm.runtime.models import ArchConfig, DecoderForCausalLM
from radixlm.runtime.models.build import resident_bytes, resolve_model
from radixlm.runtime.reasoning import ReasoningMarkers, resolve_reasoning_format
from radixlm.runtime.sampling.sampler import Sampler
from radixlm.runtime.scheduling.scheduler import Scheduler
from radixlm.runtime.speculative.controller import Speculator
from radixlm.runtime.speculative.cost import calibrate, calibration_rows, scratch_pass_timer
from radixlm.runtime.speculative.draft import DraftModel

__all__ = ["Placement", "Runtime", "build_runtime"]

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
    (``SchedulerConfig.grammar_mask_threads`` resolved for the device);
    kv_format: how the KV pool stores K and V (``kv_cache_dtype`` resolved: the
    model's dtype, or "int8", "fp8_e4m3", "fp8_e5m2", "kivi4", "kivi2");
    kv_bytes_per_token: what one token's K and V take in every layer, scales included
    (summed over the ranks; a KIVI pool's windows, per request row, apart).
    """

    device: str
    attention_backend: str
    cuda_graph_batch_sizes: tuple[int, ...] = ()
    weights: str = "float32"
    weight_bytes: int = 0
    tp_size: int = 1
    overlap_schedule: bool = False
    grammar_mask_threads: int = 1
    kv_format: str = "float32"
    kv_bytes_per_token: int = 0


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

    def close(self, *, passes_done: bool = True) -> None:
        """Stops what the runtime started: its compile workers and, once no pass can run
        (``passes_done``), its grammar mask threads and the model's and KV pool's memory.
        Not left to the collector: the runtime's parts refer to each other, so a dropped
        runtime's workers would run until the next collection."""
        self.request_builder.grammars.close()
        if passes_done:
            self.scheduler.close()
            self.runner.close()


@dataclass(frozen=True)
class _Text:
    """The tokenizer's side of a runtime, built before the model: the grammar compiler's
    first worker then starts (seconds of imports) while the model loads, not while the
    first requests run beside it (on 2 cores it slowed their passes 2-3x)."""

    tokenizer: Any
    eos_ids: frozenset[int]
    vocab: TokenVocabulary
    grammars: GrammarCompiler


def build_runtime(config: EngineConfig) -> Runtime:
    """Loads the model and wires the runtime; under tensor parallelism, starts this
    node's other ranks first. Raises ModelLoadError / ConfigError / RankFailedError."""
    source, arch, device = resolve_model(config)
    text = _build_text(config, source.model_dir, arch)
    ranks = None
    try:
        if config.parallel.tp_size == 1:
            return _build_runtime(config, build_model_shard(config, source, arch, device), text)
        ranks = TensorParallelRanks.start(config, arch, device)
        shard = build_model_shard(config, source, arch, device, ranks.group)
        return _build_runtime(config, shard, text, ranks)
    except BaseException:
        text.grammars.close()
        if ranks is not None:
            ranks.stop()
        raise


def _build_text(config: EngineConfig, model_dir: Path, arch: ArchConfig) -> _Text:
    tokenizer = _load_tokenizer(model_dir)
    eos_ids = _eos_token_ids(model_dir, arch, tokenizer)
    vocab = TokenVocabulary.from_tokenizer(tokenizer, arch.vocab_size, eos_ids)
    grammars = GrammarCompiler(vocab, config.grammar)
    grammars.warm()  # its first worker starts now: the first constrained request need not wait
    return _Text(tokenizer, eos_ids, vocab, grammars)


def _build_runtime(
    config: EngineConfig, shard: ModelShard, text: _Text, ranks: TensorParallelRanks | None = None
) -> Runtime:
    """The rest of the runtime around rank 0's (or the only) model shard."""
    source, arch, device, isa = shard.source, shard.arch, shard.device, shard.isa
    model, backend, pool, dtype = shard.model, shard.backend, shard.pool, shard.dtype
    context_len, req_to_token = shard.context_len, shard.req_to_token
    allocator = SlotAllocator(pool.num_slots)
    if ranks is not None:  # every pass carries the table's writes to the other ranks
        ranks.bind_table(req_to_token)
    tokenizer, eos_ids, vocab, grammars = text.tokenizer, text.eos_ids, text.vocab, text.grammars
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
    cpu_paths = _cpu_paths(device, backend, small_batch, model, isa, shard.kernel_rule)
    placement = Placement(
        str(pool.k.device),
        backend.name,
        graphs.batch_sizes if graphs is not None else (),
        shard.weights,
        resident_bytes(model),
        config.parallel.tp_size,
        _overlaps(config.scheduler.overlap_schedule, device),
        _mask_threads(config, device),
        pool.format.name,
        _kv_bytes_per_token(pool, config.parallel.tp_size),
    )
    logger.info("placement: %s", placement)
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
    page_size = pool.kivi_layout.group if pool.kivi else 1  # KIVI: whole key groups
    scheduler = Scheduler(
        replace(config.scheduler, grammar_mask_threads=placement.grammar_mask_threads),
        allocator,
        req_to_token,
        cache_type(allocator.free, page_size),
        vocab=vocab,
        jump=JumpForward(tokenizer, vocab),
        speculative=config.speculation,
        draft=_draft_model(config, arch, device),
    )
    if scheduler.speculator is not None and ranks is None:
        # the grammar worker's start (seconds of CPU, begun with the model's load) done
        # first: beside the timed passes it made their costs noise, and the fit gave way
        # to the fixed model
        grammars.wait_warm(CALIBRATION_QUIET_S)
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
# Seconds the calibration waits at most for the grammar worker's start to finish.
CALIBRATION_QUIET_S = 60.0


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


def _kv_bytes_per_token(pool: KVPool, tp_size: int) -> int:
    """One token's K and V in every layer, scales included, over every rank (each
    rank's pool holds its heads' share in the same format)."""
    return tp_size * pool.bytes_per_token()


def _draft_model(config: EngineConfig, arch: ArchConfig, device: str) -> DraftModel | None:
    """The draft model of ``speculative="draft"`` (None otherwise), loaded as the target
    was, with a KV pool of its own (``speculative_draft_max_total_tokens`` slots)."""
    spec = config.speculation
    if spec.speculative != "draft":
        return None
    assert spec.speculative_draft_model_path is not None  # the config checked it
    draft = DraftModel.load(
        spec.speculative_draft_model_path,
        arch.vocab_size,
        config.model.dtype,
        spec.speculative_draft_max_total_tokens,
        device=device,
        seed=config.random_seed,
        max_running_requests=config.scheduler.max_running_requests,
        kv_cache_dtype=config.cache.kv_cache_dtype,  # the draft's pool: the target's format
    )
    logger.info("draft model: %s", spec.speculative_draft_model_path)
    return draft


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
    if backend.kv_pool.kivi:  # a graph replays staged passes; a KIVI pass writes as it goes
        logger.info("CUDA graphs: off over a KIVI KV cache (%s)", backend.kv_pool.format.name)
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


def _load_tokenizer(model_dir: Path) -> Any:
    import_hub_kernels()
    from transformers import AutoTokenizer  # lazy: after import_hub_kernels()

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
        return load_token_bitmask_kernel(cache_root() / "kernels", kernel_target(config))
    except KernelBuildError as e:
        logger.warning("grammar masks: running the torch ops, as the kernel failed: %s", e)
        return None


def _cpu_paths(
    device: str,
    backend: AttentionBackend,
    small_batch: SmallBatchForward | None,
    model: torch.nn.Module,
    isa: str | None,
    rule: KernelRule | None,
) -> CpuPaths | None:
    """The paths the built runtime takes (what was built, not what was asked), logged
    in one line with ``rule``'s fallbacks (verdicts not measured on this CPU kind,
    ISA and dtype); None off the CPU."""
    if device != "cpu":
        return None
    decode, extend = attention_paths(backend)
    few_rows = KERNEL if small_batch is not None else TORCH
    elementwise = KERNEL if model.model.norm.elementwise is not None else TORCH
    used = KERNEL in (decode, extend, few_rows, elementwise)
    notes = rule.notes if rule else (NO_KERNEL_ISA + ": the torch path throughout",)
    if small_batch is not None and small_batch.max_rows < MAX_ROWS:
        notes += (f"few-row layers up to {small_batch.max_rows} rows: larger passes measured "
                  "slower than the torch path",)  # fmt: skip
    paths = CpuPaths(isa if used else None, decode, extend, few_rows, elementwise, notes=notes)
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
