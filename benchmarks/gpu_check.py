"""The GPU check: radixlm's CUDA path on one GPU, in one prepared run, one table.

Needs only what a bare GPU machine has (torch, triton, transformers, safetensors,
numpy) and this checkout: radixlm is imported from the source tree when it is
not installed, and the model is a random-weight Llama of about 1B parameters
(Llama-3.2-1B's shape, bfloat16) written to a temporary directory, with a
word-level tokenizer of its 128,256-token vocabulary. No network. The constrained and
serving sections need more (a grammar backend, the server's packages, the default
model's tokenizer): benchmarks/fetch_gpu_wheels.py puts them in benchmarks/.gpu_carry
(git-ignored; carried to the GPU machine), whose wheels the check installs into its
temporary directory when their imports are missing; without them those sections are
a row saying why.

Sections, in order (each row: what, figure, unit, target, verdict):

  kernels   the Triton decode and extend attention kernels against their
            plain-torch references at realistic shapes (ragged batches, cached
            prefixes, GQA), and the masked-sampling kernel against its reference
            (the same token ids)
  sampling  the masked-sampling kernel's time per call, back to back: 128 rows,
            128,256 tokens, a grammar bitmask,
              temperature 0.7, top-k 50, top-p 0.9               target < 100 us
              greedy rows (temperature 0, top-k / top-p off)     target < 30 us
  ceilings  measured here: device copy bandwidth (a 4 GiB device-to-device copy,
            bytes read + written per second) and the matrix rate (8192^3, bf16)
  floors    decode attention at batch 64 over 4,096-token contexts (the 1B shape's
            heads) against reading its K and V once at the copy bandwidth
                                                                 target <= 1.5x
            (after the engines) the 1B shape's decode step at batch 1 against
            reading its weights once                             target <= 2x
  outputs   the engines' greedy tokens on fixed prompts: CUDA graphs on and off
            alike (target: all), Triton and torch backends (bfloat16 near-ties
            may flip; no target)
  engine    the engine on the random model, Triton backend (CUDA graphs on) vs
            the torch backend, one engine at a time:
              decode throughput at batch 1, 32 and 128           target b128 >= 3x
              prefill throughput, 4,096 tokens
              decode step time at batch 1, CUDA graphs on vs off target >= 1.5x
              the few-shot workload with and without the radix cache
                                                                 target >= 5x
              decode throughput with n-gram speculation vs none at each decode
              batch size (its pass costs measured at start-up)
                                                                 target >= 1.0x
              its acceptance rate and greedy tokens (a random model's text
              repeats itself)
              decode throughput with overlap scheduling (the default) vs one
              pass at a time, and their greedy tokens      target: the same
            then transformers' ``generate`` with a static cache (greedy, the same
            prompts' lengths and new tokens) on the same weights, loaded from the
            directory the check wrote: decode throughput at batch 1, 32 and 128,
            and the Triton engine's over it             target b32 >= 1.3x, b128 >= 2x

  traffic   the engine's decode steps under torch.profiler, at batch 1 and
            the largest decode batch: device synchronisations per step     target <= 1
            host <-> device copies per step, same at every batch      target equal
            host time and device (kernel) time per step, and the step time
            against the larger of the two (overlap scheduling)   target <= 1.1
  constrained  the 1B shape with the default model's BPE tokenizer (49,152 tokens):
            decode throughput at batch 64 with every request under a regex (outlines)
            over the same unconstrained                          target >= 0.9
  floors    the decode step at batch 1 on Llama-3.1-8B's shape with 8 of its 32
            layers (written and loaded in the budget; fixed per-step costs weigh more
            than on the whole model) against reading its weights once
                                                                 target <= 1.2x
  serving   bench_serving.py's workload through the Engine in-process and through
            ``radixlm serve`` over loopback HTTP (both up at once, fixed KV pools):
            output tok/s of each, their ratio, median TPOT of each

A weight-read floor counts every weight byte but an untied input embedding table's
(a step reads only its rows). --skip leaves out transformers, traffic, constrained,
llama8b or serving (a row says so); the default --budget-s (540) keeps the run inside a
device call's 10 minutes.

``--dry-run`` runs every section on the CPU with tiny sizes (the Triton kernels
through ``TRITON_INTERPRET=1``): a test of this script, not a measurement; no
target is judged.

Usage: python benchmarks/gpu_check.py [--dry-run] [--out PATH] [--budget-s 540]
       [--skip SECTION ...] [--carry benchmarks/.gpu_carry]
Prints the table and writes benchmarks/results/gpu_check.json (dry run:
gpu_check_dry_run.json). A part that raises is a failed row and the rest still
runs; past the time budget the run writes what it has and exits with status 124.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def import_radixlm(scratch: Path) -> None:
    """Makes ``import radixlm`` work: the installed package, else this checkout laid
    out as the package (``lang`` is ``radixlm``, ``runtime`` and ``kernels`` its
    sub-packages, as pyproject.toml maps them) through a tree of symlinks, also put
    on ``PYTHONPATH`` for the engine's worker processes."""
    try:
        importlib.import_module("radixlm")
        return
    except ImportError:
        pass
    package = scratch / "src" / "radixlm"
    package.mkdir(parents=True, exist_ok=True)
    links = {p.name: p for p in (ROOT / "lang").iterdir() if p.name != "__pycache__"}
    links.update(runtime=ROOT / "runtime", kernels=ROOT / "kernels")
    for name, target in links.items():
        (package / name).symlink_to(target)
    sys.path.insert(0, str(package.parent))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(package.parent), os.environ.get("PYTHONPATH")) if p
    )
    importlib.import_module("radixlm")


@dataclass(frozen=True)
class Sizes:
    """Everything the check's size depends on."""

    device: str
    model: dict  # HF LlamaConfig fields
    dtype: str
    # kernels: (batch, heads, kv heads, head dim, longest context) per shape
    kernel_shapes: tuple[tuple[int, int, int, int, int], ...]
    sampling_rows: int
    sampling_vocab: int
    sampling_repeats: int  # calls per timed round of a device operation (_call_s)
    decode_batches: tuple[int, ...]
    decode_prompt: int  # tokens per decode request's prompt
    decode_steps: int
    prefill_tokens: int
    graph_steps: int  # batch-1 decode steps timed with graphs on and off
    fewshot_prefix: int  # the shared few-shot examples, tokens
    fewshot_questions: int
    fewshot_question_tokens: int
    fewshot_new_tokens: int
    repeats: int  # timed runs per engine figure (median)
    agreement_rows: int  # fixed prompts whose greedy outputs the engines compare
    copy_bytes: int  # the device-to-device copy that measures bandwidth
    matmul_n: int  # the n x n x n matrix product that measures the matrix rate
    attention_floor: tuple[int, int]  # decode attention against its floor: (batch, context)
    model_8b: dict  # the 8B shape, with fewer layers where the time budget needs it
    constrained_model: dict  # the 1B shape with the default model's tokenizer
    constrained_batch: int
    serving: dict  # bench_serving's workload flags (engine in-process and over HTTP)
    engine: dict = field(default_factory=dict)  # extra Engine options


LLAMA_1B = {
    "vocab_size": 128256,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "tie_word_embeddings": True,
}

# Llama-3.1-8B's shape (16.06 GB in bfloat16); FULL keeps LLAMA_8B_LAYERS of its 32 layers
# so writing and loading it fits the run (the row names how many).
LLAMA_8B = {
    **LLAMA_1B,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "head_dim": 128,
    "tie_word_embeddings": False,
}
LLAMA_8B_LAYERS = 8
# the default model's (SmolLM2) BPE vocabulary: the constrained and serving sections
BPE_VOCAB = 49152

