"""Engine configuration: one frozen dataclass per component, composed once.

``EngineConfig.from_kwargs(**kwargs)`` takes SGLang-style flat keyword
arguments (``Engine(model_path=..., max_total_tokens=...)``) and routes each to
the component that owns it; the CLI derives its flags from the same fields.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Literal

from radixlm.runtime.config_checks import check_positive, is_number
from radixlm.runtime.constrained.config import GrammarConfig
from radixlm.runtime.errors import ConfigError
from radixlm.runtime.layers.quantization import QUANTIZATION_METHODS, Quantization
from radixlm.runtime.model_store.hub import parse_hub_id
from radixlm.runtime.reasoning.formats import AUTO, reasoning_format

__all__ = [
    "ModelConfig",
    "CacheConfig",
    "SchedulerConfig",
    "GrammarConfig",
    "LimitsConfig",
    "ParallelConfig",
    "SpeculativeConfig",
    "EngineConfig",
    "ConfigError",
    "cpu_threads_per_process",
]


DTYPES = ("auto", "float32", "bfloat16", "float16", "fp32", "bf16", "fp16")
ATTENTION_BACKENDS = ("auto", "cpu", "torch", "triton")
DEVICES = ("auto", "cpu", "cuda")
CPU_KERNEL_ISAS = ("native", "avx2", "avx512")
GGUF = "gguf"  # quantization: a GGUF file's own
# quantization: a quantized checkpoint's own method, by SGLang's and vLLM's names for it
# (radixlm reads the method from the checkpoint; naming it checks the checkpoint is so)
CHECKPOINT_QUANTIZATIONS = {
    "awq": "awq",
    "awq_marlin": "awq",
    "gptq": "gptq",
    "gptq_marlin": "gptq",
    "compressed-tensors": "compressed-tensors",
    "fp8": "fp8",
}
QUANTIZATIONS = (*QUANTIZATION_METHODS, GGUF, *CHECKPOINT_QUANTIZATIONS)
# the KV pool's formats (radixlm.runtime.mem_cache.kv_quant, a layer above this one,
# stores them; tests/runtime/test_config.py checks the two tuples agree)
KV_CACHE_DTYPES = ("auto", "int8", "fp8_e4m3", "fp8_e5m2", "kivi4", "kivi2")
KIVI_CACHE_DTYPES = ("kivi4", "kivi2")


@dataclass(frozen=True)
class ModelConfig:
    """Which model to load and how.

    model_path: a Hugging Face style directory, a ``.gguf`` file, or a hub id: ``ORG/NAME``
        (a Hugging Face repository, fetched into the hub cache: HF_HOME / HF_HUB_CACHE)
        or ``ORG/NAME-GGUF:QUANT`` (the GGUF file of that quantization in a repository
        of several); None = the embedded default model.
    revision: a hub model's branch, tag or commit (None: its default branch).
    gguf_file: the GGUF file to serve of a hub repository, by its path there.
    dtype: weights/activations dtype; "auto" = bfloat16 on GPUs, for quantized
        weights and on CPUs with native bf16 (AVX512-BF16 or AMX: faster there on
        every workload measured), float32 on other CPUs (logged at start).
    quantization: store the linear layers' weights quantized at load, from any
        safetensors checkpoint: "int8" (one scale per output channel) or "int4"
        (a scale and a zero point per ``quantization_group_size`` inputs); the
        embedding and LM head become int8 in both. "gguf": serve a GGUF file at
        its own precision (implied by a ``.gguf`` model_path; without one, the
        default model's GGUF that ``pull`` keeps): radixlm.runtime.models.gguf_loader.
        A checkpoint quantized by AWQ, GPTQ, llm-compressor or FP8 tools is served at
        its own precision whatever this says (radixlm.runtime.models.quantized_loader);
        naming its method ("awq", "gptq", "compressed-tensors", "fp8", or SGLang's
        "awq_marlin" / "gptq_marlin") checks that the checkpoint is so.
        Activations are bfloat16 with ``dtype`` "auto"; "float32" keeps them float32
        between the products (float16 only on a GPU). None: weights in ``dtype``.
        See radixlm.runtime.layers.quantization.
    quantization_group_size: inputs per int4 group: 32, 64 or 128 (it must divide
        every layer's input width; the default model's is 576: 32 or 64).
    context_length: cap on prompt + output tokens (default: the model's own).
    enable_torch_compile: run decode steps of up to ``torch_compile_max_bs``
        requests through a ``torch.compile``'d model (faster small-batch decode;
        the engine compiles at start: 2-3 minutes the first time on 2 cores in
        float32, under a minute once inductor's disk cache has it; needs a C++
        compiler on CPU).
    torch_compile_max_bs: largest decode batch that runs compiled.
    attention_backend: "cpu" attends with radixlm's C++ kernels, which read
        K/V slots in place: decode rows with the decode kernel, prefill rows
        (fresh or on a cached prefix) with the extend kernel (built on first
        use with the machine's C++ compiler, about a second each, cached under
        the radixlm cache; float32 and bfloat16); "torch" gathers K/V and
        calls torch SDPA (the reference); "triton" attends with radixlm's
        Triton kernels straight from the pool (GPUs; on a CPU only under
        ``TRITON_INTERPRET=1``, for tests); "auto" = "triton" on a GPU, "cpu"
        on a CPU when the model's dtype and head shape suit the kernels and
        they build, else "torch".
    cpu_layer_kernels: radixlm's C++ layer kernels on CPU: passes of up to 64
        tokens (decode steps of up to 64 requests, short prompts) run through the
        few-row decoder-layer kernels (float32 and bfloat16; ahead of compiled
        decode), and a float32 model's eager RMSNorm, RoPE and SwiGLU steps run
        as single C++ passes. Built like the decode kernel; where they cannot
        be built, a warning and the torch ops.
    cpu_kernel_isa: what the C++ kernels are built for: "native" (this CPU,
        ``-march=native``), "avx2" (``-march=x86-64-v3``) or "avx512"
        (``-march=x86-64-v4``); each build sizes its vectors and register tiles
        for its ISA. The named ones are for comparing builds on one machine.
        A CPU without AVX2 runs the torch path (one logged line).
    disable_cuda_graph: on a GPU, decode passes of up to ``cuda_graph_max_bs``
        rows replay CUDA graphs captured at start for a ladder of batch sizes
        (1, 2, 4, 8, then every 8 up to 256 and every 16 past it; a pass is padded
        up to the next), when the attention backend can be captured ("triton");
        this turns them off.
    cuda_graph_max_bs: the largest captured decode batch; None (the default):
        ``max_running_requests``, so every decode pass replays a graph. A larger
        value is capped there (no pass has more rows than running requests).
    reasoning_parser: how replies mark their reasoning section (``<think>...</think>``):
        "auto" detects it from the chat template (none when the template writes no
        such markers), "none" turns it off, or a family's name ("deepseek-r1",
        "qwen3", "think", ...: radixlm.runtime.reasoning.REASONING_FORMATS). With one,
        a request's constraint applies to the answer after the section, and the HTTP
        routes return the section as ``reasoning_content``.
    """

    model_path: str | None = None
    revision: str | None = None
    gguf_file: str | None = None
    dtype: str = "auto"
    quantization: str | None = None
    quantization_group_size: int = 32
    context_length: int | None = None
    enable_torch_compile: bool = False
    torch_compile_max_bs: int = 32
    attention_backend: str = "auto"
    cpu_layer_kernels: bool = True
    cpu_kernel_isa: str = "native"
    disable_cuda_graph: bool = False
    cuda_graph_max_bs: int | None = None
    reasoning_parser: str = "auto"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.quantization not in (None, *QUANTIZATIONS):
            raise ConfigError(
                f"quantization must be one of {QUANTIZATIONS}, got {self.quantization!r}"
            )
        try:
            self.weight_quantization()
        except ValueError as e:
            raise ConfigError(str(e)) from e
        if self.from_gguf() and self.quantization not in (None, GGUF):
            raise ConfigError(
                f"a GGUF file's weights keep the file's own quantization; drop quantization "
                f"{self.quantization!r} (or convert the file and quantize the directory)"
            )
        check_positive("context_length", self.context_length, optional=True)
        if not isinstance(self.enable_torch_compile, bool):
            raise ConfigError(
                f"enable_torch_compile must be a bool, got {self.enable_torch_compile!r}"
            )
        check_positive("torch_compile_max_bs", self.torch_compile_max_bs)
        if not isinstance(self.cpu_layer_kernels, bool):
            raise ConfigError(f"cpu_layer_kernels must be a bool, got {self.cpu_layer_kernels!r}")
        if self.cpu_kernel_isa not in CPU_KERNEL_ISAS:
            raise ConfigError(
                f"cpu_kernel_isa must be one of {CPU_KERNEL_ISAS}, got {self.cpu_kernel_isa!r}"
            )
        if not isinstance(self.disable_cuda_graph, bool):
            raise ConfigError(f"disable_cuda_graph must be a bool, got {self.disable_cuda_graph!r}")
        check_positive("cuda_graph_max_bs", self.cuda_graph_max_bs, optional=True)
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ConfigError(
                f"attention_backend must be one of {ATTENTION_BACKENDS}, "
                f"got {self.attention_backend!r}"
            )
        _check_reasoning_parser(self.reasoning_parser)

    def from_gguf(self) -> bool:
        """Whether the weights come from a GGUF file, at its own precision."""
        path = str(self.model_path or "")
        hub_id = parse_hub_id(path)  # ORG/NAME-GGUF:QUANT names a GGUF file
        hub_gguf = hub_id is not None and (hub_id.quant is not None or self.gguf_file is not None)
        return self.quantization == GGUF or path.endswith(".gguf") or hub_gguf

    def weight_quantization(self) -> Quantization | None:
        """``quantization`` and its group size as the layers take them (None: float,
        or a GGUF file's or quantized checkpoint's own)."""
        if self.quantization in (None, GGUF, *CHECKPOINT_QUANTIZATIONS):
            return None
        return Quantization(self.quantization, self.quantization_group_size)  # type: ignore[arg-type]


@dataclass(frozen=True)
class CacheConfig:
    """KV pool size: ``max_total_tokens`` slots, else ``kv_memory_gb`` worth of them,
    else (the default) 2 GiB on a CPU and, on a GPU, what ``mem_fraction_static``
    of its memory leaves once the weights are in (SGLang's rule: weights + KV pool
    take that share of the GPU's total memory; the rest is for activations, CUDA
    graphs and other processes).

    disable_radix_cache: the no-sharing baseline: no prefix is ever reused (same
        code paths, a cache that keeps nothing).
    kv_cache_dtype: how the pool stores K and V: "auto" (the model's dtype), or one
        byte per value with a float32 scale per token and head: "int8", "fp8_e4m3",
        "fp8_e5m2" (radixlm.runtime.mem_cache.kv_quant). A quantized pool holds about
        twice a bfloat16 pool's tokens in the same memory (``kv_memory_gb``). "kivi4" and
        "kivi2": KIVI's 4- and 2-bit codes (radixlm.runtime.mem_cache.kivi), keys per
        channel over groups of 32 positions, values per token, the positions past a
        sequence's last whole group in float: about 3.2x (kivi4) and 5.3x (kivi2) a
        bfloat16 pool's tokens at head dim 64; the radix cache then shares whole groups
        of 32 tokens. No compiled decode step or speculation with them.
    """

    max_total_tokens: int | None = None
    kv_memory_gb: float | None = None
    mem_fraction_static: float = 0.85
    disable_radix_cache: bool = False
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        check_positive("max_total_tokens", self.max_total_tokens, optional=True)
        if self.kv_memory_gb is not None and not is_number(self.kv_memory_gb, above=0):
            raise ConfigError(f"kv_memory_gb must be > 0, got {self.kv_memory_gb!r}")
        if not (is_number(self.mem_fraction_static, above=0) and self.mem_fraction_static < 1):
            raise ConfigError(
                f"mem_fraction_static must be in (0, 1), got {self.mem_fraction_static!r}"
            )
        if not isinstance(self.disable_radix_cache, bool):
            raise ConfigError(
                f"disable_radix_cache must be a bool, got {self.disable_radix_cache!r}"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(
                f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, "
                f"got {self.kv_cache_dtype!r}"
            )


@dataclass(frozen=True)
class SchedulerConfig:
    """Continuous batching limits.

    chunked_prefill_size: the token budget of one pass (long prompts are split
        into chunks of it). Decoding requests take one token each, prompts share
        the rest (never less than half of it): the chunks of prompts already
        running, and, while requests are queued, up to half for admitting them,
        so a short request is not held behind a long prompt's prefill.
    max_running_requests: most requests holding KV at once.
    init_new_token_ratio, min_new_token_ratio, new_token_ratio_decay_steps: the
        decode room admission keeps (SGLang's ``new_token_ratio``). A request is
        admitted only if its prompt plus ``ratio * max_new_tokens`` fits beside
        what every running request may still need (its uncomputed prompt plus
        ``ratio`` of its remaining new tokens), so a tight pool runs fewer requests
        at once instead of retracting them. The ratio starts at the initial value
        and falls linearly to the minimum over the decay steps (passes); whenever
        a decode has to retract a request it moves halfway to 1 and falls again.
    schedule_policy: "lpm" (longest cached prefix first) or "fcfs".
    lpm_max_wait_steps: under lpm, a request queued longer than this many steps
        is admitted before any other (anti-starvation).
    lpm_max_queue_len: past this many queued requests lpm falls back to FCFS
        (lpm looks every queued request up in the radix tree each step).
    max_n: the most samples (``n``) one request may ask for; each is a request of
        its own, so one call cannot flood the queue.
    overlap_grammar_masks: fill each pass's grammar bitmask on threads of their own
        while the model computes the pass (radixlm.runtime.scheduling.mask_worker);
        off: in the engine loop before the pass.
    grammar_mask_threads: the threads that fill a pass's grammar masks beside it, each
        a contiguous run of the constrained rows (llguidance and xgrammar release the
        GIL while they fill; outlines-core does not). None (the default) lets the
        engine choose for its device: 1 on the CPU, where the model's OpenMP team
        holds every core while the masks fill; on a GPU, the cores this process gets
        less one for the engine loop, at most 4 (benchmarks/bench_mask_fill.py
        measures the fill against the threads). Unused with ``overlap_grammar_masks``
        off.
    target_tpot_ms: while requests decode, each pass takes only as many prompt tokens
        as keep it within this many milliseconds, the decoding requests' time per
        output token (the pass's time is fitted online from the passes run:
        radixlm.runtime.scheduling.pass_pace); a pass without decodes keeps the whole
        ``chunked_prefill_size``. None: no bound (a decode waits out every prompt chunk
        beside it). Trades time to first token under load for a steady stream.
    overlap_schedule: "on": the engine loop schedules and launches pass N+1 before it
        reads pass N's sampled ids (decodes carry them on the device), and applies N's
        results while N+1 runs; "off": one pass at a time; "auto" (the default): on
        for a CUDA engine, off on the CPU, where a pass runs on the loop thread itself
        and nothing overlaps (benchmarks/bench_overlap.py measures both).
    """

    max_running_requests: int = 128
    chunked_prefill_size: int = 1024
    init_new_token_ratio: float = 0.7
    min_new_token_ratio: float = 0.1
    new_token_ratio_decay_steps: int = 600
    schedule_policy: str = "lpm"
    lpm_max_wait_steps: int = 256
    lpm_max_queue_len: int = 128
    max_n: int = 64
    overlap_grammar_masks: bool = True
    grammar_mask_threads: int | None = None
    overlap_schedule: Literal["auto", "on", "off"] = "auto"
    target_tpot_ms: float | None = None

    def __post_init__(self) -> None:
        check_positive("max_running_requests", self.max_running_requests)
        if self.target_tpot_ms is not None and not is_number(self.target_tpot_ms, above=0):
            raise ConfigError(f"target_tpot_ms must be > 0 or None, got {self.target_tpot_ms!r}")
        check_positive("chunked_prefill_size", self.chunked_prefill_size)
        check_positive("new_token_ratio_decay_steps", self.new_token_ratio_decay_steps)
        ratios = (self.min_new_token_ratio, self.init_new_token_ratio)
        if not all(isinstance(r, int | float) and not isinstance(r, bool) for r in ratios) or not (
            0 <= self.min_new_token_ratio <= self.init_new_token_ratio <= 1
        ):
            raise ConfigError(
                "need 0 <= min_new_token_ratio <= init_new_token_ratio <= 1, got "
                f"{self.min_new_token_ratio!r} and {self.init_new_token_ratio!r}"
            )
        check_positive("lpm_max_wait_steps", self.lpm_max_wait_steps)
        check_positive("lpm_max_queue_len", self.lpm_max_queue_len)
        check_positive("max_n", self.max_n)
        if self.schedule_policy not in ("lpm", "fcfs"):
            raise ConfigError(
                f"schedule_policy must be 'lpm' or 'fcfs', got {self.schedule_policy!r}"
            )
        if not isinstance(self.overlap_grammar_masks, bool):
            raise ConfigError(
                f"overlap_grammar_masks must be a bool, got {self.overlap_grammar_masks!r}"
            )
        check_positive("grammar_mask_threads", self.grammar_mask_threads, optional=True)
        if self.overlap_schedule not in ("auto", "on", "off"):
            raise ConfigError(
                f"overlap_schedule must be 'auto', 'on' or 'off', got {self.overlap_schedule!r}"
            )


@dataclass(frozen=True)
class LimitsConfig:
    """What one request may cost, whoever sends it (the server's clients, a DSL
    program, ``Engine.generate``); past a limit the request is refused with a
    ``RequestLimitError`` (HTTP 400) naming the limit, before anything is queued.

    max_stop_string_chars: the longest stop string, in characters.
    max_stop_chars: all of a request's stop strings together, in characters.
    max_stop_regex_size: all of a request's ``stop_regex`` patterns together, in the
        positions they expand to (``regex_size.expanded_size``: counted repeats
        multiplied through nesting, ``(a{1000}){1000}`` is 1,000,000), since a compiled
        pattern holds ~250 bytes per position whatever its length.
    max_top_logprobs_num: the most alternatives per position (``top_logprobs_num``;
        OpenAI's ``top_logprobs``), as OpenAI and vLLM cap it.
    max_logprob_entries: the most logprob entries one call's outputs may hold: over
        every sample, each reported prompt position and each possible output token
        counts ``1 + top_logprobs_num``. An entry is about 35 bytes of JSON (70 with
        ``return_text_in_logprobs``), so the default bounds a response near 7 MB.
    max_json_depth: the deepest nesting of arrays and objects in any JSON a request
        carries as text or as a schema (``json_schema``, ``structural_tag``, a tool
        call's ``arguments``).
    """

    max_stop_string_chars: int = 1024
    max_stop_chars: int = 4096
    max_stop_regex_size: int = 8192
    max_top_logprobs_num: int = 20
    max_logprob_entries: int = 200_000
    max_json_depth: int = 128

    def __post_init__(self) -> None:
        for part in dataclasses.fields(self):
            check_positive(part.name, getattr(self, part.name))


@dataclass(frozen=True)
class ParallelConfig:
    """Tensor parallelism over ``torch.distributed`` (gloo on CPUs, NCCL on GPUs).

    tp_size: ranks one model is split over (attention and KV heads, the MLP, the
        experts and the vocabulary; radixlm.runtime.distributed). Rank 0 runs the
        scheduler and sends each pass to the others; ``Engine(tp_size=N)`` starts the
        ranks of this node as child processes.
    nnodes, node_rank: machines the ranks span, and which one this is (each runs
        ``tp_size / nnodes`` ranks; node 0 holds rank 0 and serves, the others only
        compute), as SGLang's flags.
    dist_init_addr: ``host:port`` of rank 0's rendezvous (default: 127.0.0.1 and a
        free port, one node only).
    dist_timeout_s: how long a collective may wait for a peer before the rank fails
        (a peer that died is seen at once, by its closed connection).
    """

    tp_size: int = 1
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None
    dist_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        check_positive("tp_size", self.tp_size)
        check_positive("nnodes", self.nnodes)
        check_positive("node_rank", self.node_rank, minimum=0)
        if self.node_rank >= self.nnodes:
            raise ConfigError(f"node_rank must be < nnodes ({self.nnodes}), got {self.node_rank}")
        if self.tp_size % self.nnodes:
            raise ConfigError(
                f"tp_size ({self.tp_size}) must be a multiple of nnodes ({self.nnodes})"
            )
        if self.dist_init_addr is not None:
            host, _, port = str(self.dist_init_addr).rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ConfigError(f"dist_init_addr must be host:port, got {self.dist_init_addr!r}")
        elif self.nnodes > 1:
            raise ConfigError("nnodes > 1 needs dist_init_addr (rank 0's host:port)")
        if not is_number(self.dist_timeout_s, above=0):
            raise ConfigError(f"dist_timeout_s must be > 0 seconds, got {self.dist_timeout_s!r}")

    @property
    def ranks_per_node(self) -> int:
        return self.tp_size // self.nnodes


SPECULATIVE_ALGORITHMS = ("ngram", "draft")


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding (radixlm.runtime.speculative, docs/speculative.md).

    speculative: None (off); "ngram": proposals from the request's own prompt and
        output (prompt lookup) and the radix tree's cached continuations; "draft": a
        small model with the target's vocabulary proposes (``speculative_draft_model_path``).
        Proposals are verified K at a time in the pass that decodes the request: greedy
        outputs are the same token for token, sampled ones follow the same distribution.
    speculative_draft_model_path: the draft model (a directory or GGUF file), for "draft".
    speculative_draft_max_total_tokens: KV slots of the draft's own pool (it keeps
        each running request's sequence; least recently used requests give theirs up).
    speculative_num_tokens: K, the most tokens proposed per request and step (1-16);
        a request may ask for fewer (``SamplingParams.speculative_num_tokens``).
    speculative_ngram_min, speculative_ngram_max: the shortest and longest suffix of
        the history the n-gram proposer looks up (the longest is tried first).
    speculative_adaptive: pick each request's K per step from its acceptance rate
        (down to 0, with a probe now and then); off: always propose K when found.
    speculative_token_cost: what one more token in a pass costs, as a share of a
        one-token decode pass; the adaptive K weighs expected tokens against it
        (``benchmarks/bench_speculative.py`` measures it; 0.1 on a 2-core CPU) when
        the pass costs are not measured.
    speculative_calibrate: time a few scratch passes at start-up (decode and verify
        passes by rows and tokens, ``radixlm.runtime.speculative.cost``) and plan with
        those times, so that a batch size at which speculation cannot pay proposes
        nothing; off (tests, tensor parallelism): ``speculative_token_cost``.
    """

    speculative: str | None = None
    speculative_draft_model_path: str | None = None
    speculative_draft_max_total_tokens: int = 16384
    speculative_num_tokens: int = 4
    speculative_ngram_min: int = 1
    speculative_ngram_max: int = 3
    speculative_adaptive: bool = True
    speculative_token_cost: float = 0.1
    speculative_calibrate: bool = True

    def __post_init__(self) -> None:
        name = self.speculative
        if isinstance(name, str):
            name = name.lower()  # SGLang spells it NGRAM
            object.__setattr__(self, "speculative", name)
        if name is not None and name not in SPECULATIVE_ALGORITHMS:
            raise ConfigError(
                f"speculative must be one of {SPECULATIVE_ALGORITHMS} or None, got "
                f"{self.speculative!r}"
            )
        draft_path = self.speculative_draft_model_path
        if name == "draft" and not draft_path:
            raise ConfigError('speculative="draft" needs speculative_draft_model_path')
        if draft_path is not None and name != "draft":
            raise ConfigError(
                f'speculative_draft_model_path is for speculative="draft", got {name!r}'
            )
        check_positive(
            "speculative_draft_max_total_tokens", self.speculative_draft_max_total_tokens
        )
        check_positive("speculative_num_tokens", self.speculative_num_tokens)
        if self.speculative_num_tokens > MAX_SPECULATIVE_TOKENS:
            raise ConfigError(
                f"speculative_num_tokens must be <= {MAX_SPECULATIVE_TOKENS}, got "
                f"{self.speculative_num_tokens}"
            )
        check_positive("speculative_ngram_min", self.speculative_ngram_min)
        check_positive("speculative_ngram_max", self.speculative_ngram_max)
        if self.speculative_ngram_min > self.speculative_ngram_max:
            raise ConfigError(
                "need speculative_ngram_min <= speculative_ngram_max, got "
                f"{self.speculative_ngram_min} and {self.speculative_ngram_max}"
            )
        if not isinstance(self.speculative_adaptive, bool):
            raise ConfigError(
                f"speculative_adaptive must be a bool, got {self.speculative_adaptive!r}"
            )
        cost = self.speculative_token_cost
        if not is_number(cost, above=-1e-12) or cost > 1:
            raise ConfigError(f"speculative_token_cost must lie in [0, 1], got {cost!r}")
        if not isinstance(self.speculative_calibrate, bool):
            raise ConfigError(
                f"speculative_calibrate must be a bool, got {self.speculative_calibrate!r}"
            )

    @property
    def enabled(self) -> bool:
        return self.speculative is not None


# the most proposals one request verifies in a pass (per-request masks and logits
# rows grow with it; past ~8 a CPU pass stops being nearly free)
MAX_SPECULATIVE_TOKENS = 16


@dataclass(frozen=True)
class EngineConfig:
    """Everything an Engine needs, validated once.

    num_threads: torch intra-op threads of each rank, set once when the engine starts
        (None = ``cpu_threads_per_process``: the cores this process may run on, shared
        evenly by the tensor-parallel ranks on this node).
    random_seed: seed of the sampler's shared generator (rows without their own seed).
    device: "cuda" puts the model, the KV pool and ``req_to_token`` on the GPU
        (the current CUDA device); "cpu" keeps everything on the host; "auto"
        (the default) is "cuda" when torch sees a GPU, else "cpu".
    """

    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    grammar: GrammarConfig = field(default_factory=GrammarConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    speculation: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    num_threads: int | None = None
    random_seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"

    def __post_init__(self) -> None:
        check_positive("num_threads", self.num_threads, optional=True)
        if self.device not in DEVICES:
            raise ConfigError(f"device must be one of {DEVICES}, got {self.device!r}")
        if self.cache.kv_cache_dtype in KIVI_CACHE_DTYPES:
            self._check_kivi()

    def _check_kivi(self) -> None:
        """A KIVI pool's windows and key groups are written as each pass goes, pass by
        pass: no step may hold its writes back (a compiled decode step) or write tokens
        it may take back (speculation). Raises ConfigError naming the clash."""
        name = self.cache.kv_cache_dtype
        if self.model.enable_torch_compile:
            raise ConfigError(
                f"kv_cache_dtype={name!r} cannot run with enable_torch_compile: a compiled "
                "decode step stages its K/V, and a KIVI pass writes its windows as it goes"
            )
        if self.speculation.speculative is not None:
            raise ConfigError(
                f"kv_cache_dtype={name!r} cannot run with speculative="
                f"{self.speculation.speculative!r}: a KIVI pool quantizes a key group the "
                "moment its tokens are written, so rejected draft tokens cannot be taken back"
            )

    @property
    def resolved_num_threads(self) -> int:
        return self.num_threads or cpu_threads_per_process(self.parallel.ranks_per_node)

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineConfig:
        """Builds a config from flat keyword arguments; unknown names raise ConfigError."""
        parts: dict[str, dict[str, Any]] = {part: {} for part in _SUB_CONFIGS}
        top: dict[str, Any] = {}
        owners = {name: part for part, sub in _SUB_CONFIGS.items() for name in _field_names(sub)}
        for name, value in kwargs.items():
            if name in owners:
                parts[owners[name]][name] = value
            elif name in _field_names(cls) and name not in _SUB_CONFIGS:
                top[name] = value
            else:
                raise ConfigError(f"unknown engine option {name!r}")
        subs = {part: _SUB_CONFIGS[part](**values) for part, values in parts.items()}
        return cls(**subs, **top)

    @staticmethod
    def flat_fields() -> list[dataclasses.Field]:
        """Every leaf option (what the CLI exposes as --flags)."""
        fields = [f for sub in _SUB_CONFIGS.values() for f in dataclasses.fields(sub)]
        return fields + [f for f in dataclasses.fields(EngineConfig) if f.name not in _SUB_CONFIGS]


_SUB_CONFIGS: dict[str, type] = {
    "model": ModelConfig,
    "cache": CacheConfig,
    "scheduler": SchedulerConfig,
    "grammar": GrammarConfig,
    "limits": LimitsConfig,
    "parallel": ParallelConfig,
    "speculation": SpeculativeConfig,
}


def cpu_threads_per_process(processes: int) -> int:
    """The one rule for sharing this machine's cores: each of ``processes`` engine
    processes (tensor-parallel ranks, ``--dp`` replicas) gets an equal share, at
    least one thread."""
    return max(1, usable_cores() // max(1, processes))


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (``taskset``, a container's
    cpuset, a test worker's pin), not every core the machine has."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no sched_getaffinity (macOS)
        return os.cpu_count() or 1


def _check_reasoning_parser(name: object) -> None:
    if not isinstance(name, str):
        raise ConfigError(f"reasoning_parser must be a str, got {name!r}")
    if name not in (AUTO, "none"):
        try:
            reasoning_format(name)
        except ValueError as e:
            raise ConfigError(str(e)) from e


def _field_names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}