FULL = Sizes(
    device="cuda",
    model=LLAMA_1B,
    dtype="bfloat16",
    kernel_shapes=((32, 32, 8, 64, 4096), (8, 32, 8, 128, 2048), (4, 28, 4, 128, 1024)),
    sampling_rows=128,
    sampling_vocab=128256,
    sampling_repeats=50,
    decode_batches=(1, 32, 128),
    decode_prompt=64,
    decode_steps=64,
    prefill_tokens=4096,
    graph_steps=128,
    fewshot_prefix=2000,
    fewshot_questions=64,
    fewshot_question_tokens=24,
    fewshot_new_tokens=8,
    repeats=3,
    agreement_rows=8,
    copy_bytes=4 << 30,
    matmul_n=8192,
    attention_floor=(64, 4096),
    model_8b={**LLAMA_8B, "num_hidden_layers": LLAMA_8B_LAYERS},
    constrained_model={**LLAMA_1B, "vocab_size": BPE_VOCAB},
    constrained_batch=64,
    serving={
        "num_prompts": 256,
        "random_input_len": 256,
        "random_output_len": 128,
        "max_concurrency": 64,
        # both engines are up at once: each takes a fixed KV pool, not a share of memory
        "max_total_tokens": 65536,
    },
    engine={"chunked_prefill_size": 8192, "max_running_requests": 256},
)

DRY = Sizes(
    device="cpu",
    model={
        **LLAMA_1B,
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 256,
    },
    dtype="float32",
    kernel_shapes=((3, 4, 2, 64, 40), (2, 6, 2, 80, 24)),
    sampling_rows=4,
    sampling_vocab=300,
    sampling_repeats=2,
    decode_batches=(1, 3),
    decode_prompt=4,
    decode_steps=3,
    prefill_tokens=24,
    graph_steps=3,
    fewshot_prefix=16,
    fewshot_questions=3,
    fewshot_question_tokens=3,
    fewshot_new_tokens=2,
    repeats=1,
    agreement_rows=2,
    copy_bytes=1 << 20,
    matmul_n=64,
    attention_floor=(1, 16),
    model_8b={},  # set below: the tiny model, untied
    constrained_model={},  # set below: the tiny model with the BPE vocabulary
    constrained_batch=3,
    serving={
        "num_prompts": 4,
        "random_input_len": 8,
        "random_output_len": 4,
        "max_concurrency": 4,
        "max_total_tokens": 1024,
    },
    # The C++ few-row kernels would take every tiny pass: off, so the backends attend.
    # The speculative engine's start-up calibration times some 20 scratch passes over a
    # 128-token context, through the Triton interpreter most of a dry run, for pass costs
    # that say nothing of a GPU's: off, so the planner takes its fixed model (the
    # calibration has its own tests: tests/runtime/speculative/test_cost.py).
    engine={
        "max_total_tokens": 1024,
        "chunked_prefill_size": 64,
        "max_running_requests": 8,
        "cpu_layer_kernels": False,
        "speculative_calibrate": False,
    },
)
DRY = replace(
    DRY,
    model_8b={**DRY.model, "tie_word_embeddings": False},
    constrained_model={**DRY.model, "vocab_size": BPE_VOCAB},
)


@dataclass(frozen=True)
class Row:
    """One line of the table. value: the figure (a ratio, a time, a rate, or the
    largest error over its bound); passed: None where there is no target (or a dry run)."""

    section: str
    name: str
    value: float
    unit: str
    target: str = ""
    passed: bool | None = None


# ---- kernels ------------------------------------------------------------------------------


def kernel_rows(sizes: Sizes) -> list[Row]:
    """Each Triton kernel against its plain-torch reference on ``sizes.device``:
    attention as (largest error) / (a bound from the pool dtype's rounding), the
    sampling kernel as the share of rows whose token id equals its slow exact path's (no
    candidates gathered, no rejection rounds: the same token by construction)."""
    import torch

    from radixlm.kernels.paged_attention import (
        decode_attention_reference,
        extend_attention_reference,
    )
    from radixlm.kernels.triton import (
        decode_attention_triton,
        extend_attention_triton,
        masked_sample_triton,
    )

    dtype = getattr(torch, sizes.dtype)
    rows: list[Row] = []
    for b, h, hkv, d, longest in sizes.kernel_shapes:
        case = _attention_case(b, h, hkv, d, longest, dtype, sizes.device)
        decode = decode_attention_triton(*case.decode_args())
        ref = decode_attention_reference(*case.decode_args())
        max_v = float(case.v_pool.float().abs().max())
        name = f"decode attention B={b} H={h}/{hkv} D={d}"
        rows.append(_error_row(name, decode, ref, dtype, max_v))
        extend = extend_attention_triton(*case.extend_args())
        ref = extend_attention_reference(*case.extend_args())
        name = f"extend attention B={b} H={h}/{hkv} D={d}"
        rows.append(_error_row(name, extend, ref, dtype, max_v))
    args = _sampling_args(sizes)
    seeds = (args[5] * 2**31).long()  # the kernel draws from seeds, not uniforms
    fast = masked_sample_triton(*args[:5], seeds)
    slow = masked_sample_triton(*args[:5], seeds, max_rounds=0, capacity=1)
    same = (fast == slow).float().mean()
    rows.append(
        Row(
            "kernels",
            f"masked sampling {sizes.sampling_rows} x {sizes.sampling_vocab}: ids equal",
            float(same),
            "share",
            ">= 0.99",
            float(same) >= 0.99,
        )
    )
    return rows


@dataclass(frozen=True)
class _AttentionCase:
    """A ragged batch on a pool with scattered slots: every request has a cached
    prefix (the first two none) and new tokens, the decode view one new token each."""

    q_decode: object
    q: object
    k: object
    v: object
    k_pool: object
    v_pool: object
    req_to_token: object
    rows: object
    prefix_lens: object
    extend_lens: object
    extend_starts: object
    max_extend: int
    scale: float

    def decode_args(self) -> tuple:
        seq_lens = self.prefix_lens + self.extend_lens  # the new tokens are in the pool
        return (
            self.q_decode,
            self.k_pool,
            self.v_pool,
            self.req_to_token,
            self.rows,
            seq_lens,
            self.scale,
        )

    def extend_args(self) -> tuple:
        return (
            self.q,
            self.k,
            self.v,
            self.k_pool,
            self.v_pool,
            self.req_to_token,
            self.rows,
            self.prefix_lens,
            self.extend_lens,
            self.extend_starts,
            self.max_extend,
            self.scale,
        )


def _attention_case(
    b: int, h: int, hkv: int, d: int, longest: int, dtype, device: str
) -> _AttentionCase:
    import torch

    gen = torch.Generator().manual_seed(b * 1000 + d)
    seq = torch.randint(max(2, longest // 4), longest + 1, (b,), generator=gen)
    extend = torch.clamp(seq // 4, min=1)
    prefix = seq - extend
    prefix[:2] = 0  # fresh prefills too
    seq = prefix + extend
    total = int(seq.sum())
    slots = torch.randperm(total, generator=gen) + 1  # slot 0 pads
    table = torch.zeros(b, int(seq.max()), dtype=torch.int64)
    starts = torch.cumsum(seq, 0) - seq
    for i in range(b):
        table[i, : seq[i]] = slots[starts[i] : starts[i] + seq[i]]
    pool_shape = (total + 1, hkv, d)
    k_pool = torch.randn(pool_shape, generator=gen).to(dtype)
    v_pool = torch.randn(pool_shape, generator=gen).to(dtype)
    new_index = torch.cat([table[i, prefix[i] : seq[i]] for i in range(b)])
    q = torch.randn(int(extend.sum()), h, d, generator=gen).to(dtype)
    q_decode = torch.randn(b, h, d, generator=gen).to(dtype)

    def dev(t):
        return t.to(device)

    return _AttentionCase(
        q_decode=dev(q_decode),
        q=dev(q),
        k=dev(k_pool[new_index]),
        v=dev(v_pool[new_index]),
        k_pool=dev(k_pool),
        v_pool=dev(v_pool),
        req_to_token=dev(table),
        rows=dev(torch.arange(b)),
        prefix_lens=dev(prefix),
        extend_lens=dev(extend),
        extend_starts=dev(torch.cumsum(extend, 0) - extend),
        max_extend=int(extend.max()),
        scale=d**-0.5,
    )


def _error_row(name: str, got, ref, dtype, max_abs_v: float) -> Row:
    """Largest |got - ref| over a bound: 8 units of the output dtype's rounding of the
    larger of |ref| and 1 (both sides accumulate in float32 from the same rounded
    inputs; the outputs are rounded once to ``dtype``), plus 2 units of max |v| for
    the kernels' softmax weights, which a GPU rounds to a 16-bit ``dtype`` before
    they multiply V (a relative error u of every weight moves an output by at most
    u (|v| + |o|) <= 2 u max |v|)."""
    import torch

    unit = torch.finfo(dtype).eps / 2
    bound = 8 * unit * torch.clamp(ref.float().abs(), min=1.0) + 2 * unit * max_abs_v
    ratio = float(((got.float() - ref.float()).abs() / bound).max())
    return Row("kernels", name + ": error / bound", ratio, "x", "<= 1", ratio <= 1)


def _sampling_args(sizes: Sizes) -> tuple:
    import torch

    from radixlm.kernels.bitmask import bitmask_width

    n, vocab = sizes.sampling_rows, sizes.sampling_vocab
    gen = torch.Generator().manual_seed(7)
    logits = (torch.randn(n, vocab, generator=gen) * 3).to(sizes.device)
    allowed = torch.rand(n, vocab, generator=gen) < 0.5
    words = torch.zeros(n, bitmask_width(vocab) * 32, dtype=torch.int64)
    words[:, :vocab] = allowed.long()
    weights = torch.tensor([1 << i for i in range(32)], dtype=torch.int64)
    packed = (words.view(n, -1, 32) * weights).sum(-1)
    bitmask = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    temps = torch.full((n,), 0.7)
    top_k = torch.full((n,), 50, dtype=torch.int64)
    top_p = torch.full((n,), 0.9)
    u = torch.rand(n, generator=gen)
    return tuple(
        t.to(sizes.device) for t in (logits, bitmask.to(sizes.device), temps, top_k, top_p, u)
    )


def sampling_rows(sizes: Sizes) -> list[Row]:
    """The masked-sampling kernel's time per call: rows with top-k 50 and top-p 0.9, and
    greedy rows (temperature 0, top-k and top-p off: what a greedy request carries)."""
    import torch

    from radixlm.kernels.triton import masked_sample_triton

    args = _sampling_args(sizes)
    logits, bitmask, temps, top_k, top_p, u = args
    seeds = (u * 2**31).long()  # the kernel draws from per-row seeds
    args = (logits, bitmask, temps, top_k, top_p, seeds)
    greedy = (
        logits,
        bitmask,
        torch.zeros_like(temps),
        torch.zeros_like(top_k),
        torch.ones_like(top_p),
        seeds,
    )
    shape = f"{sizes.sampling_rows} rows x {sizes.sampling_vocab} tokens"
    rows = []
    for name, call_args, bound in (
        (f"masked sampling, {shape}", args, 100),
        (f"masked sampling, greedy rows, {shape}", greedy, 30),
    ):
        micros = _call_s(lambda a=call_args: masked_sample_triton(*a), sizes) * 1e6
        target = f"< {bound}"
        rows.append(
            Row("sampling", name, micros, "us/step", target, _judged(sizes, micros < bound))
        )
    return rows


def _call_s(call: Callable[[], object], sizes: Sizes, repeats: int | None = None) -> float:
    """Seconds per call of ``call`` back to back on the device (after one untimed call):
    the median over 3 rounds (a dry run: 1) of ``repeats`` calls between two
    synchronisations, so a call's launch overlaps the previous one's work as in an
    engine's step."""
    repeats = repeats or sizes.sampling_repeats
    call()
    rounds = []
    for _ in range(3 if sizes.device == "cuda" else 1):
        _sync(sizes.device)
        start = time.perf_counter()
        for _ in range(repeats):
            call()
        _sync(sizes.device)
        rounds.append((time.perf_counter() - start) / repeats)
    return statistics.median(rounds)


# ---- ceilings and floors -----------------------------------------------------------------


@dataclass(frozen=True)
class Ceilings:
    """What the device does at best, measured in this run."""

    copy_bytes_s: float  # a device-to-device copy: bytes read + bytes written per second
    matmul_flop_s: float  # a large matrix product in the check's dtype


def ceiling_rows(sizes: Sizes) -> tuple[list[Row], Ceilings]:
    """The copy bandwidth (a ``copy_bytes`` copy) and the matrix rate (an n x n x n
    product): the floors below divide by them."""
    import torch

    src = torch.ones(sizes.copy_bytes, dtype=torch.uint8, device=sizes.device)
    dst = torch.empty_like(src)
    copy_s = _call_s(lambda: dst.copy_(src), sizes)
    n, dtype = sizes.matmul_n, getattr(torch, sizes.dtype)
    a = torch.randn(n, n, dtype=dtype, device=sizes.device)
    b = torch.randn(n, n, dtype=dtype, device=sizes.device)
    matmul_s = _call_s(lambda: a @ b, sizes)
    ceilings = Ceilings(2 * sizes.copy_bytes / copy_s, 2 * n**3 / matmul_s)
    gib = sizes.copy_bytes / 2**30
    rows = [
        Row("ceilings", f"device copy bandwidth ({gib:.3g} GiB, read + written)",
            ceilings.copy_bytes_s / 1e9, "GB/s"),
        Row("ceilings", f"matrix rate ({n} x {n} x {n}, {sizes.dtype})",
            ceilings.matmul_flop_s / 1e12, "TFLOP/s"),
    ]  # fmt: skip
    return rows, ceilings


def _floor_row(name: str, seconds: float, floor_s: float, bound: float, sizes: Sizes) -> Row:
    ratio = seconds / floor_s
    return Row("floors", name, ratio, "x", f"<= {bound:g}", _judged(sizes, ratio <= bound))


def attention_floor_rows(sizes: Sizes, ceilings: Ceilings) -> list[Row]:
    """The Triton decode attention kernel at ``attention_floor`` (batch, context) with the
    model's heads, against the time to read the batch's K and V once at the copy
    bandwidth. Each request's slots are one run, as a fresh pool hands them out."""
    import torch

    from radixlm.kernels.triton import decode_attention_triton

    b, context = sizes.attention_floor
    m = sizes.model
    h, hkv, d = m["num_attention_heads"], m["num_key_value_heads"], m["head_dim"]
    dtype, device = getattr(torch, sizes.dtype), sizes.device
    k_pool = torch.randn(b * context + 1, hkv, d, dtype=dtype, device=device)  # slot 0 pads
    v_pool = torch.randn_like(k_pool)
    table = torch.arange(1, b * context + 1, device=device).view(b, context)
    seq_lens = torch.full((b,), context, device=device)
    q = torch.randn(b, h, d, dtype=dtype, device=device)
    rows_ = torch.arange(b, device=device)

    def call() -> object:
        return decode_attention_triton(q, k_pool, v_pool, table, rows_, seq_lens, d**-0.5)

    seconds = _call_s(call, sizes)
    kv_bytes = 2 * b * context * hkv * d * k_pool.element_size()
    floor_s = kv_bytes / ceilings.copy_bytes_s
    shape = f"B={b} x {context} tokens, H={h}/{hkv} D={d}"
    return [
        Row("floors", f"decode attention {shape}", seconds * 1e6, "us"),
        Row("floors", f"decode attention {shape}: KV-read floor", floor_s * 1e6, "us"),
        _floor_row(f"decode attention {shape} / KV-read floor", seconds, floor_s, 1.5, sizes),
    ]


def _read_bytes(model: dict, weight_bytes: int, dtype: str) -> int:
    """The weight bytes a decode step reads: all of them, but of an untied input
    embedding table only its rows (nothing, next to the rest)."""
    if model.get("tie_word_embeddings", True):
        return weight_bytes
    import torch

    itemsize = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    return weight_bytes - model["vocab_size"] * model["hidden_size"] * itemsize


def step_floor_rows(
    label: str, model: dict, figures: EngineFigures, sizes: Sizes, ceilings: Ceilings, bound: float
) -> list[Row]:
    """A decode step at batch 1 against the time to read the weights once."""
    assert figures.step_s_batch1 is not None
    read = _read_bytes(model, figures.placement["weight_bytes"], sizes.dtype)
    floor_s = read / ceilings.copy_bytes_s
    return [
        Row("floors", f"{label}: decode step b1", figures.step_s_batch1 * 1e3, "ms"),
        Row("floors", f"{label}: weight-read floor ({read / 1e9:.3g} GB)", floor_s * 1e3, "ms"),
        _floor_row(
            f"{label}: decode step b1 / floor", figures.step_s_batch1, floor_s, bound, sizes
        ),
    ]


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def _judged(sizes: Sizes, passed: bool) -> bool | None:
    return passed if sizes.device == "cuda" else None


# ---- the engine ---------------------------------------------------------------------------


@contextlib.contextmanager
def engine(model_dir: Path, sizes: Sizes, **options) -> Iterator:
    import radixlm

    eng = radixlm.Engine(
        model_path=str(model_dir), dtype=sizes.dtype, device=sizes.device, **sizes.engine, **options
    )
    try:
        yield eng
    finally:
        eng.shutdown()
        if sizes.device == "cuda":
            import torch

            torch.cuda.empty_cache()


def _prompts(n: int, length: int, rng: random.Random, vocab: int) -> list[list[int]]:
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(n)]


def _timed(call: Callable[[], object], repeats: int) -> float:
    """Median seconds of ``repeats`` runs of ``call`` (after one untimed run)."""
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _generate(eng, prompts: list[list[int]], new_tokens: int, **extra) -> None:
    params = {"max_new_tokens": new_tokens, "temperature": 0.0, "ignore_eos": True, **extra}
    outputs = eng.generate(input_ids=prompts, sampling_params=params)
    got = [len(o["output_ids"]) for o in outputs]
    if got != [new_tokens] * len(prompts):
        raise RuntimeError(f"expected {new_tokens} new tokens per request, got {got}")


@dataclass
class EngineFigures:
    """What one engine configuration measured (seconds unless said)."""

    decode_tok_s: dict[int, float] = field(default_factory=dict)
    prefill_tok_s: float | None = None
    step_s_batch1: float | None = None
    fewshot_s: float | None = None
    tokens: list[list[int]] = field(default_factory=list)  # greedy outputs of fixed prompts
    placement: dict = field(default_factory=dict)
    acceptance_rate: float | None = None  # speculative engines: accepted / proposed tokens


def measure(eng, sizes: Sizes, what: tuple[str, ...], seed: int = 0) -> EngineFigures:
    rng = random.Random(seed)
    vocab = sizes.model["vocab_size"]
    figures = EngineFigures(placement=asdict(eng.get_stats().placement))
    eng.flush_cache()
    # The same prompts on every engine (their own generator): greedy outputs to compare.
    fixed = _prompts(sizes.agreement_rows, sizes.decode_prompt, random.Random(99), vocab)
    params = {"max_new_tokens": sizes.decode_steps, "temperature": 0.0, "ignore_eos": True}
    figures.tokens = [
        o["output_ids"] for o in eng.generate(input_ids=fixed, sampling_params=params)
    ]
    eng.flush_cache()
    if "decode" in what:
        for b in sizes.decode_batches:

            def run(b=b) -> None:
                _generate(eng, _prompts(b, sizes.decode_prompt, rng, vocab), sizes.decode_steps)
                eng.flush_cache()

            seconds = _timed(run, sizes.repeats)
            figures.decode_tok_s[b] = b * sizes.decode_steps / seconds
    if "prefill" in what:

        def prefill() -> None:
            _generate(eng, _prompts(1, sizes.prefill_tokens, rng, vocab), 1)
            eng.flush_cache()

        figures.prefill_tok_s = sizes.prefill_tokens / _timed(prefill, sizes.repeats)
    if "step" in what:

        def steps() -> None:
            _generate(eng, _prompts(1, sizes.decode_prompt, rng, vocab), sizes.graph_steps)
            eng.flush_cache()

        def one() -> None:
            _generate(eng, _prompts(1, sizes.decode_prompt, rng, vocab), 1)
            eng.flush_cache()

        # The prompt's prefill and first token cancel out of the difference.
        many, single = _timed(steps, sizes.repeats), _timed(one, sizes.repeats)
        figures.step_s_batch1 = (many - single) / (sizes.graph_steps - 1)
    if "fewshot" in what:
        prefix = _prompts(1, sizes.fewshot_prefix, rng, vocab)[0]
        questions = _prompts(sizes.fewshot_questions, sizes.fewshot_question_tokens, rng, vocab)

        def fewshot() -> None:
            eng.flush_cache()
            _generate(eng, [prefix + q for q in questions], sizes.fewshot_new_tokens)

        figures.fewshot_s = _timed(fewshot, sizes.repeats)
    spec = eng.get_stats().speculative
    if spec is not None:
        figures.acceptance_rate = spec.acceptance_rate
    return figures


def _same_share(a: list[list[int]], b: list[list[int]]) -> float:
    """Share of positions whose token is the same in both (each row up to its first
    difference: after one, the two continue from other prefixes)."""
    same = total = 0
    for x, y in zip(a, b, strict=True):
        n = next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
        same, total = same + n, total + len(x)
    return same / total


# Each engine configuration measured: its options and what it measures.
ENGINES: dict[str, tuple[dict, tuple[str, ...]]] = {
    # overlap scheduling is a GPU's default: said here so a dry run on a CPU takes it too
    "triton": (
        {"attention_backend": "triton", "overlap_schedule": "on"},
        ("decode", "prefill", "step", "fewshot"),
    ),
    "torch": ({"attention_backend": "torch"}, ("decode", "prefill", "step")),
    "no_graphs": ({"attention_backend": "triton", "disable_cuda_graph": True}, ("step",)),
    "no_cache": ({"attention_backend": "triton", "disable_radix_cache": True}, ("fewshot",)),
    # n-gram speculation; a random model's greedy text repeats itself, so its
    # proposals are accepted as an extraction workload's are
    "speculative": ({"attention_backend": "triton", "speculative": "ngram"}, ("decode",)),
    # one pass at a time (overlap scheduling is on by default on a GPU)
    "no_overlap": ({"attention_backend": "triton", "overlap_schedule": "off"}, ("decode",)),
}


def engine_rows(
    model_dir: Path, sizes: Sizes, figures: dict[str, EngineFigures] | None = None
) -> tuple[list[Row], dict]:
    """Every engine configuration in turn, each one's figures put in ``figures`` as it
    finishes; one that fails becomes an error row and leaves out the comparisons it
    was a side of, the others still run."""
    figures = {} if figures is None else figures
    rows: list[Row] = []
    for name, (options, what) in ENGINES.items():
        try:
            with engine(model_dir, sizes, **options) as eng:
                figures[name] = measure(eng, sizes, what)
        except Exception as e:  # a GPU run is scarce: report it and go on
            rows.append(failure_row("engine", f"engine {name!r}", e))
    triton, torch_side = figures.get("triton"), figures.get("torch")
    no_graphs, no_cache = figures.get("no_graphs"), figures.get("no_cache")
    if triton and no_graphs:
        same = _same_share(triton.tokens, no_graphs.tokens)
        rows.append(
            Row("outputs", "greedy tokens, CUDA graphs on = off", same, "share", "== 1", same == 1)
        )
    if triton and torch_side:
        # bfloat16 roundings differ between the backends' kernels: a near-tie may flip
        same = _same_share(triton.tokens, torch_side.tokens)
        rows.append(Row("outputs", "greedy tokens, triton = torch", same, "share"))
        rows += _backend_rows(triton, torch_side, sizes)
    if triton and no_graphs and torch_side:
        on, off = triton.step_s_batch1, no_graphs.step_s_batch1
        assert on and off and torch_side.step_s_batch1
        rows.append(Row("engine", "decode step, batch 1, CUDA graphs on", on * 1e3, "ms"))
        rows.append(Row("engine", "decode step, batch 1, CUDA graphs off", off * 1e3, "ms"))
        rows.append(
            Row(
                "engine",
                "decode step, batch 1, torch backend",
                torch_side.step_s_batch1 * 1e3,
                "ms",
            )
        )
        rows.append(
            Row(
                "engine",
                "CUDA graphs: step time off / on",
                off / on,
                "x",
                ">= 1.5",
                _judged(sizes, off / on >= 1.5),
            )
        )
    if triton and no_cache:
        assert triton.fewshot_s and no_cache.fewshot_s
        questions, prefix = sizes.fewshot_questions, sizes.fewshot_prefix
        shots = f"few-shot ({questions} questions on a {prefix}-token prefix)"
        rows.append(Row("engine", f"{shots}, radix cache", triton.fewshot_s, "s"))
        rows.append(Row("engine", f"{shots}, no radix cache", no_cache.fewshot_s, "s"))
        ratio = no_cache.fewshot_s / triton.fewshot_s
        rows.append(
            Row(
                "engine",
                "few-shot: no cache / cache",
                ratio,
                "x",
                ">= 5",
                _judged(sizes, ratio >= 5),
            )
        )
    speculative = figures.get("speculative")
    if triton and speculative:
        rows += _speculative_rows(triton, speculative, sizes)
    no_overlap = figures.get("no_overlap")
    if triton and no_overlap:
        rows += _overlap_rows(triton, no_overlap, sizes)
    return rows, {name: f.placement for name, f in figures.items()}


def _speculative_rows(triton: EngineFigures, spec: EngineFigures, sizes: Sizes) -> list[Row]:
    """n-gram speculation against the same engine without it. Its verify passes run
    through the extend kernel, its decodes through the decode kernel: bfloat16
    roundings differ, so a near-tie may flip (no target on the token share). At every
    batch size it must not lose (the engine's calibrated pass costs make a
    batch whose verify pass cannot pay decode without proposals)."""
    same = _same_share(triton.tokens, spec.tokens)
    rows = [Row("outputs", "greedy tokens, n-gram speculation = none", same, "share")]
    for b in sorted(spec.decode_tok_s):
        ratio = spec.decode_tok_s[b] / triton.decode_tok_s[b]
        name = f"decode batch {b}: n-gram speculation / none"
        rows.append(Row("engine", name, ratio, "x", ">= 1.0", _judged(sizes, ratio >= 1.0)))
    assert spec.acceptance_rate is not None
    rows.append(Row("engine", "n-gram speculation: acceptance rate", spec.acceptance_rate, "share"))
    return rows


def _overlap_rows(triton: EngineFigures, serial: EngineFigures, sizes: Sizes) -> list[Row]:
    """Overlap scheduling (the default) against one pass at a time: the same greedy
    tokens (the same kernels run either way), and decode throughput at each batch."""
    same = _same_share(triton.tokens, serial.tokens)
    rows = [
        Row(
            "outputs",
            "greedy tokens, overlap on = off",
            same,
            "share",
            "== 1",
            _judged(sizes, same == 1),
        )
    ]
    for b, tok_s in triton.decode_tok_s.items():
        ratio = tok_s / serial.decode_tok_s[b]
        rows.append(Row("engine", f"decode b{b}: overlap on / off", ratio, "x", ">= 1.0"))
    return rows


def _backend_rows(triton: EngineFigures, torch_side: EngineFigures, sizes: Sizes) -> list[Row]:
    """Decode at each batch size and the prefill, Triton backend against torch."""
    rows = []
    for b in sizes.decode_batches:
        ours, theirs = triton.decode_tok_s[b], torch_side.decode_tok_s[b]
        rows.append(Row("engine", f"decode batch {b}: triton tok/s", ours, "tok/s"))
        rows.append(Row("engine", f"decode batch {b}: torch tok/s", theirs, "tok/s"))
        target = "" if b != max(sizes.decode_batches) else ">= 3"
        passed = _judged(sizes, ours / theirs >= 3) if target else None
        rows.append(
            Row("engine", f"decode batch {b}: triton / torch", ours / theirs, "x", target, passed)
        )
    assert triton.prefill_tok_s and torch_side.prefill_tok_s
    p = sizes.prefill_tokens
    ratio = triton.prefill_tok_s / torch_side.prefill_tok_s
    rows.append(Row("engine", f"prefill {p} tokens: triton tok/s", triton.prefill_tok_s, "tok/s"))
    rows.append(
        Row("engine", f"prefill {p} tokens: torch tok/s", torch_side.prefill_tok_s, "tok/s")
    )
    rows.append(Row("engine", f"prefill {p}: triton / torch", ratio, "x"))
    return rows


# ---- against transformers, the 8B shape, constrained decoding, HTTP --------------------

# ours / transformers' decode tok/s must reach these at these batch sizes (issue 47)
TRANSFORMERS_TARGETS = {32: 1.3, 128: 2.0}


def transformers_rows(model_dir: Path, sizes: Sizes, ours: EngineFigures | None) -> list[Row]:
    """transformers' ``generate`` with a static cache at each decode batch size, and our
    Triton engine's decode throughput over it."""
    theirs = _transformers_tok_s(model_dir, sizes)
    if sizes.device == "cuda":
        import torch

        torch.cuda.empty_cache()  # the next engine sizes its pool from free memory
    rows = []
    for b, tok_s in theirs.items():
        rows.append(
            Row("engine", f"decode batch {b}: transformers static cache tok/s", tok_s, "tok/s")
        )
        if ours is None or b not in ours.decode_tok_s:
            continue
        ratio, bound = ours.decode_tok_s[b] / tok_s, TRANSFORMERS_TARGETS.get(b)
        rows.append(
            Row(
                "engine",
                f"decode batch {b}: triton / transformers static cache",
                ratio,
                "x",
                f">= {bound:g}" if bound else "",
                _judged(sizes, ratio >= bound) if bound else None,
            )
        )
    return rows


def _transformers_tok_s(model_dir: Path, sizes: Sizes) -> dict[int, float]:
    """Greedy ``decode_steps`` new tokens after ``decode_prompt`` (as ``measure`` times
    the engine), on the same random weights loaded from the directory the check wrote."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, sizes.dtype)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype)
    model = model.to(sizes.device).eval()
    gen = torch.Generator().manual_seed(5)
    vocab, steps = sizes.model["vocab_size"], sizes.decode_steps
    tok_s = {}
    for b in sizes.decode_batches:
        ids = torch.randint(3, vocab, (b, sizes.decode_prompt), generator=gen).to(sizes.device)

        def run(ids=ids) -> None:
            with torch.inference_mode():
                out = model.generate(
                    input_ids=ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=steps,
                    min_new_tokens=steps,
                    do_sample=False,
                    cache_implementation="static",
                    pad_token_id=0,
                )
            _sync(sizes.device)
            if out.shape[1] != ids.shape[1] + steps:
                raise RuntimeError(f"transformers made {out.shape[1] - ids.shape[1]} tokens")

        tok_s[b] = b * steps / _timed(run, sizes.repeats)
    return tok_s


def llama8b_rows(scratch: Path, sizes: Sizes, ceilings: Ceilings | None) -> list[Row]:
    """The decode step at batch 1 on a random Llama-3.1-8B shape (``model_8b``: FULL
    keeps ``LLAMA_8B_LAYERS`` of 32 layers, so the per-step costs that do not grow with
    depth weigh more than on the whole model: the ratio is an upper bound of its)."""
    import torch

    from radixlm.runtime.models import write_random_model

    model = sizes.model_8b
    dtype = getattr(torch, sizes.dtype)
    model_dir = write_random_model(scratch / "model-8b", model, dtype, sizes.device)
    shaped = replace(sizes, model=model)
    try:
        with engine(model_dir, shaped, attention_backend="triton") as eng:
            figures = measure(eng, shaped, ("step",))
    finally:
        shutil.rmtree(model_dir, ignore_errors=True)
    assert ceilings is not None  # run_sections skips the section without them
    layers = model["num_hidden_layers"]
    label = f"8B shape ({layers} of {LLAMA_8B['num_hidden_layers']} layers)"
    return step_floor_rows(label, model, figures, sizes, ceilings, 1.2)


def tokenizer_source(carry: Path) -> Path | None:
    """Where the default model's tokenizer files are: the carried folder (filled by
    fetch_gpu_wheels.py), else the pulled default model; None if neither has them."""
    from radixlm.runtime.model_store import default_model_dir

    for folder in (carry / "tokenizer", default_model_dir()):
        if (folder / "tokenizer.json").is_file():
            return folder
    return None


def write_bpe_model(scratch: Path, sizes: Sizes, tokenizer_dir: Path) -> Path:
    """``constrained_model`` (the 1B shape with a vocabulary of 49,152) with the default
    model's BPE tokenizer in place of the word-level one."""
    import torch

    from radixlm.runtime.models import write_random_model

    dtype = getattr(torch, sizes.dtype)
    model_dir = write_random_model(
        scratch / "model-bpe", sizes.constrained_model, dtype, sizes.device
    )
    for stale in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (model_dir / stale).unlink(missing_ok=True)
    for file in tokenizer_dir.iterdir():
        if file.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy2(file, model_dir / file.name)
    return model_dir


# A regex that never ends by itself: every request runs its ``decode_steps`` tokens.
CONSTRAINT = {"regex": "[a-z ]+"}


def constrained_rows(model_dir: Path, sizes: Sizes) -> list[Row]:
    """Decode throughput at ``constrained_batch`` with every request under a regex
    (the outlines backend, the regex default: a bitmask per row per step) against the
    same prompts unconstrained, on the same engine (the grammar compiles untimed)."""
    vocab = sizes.constrained_model["vocab_size"]
    b, steps = sizes.constrained_batch, sizes.decode_steps
    prompts = _prompts(b, sizes.decode_prompt, random.Random(3), vocab)
    shaped = replace(sizes, model=sizes.constrained_model)
    tok_s = {}
    with engine(model_dir, shaped, attention_backend="triton") as eng:
        for name, extra in (("unconstrained", {}), ("regex", CONSTRAINT)):

            def run(extra=extra) -> None:
                _generate(eng, prompts, steps, **extra)
                eng.flush_cache()

            tok_s[name] = b * steps / _timed(run, sizes.repeats)
    ratio = tok_s["regex"] / tok_s["unconstrained"]
    pattern = CONSTRAINT["regex"]
    return [
        Row("constrained", f"decode batch {b}, vocab {vocab}: unconstrained tok/s",
            tok_s["unconstrained"], "tok/s"),
        Row("constrained", f"decode batch {b}: regex {pattern!r} tok/s", tok_s["regex"], "tok/s"),
        Row("constrained", f"decode batch {b}: constrained / unconstrained", ratio, "x", ">= 0.9",
            _judged(sizes, ratio >= 0.9)),
    ]  # fmt: skip


def serving_rows(model_dir: Path, sizes: Sizes, scratch: Path) -> list[Row]:
    """bench_serving.py's workload (``sizes.serving``) through the Engine in this
    process and through ``radixlm serve`` over loopback HTTP, one after the other on the
    same requests: their output tok/s and the ratio say the server's share of a step."""
    import subprocess

    out = scratch / "serving.json"
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in sizes.serving.items()]
    cmd = [
        sys.executable, str(ROOT / "benchmarks" / "bench_serving.py"),
        "--sides", "engine", "radixlm", "--model-path", str(model_dir),
        "--dtype", sizes.dtype, *flags, "--out", str(out),
    ]  # fmt: skip
    subprocess.run(cmd, check=True, timeout=600, stdout=sys.stderr)
    report = json.loads(out.read_text())
    by_side = {m["side"]: m["summary"] for m in report["medians"]}
    engine_s, http = by_side["engine"], by_side["radixlm"]
    for side, summary in by_side.items():
        if summary["failed"]:
            raise RuntimeError(
                f"{side}: {summary['failed']} requests failed: {summary['first_error']}"
            )
    ratio = http["output_throughput"] / engine_s["output_throughput"]
    s = sizes.serving
    work = f"{s['num_prompts']} x {s['random_input_len']}+{s['random_output_len']}"
    work += f", concurrency {s['max_concurrency']}"
    rows = [
        Row("serving", f"{work}: in-process output tok/s", engine_s["output_throughput"], "tok/s"),
        Row("serving", f"{work}: HTTP output tok/s", http["output_throughput"], "tok/s"),
        Row("serving", "HTTP / in-process output tok/s", ratio, "x"),
    ]
    for side, summary in (("in-process", engine_s), ("HTTP", http)):
        rows.append(Row("serving", f"median TPOT, {side}", summary["tpot_ms"]["p50"], "ms"))
    return rows


def carried_packages(modules: tuple[str, ...], carry: Path, scratch: Path) -> str | None:
    """None when every module in ``modules`` imports, installing the carried wheels
    (``carry``/wheels, from fetch_gpu_wheels.py) into ``scratch``/site first when one
    does not; else why not (the rows needing them are then skipped)."""
    import importlib.util

    def missing() -> list[str]:
        return [m for m in modules if importlib.util.find_spec(m) is None]

    if not missing():
        return None
    wheels, site = carry / "wheels", scratch / "site"
    if not site.is_dir():
        if not any(wheels.glob("*.whl")):
            return f"no {', '.join(missing())} and no wheels in {wheels} (fetch_gpu_wheels.py)"
        import subprocess

        pip = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
             "--no-compile", "--target", str(site), *map(str, sorted(wheels.glob("*.whl")))],
            check=False, stdout=sys.stderr,
        )  # fmt: skip
        if pip.returncode != 0:  # another Python's wheels, say: pip says why on stderr
            shutil.rmtree(site, ignore_errors=True)
            return f"pip could not install the wheels in {wheels} (status {pip.returncode})"
        sys.path.insert(0, str(site))
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(site), os.environ.get("PYTHONPATH")) if p
        )
        importlib.invalidate_caches()
    absent = missing()
    return f"no {', '.join(absent)} among the carried wheels" if absent else None


def skipped_row(section: str, reason: str) -> Row:
    return Row(section, f"{section} skipped: {reason}", math.nan, "")


def failure_row(section: str, what: str, error: BaseException) -> Row:
    """A part of the check that raised: its traceback on stderr, one failed row."""
    traceback.print_exception(error, file=sys.stderr)
    detail = str(error).strip().splitlines()[0][:120] if str(error).strip() else ""
    return Row(
        section, f"{what} failed: {type(error).__name__}: {detail}", math.nan, "", "runs", False
    )


# ---- the run ------------------------------------------------------------------------------


def table(rows: list[Row]) -> str:
    verdict = {True: "PASS", False: "MISS", None: ""}
    width = max(len(r.name) for r in rows)
    lines = [f"{'section':<9} {'check':<{width}} {'figure':>12} {'unit':<8} {'target':<8} verdict"]
    for r in rows:
        lines.append(
            f"{r.section:<9} {r.name:<{width}} {r.value:>12.4g} {r.unit:<8} {r.target:<8} "
            f"{verdict[r.passed]}"
        )
    return "\n".join(lines)


def machine(sizes: Sizes) -> dict:
    import torch

    info = {"torch": torch.__version__, "device": sizes.device}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if sizes.device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    return info


@dataclass
class Progress:
    """What the run has so far: the watchdog writes it out when time runs out."""

    sizes: Sizes
    out: Path
    dry_run: bool
    start: float = field(default_factory=time.perf_counter)
    rows: list[Row] = field(default_factory=list)
    figures: dict[str, EngineFigures] = field(default_factory=dict)
    placements: dict = field(default_factory=dict)
    scratch: Path | None = None  # the temporary directory (the model): removed on a timeout
    section_s: dict[str, float] = field(default_factory=dict)  # wall seconds per section

    def write(self, timed_out: bool = False) -> None:
        seconds = time.perf_counter() - self.start
        print(table(self.rows) if self.rows else "(no rows yet)")
        print(f"\n{len(self.rows)} rows in {seconds:.0f} s on {machine(self.sizes)}")
        if timed_out:
            print(f"stopped at the time budget; engines finished: {sorted(self.figures)}")
        result = {
            "dry_run": self.dry_run,
            "timed_out": timed_out,
            "machine": machine(self.sizes),
            "sizes": asdict(self.sizes),
            "seconds": seconds,
            "placements": self.placements,
            "section_seconds": self.section_s,
            "rows": [asdict(r) for r in self.rows],
            "engine_figures": {name: asdict(f) for name, f in self.figures.items()},
        }
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.out.write_text(json.dumps(result, indent=1) + "\n")


def _watchdog(progress: Progress, budget_s: float) -> threading.Timer:
    """Past ``budget_s``, writes what the run has and ends the process (status 124):
    a hung part must not cost the whole of a GPU machine's time."""

    def expire() -> None:
        progress.write(timed_out=True)
        sys.stdout.flush()
        if progress.scratch is not None:
            shutil.rmtree(progress.scratch, ignore_errors=True)
        os._exit(124)

    timer = threading.Timer(budget_s, expire)
    timer.daemon = True
    timer.start()
    return timer


def tp_rows(model_dir: Path, sizes: Sizes, one: EngineFigures | None) -> list[Row]:
    """Tensor parallelism over 2 GPUs (NCCL), only on a machine that has them: greedy
    tokens against one GPU's (bfloat16: a near-tie may flip) and decode throughput (TP=2
    runs without CUDA graphs; the one-GPU side with them)."""
    with engine(model_dir, sizes, attention_backend="triton", tp_size=2) as eng:
        two = measure(eng, sizes, ("decode",))
    batch = max(two.decode_tok_s)
    rows = [Row("engine", f"TP=2: decode batch {batch} tok/s", two.decode_tok_s[batch], "tok/s")]
    if one is not None:
        same = _same_share(one.tokens, two.tokens)
        rows.append(Row("outputs", "greedy tokens, TP=2 = TP=1", same, "share"))
        if batch in one.decode_tok_s:
            ratio = two.decode_tok_s[batch] / one.decode_tok_s[batch]
            rows.append(Row("engine", f"TP=2 / TP=1 decode batch {batch} tok/s", ratio, "x"))
    return rows


# ---- device traffic per decode step -----------------------------------------

_SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
_COPY_CALLS = ("cudaMemcpyAsync", "cudaMemcpy")


@dataclass(frozen=True)
class Traffic:
    """What torch.profiler saw over one ``_generate`` call (seconds, counts)."""

    wall_s: float
    syncs: int
    copies: int
    sync_wait_s: float  # host time spent inside the synchronisation calls
    device_s: float  # the kernels' own time on the device


def _profiled(call: Callable[[], object]) -> Traffic:
    """``call`` under torch.profiler: CUDA runtime calls (synchronisations, copies) are
    seen process-wide, so the engine's loop thread is counted too."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        call()
        wall = time.perf_counter() - start
    syncs = copies = 0
    wait_us = device_us = 0.0
    for evt in prof.events():
        if evt.name in _SYNC_CALLS:
            syncs += 1
            wait_us += evt.cpu_time_total
        elif evt.name in _COPY_CALLS:
            copies += 1
        if evt.device_type.name == "CUDA":
            device_us += evt.device_time_total
    return Traffic(wall, syncs, copies, wait_us / 1e6, device_us / 1e6)


def traffic_rows(model_dir: Path, sizes: Sizes) -> list[Row]:
    """Per decode step at batch 1 and the largest decode batch: the difference of two
    profiled calls of the same prompts, one with ``decode_steps`` more new tokens than the
    other (prefill, admission and the first token cancel out). Times are the profiled
    runs' (the profiler's own overhead included); host time is the wall time outside the
    synchronisation calls."""
    rng = random.Random(7)
    vocab = sizes.model["vocab_size"]
    few, many = 2, 2 + sizes.decode_steps
    per_step: dict[int, dict[str, float]] = {}
    with engine(model_dir, sizes) as eng:
        _generate(eng, _prompts(1, sizes.decode_prompt, rng, vocab), few)  # warm-up
        for b in (1, max(sizes.decode_batches)):
            prompts = _prompts(b, sizes.decode_prompt, rng, vocab)

            def run(n: int, prompts=prompts) -> Traffic:
                eng.flush_cache()
                return _profiled(lambda: _generate(eng, prompts, n))

            short, long = run(few), run(many)
            steps = many - few
            per_step[b] = {
                "syncs": (long.syncs - short.syncs) / steps,
                "copies": (long.copies - short.copies) / steps,
                "host_ms": 1e3
                * ((long.wall_s - long.sync_wait_s) - (short.wall_s - short.sync_wait_s))
                / steps,
                "device_ms": 1e3 * (long.device_s - short.device_s) / steps,
                "step_ms": 1e3 * (long.wall_s - short.wall_s) / steps,
            }
    rows: list[Row] = []
    for b, f in per_step.items():
        rows.append(
            Row(
                "traffic",
                f"decode b{b}: synchronisations per step",
                f["syncs"],
                "count",
                "<= 1",
                _judged(sizes, f["syncs"] <= 1),
            )
        )
        rows.append(
            Row("traffic", f"decode b{b}: host<->device copies per step", f["copies"], "count")
        )
        rows.append(Row("traffic", f"decode b{b}: step time", f["step_ms"], "ms"))
        rows.append(Row("traffic", f"decode b{b}: host time per step", f["host_ms"], "ms"))
        rows.append(Row("traffic", f"decode b{b}: device time per step", f["device_ms"], "ms"))
        # overlap scheduling hides the host's share behind the device's
        larger = max(f["host_ms"], f["device_ms"])  # (a dry run's device time is 0)
        bound = f["step_ms"] / larger if larger > 0 else math.nan
        rows.append(
            Row(
                "traffic",
                f"decode b{b}: step time / max(host, device)",
                bound,
                "x",
                "<= 1.1",
                _judged(sizes, bound <= 1.1),
            )
        )
    one, big = per_step[1], per_step[max(per_step)]
    same = one["copies"] == big["copies"] and one["syncs"] == big["syncs"]
    rows.append(
        Row(
            "traffic",
            f"copies and syncs per step: b{max(per_step)} = b1",
            float(same),
            "bool",
            "== 1",
            _judged(sizes, same),
        )
    )
    return rows


# Sections --skip can leave out, and the modules each needs beyond the GPU machine's own.
SKIPPABLE = ("transformers", "traffic", "constrained", "llama8b", "serving")
NEEDS = {
    "constrained": ("outlines_core", "interegular"),
    "serving": ("fastapi", "uvicorn", "pydantic", "orjson", "jsonschema", "httpx"),
}


def _part(progress: Progress, section: str, what: str, call: Callable[[], list[Row]]) -> None:
    """``call``'s rows, or a failed row: a GPU run is scarce, the rest still runs. Its
    wall time is added to its section's (the JSON's section_seconds: what fits a budget)."""
    start = time.perf_counter()
    try:
        progress.rows += call()
    except Exception as e:
        progress.rows.append(failure_row(section, what, e))
    finally:
        seconds = time.perf_counter() - start
        progress.section_s[what] = progress.section_s.get(what, 0.0) + seconds


def run_sections(progress: Progress, scratch: Path, carry: Path, skip: frozenset[str]) -> None:
    """Every section in turn, the cheap and the targets first (the budget may stop the
    run part-way): kernels, sampling, ceilings and the attention floor, the engines,
    the 1B step floor, transformers, traffic, constrained decoding, the 8B shape, HTTP."""
    import torch

    from radixlm.runtime.models import write_random_model

    sizes = progress.sizes
    _part(progress, "kernels", "kernels", lambda: kernel_rows(sizes))
    _part(progress, "sampling", "sampling", lambda: sampling_rows(sizes))
    measured: list[Ceilings] = []

    def ceilings() -> list[Row]:
        rows, found = ceiling_rows(sizes)
        measured.append(found)
        return rows

    _part(progress, "ceilings", "ceilings", ceilings)
    ceiling = measured[0] if measured else None
    if ceiling:
        _part(progress, "floors", "attention floor", lambda: attention_floor_rows(sizes, ceiling))
    if sizes.device == "cuda":
        torch.cuda.empty_cache()  # the engines size their KV pools from free memory
    model_dir = write_random_model(
        scratch / "model", sizes.model, getattr(torch, sizes.dtype), sizes.device
    )

    def engines() -> list[Row]:
        rows, progress.placements = engine_rows(model_dir, sizes, progress.figures)
        return rows

    _part(progress, "engine", "engines", engines)
    triton = progress.figures.get("triton")
    if ceiling and triton and triton.step_s_batch1:
        label = "1B shape"
        _part(progress, "floors", "1B step floor",
              lambda: step_floor_rows(label, sizes.model, triton, sizes, ceiling, 2.0))  # fmt: skip
    sections: dict[str, Callable[[], list[Row]]] = {
        "transformers": lambda: transformers_rows(model_dir, sizes, triton),
        "traffic": lambda: traffic_rows(model_dir, sizes),
        "constrained": lambda: constrained_rows(bpe_model(), sizes),
        "llama8b": lambda: llama8b_rows(scratch, sizes, ceiling),
        "serving": lambda: serving_rows(bpe_model(), sizes, scratch),
    }
    bpe: list[Path] = []

    def bpe_model() -> Path:
        if not bpe:
            source = tokenizer_source(carry)
            assert source is not None  # checked before the section runs
            bpe.append(write_bpe_model(scratch, sizes, source))
        return bpe[0]

    for section, call in sections.items():
        reason = _skip_reason(section, skip, carry, scratch)
        if section == "llama8b" and ceiling is None and not reason:
            reason = "no copy bandwidth measured (the ceilings section failed)"
        if reason:
            progress.rows.append(skipped_row(section, reason))
        else:
            _part(progress, section, section, call)
    if sizes.device == "cuda" and torch.cuda.device_count() >= 2:  # NCCL over 2 GPUs
        _part(progress, "engine", "tensor parallelism",
              lambda: tp_rows(model_dir, sizes, progress.figures.get("triton")))  # fmt: skip


def _skip_reason(section: str, skip: frozenset[str], carry: Path, scratch: Path) -> str | None:
    if section in skip:
        return "--skip"
    if section in ("constrained", "serving") and tokenizer_source(carry) is None:
        return f"no tokenizer.json in {carry / 'tokenizer'} nor the default model's directory"
    return carried_packages(NEEDS[section], carry, scratch) if section in NEEDS else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--budget-s",
        type=float,
        default=540.0,
        help="stop, writing what was measured, after this many seconds (default 540)",
    )
    parser.add_argument(
        "--skip",
        nargs="*",
        default=[],
        choices=SKIPPABLE,
        help="leave these sections out (a row each says so)",
    )
    parser.add_argument(
        "--carry",
        type=Path,
        default=ROOT / "benchmarks" / ".gpu_carry",
        help="fetch_gpu_wheels.py's folder: wheels/ installed when imports are missing, "
        "tokenizer/ (default: benchmarks/.gpu_carry)",
    )
    args = parser.parse_args(argv)
    sizes = DRY if args.dry_run else FULL
    if args.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported
    out = args.out or ROOT / "benchmarks" / "results" / (
        "gpu_check_dry_run.json" if args.dry_run else "gpu_check.json"
    )
    progress = Progress(sizes, out, args.dry_run)
    watchdog = _watchdog(progress, args.budget_s)
    with tempfile.TemporaryDirectory(prefix="radixlm-gpu-check-") as tmp:
        scratch = progress.scratch = Path(tmp)
        import_radixlm(scratch)
        import torch

        if sizes.device == "cuda" and not torch.cuda.is_available():
            print("no GPU here: run with --dry-run on a CPU", file=sys.stderr)
            return 2
        run_sections(progress, scratch, args.carry, frozenset(args.skip))
    watchdog.cancel()
    progress.write()
    # exit status 1: something is wrong (a kernel, the outputs, a part that raised);
    # a missed speed target is a figure, not a failure
    wrong = [
        r
        for r in progress.rows
        if r.passed is False and (r.target == "runs" or r.section in ("kernels", "outputs"))
    ]
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
