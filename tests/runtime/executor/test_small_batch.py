"""SmallBatchForward: passes of a few tokens through the C++ layer kernels give the
model's logits (and transformers'), on tiny random Llama, Qwen2 and Qwen3 models."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from radixlm.kernels.cpu.small_batch import MAX_ROWS, BlockedMatrix, load_small_batch_kernels
from radixlm.runtime.attention import CpuAttentionBackend
from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.executor.small_batch import SmallBatchForward
from radixlm.runtime.layers.linear import packed_bf16_available
from radixlm.runtime.model_store import cache_root
from radixlm.runtime.models import ArchConfig
from tests import numerics as num
from tests.runtime.models.helpers import (
    KVHarness,
    assert_like_transformers,
    build_hf_model,
    exact_twin,
    hf_logits,
    save_hf,
)

VARIANTS = {
    "llama-tied-gqa": ("llama", {"tie_word_embeddings": True}),
    "qwen2-bias-untied": ("qwen2", {"tie_word_embeddings": False}),
    "qwen3-qknorm-headdim-tied": ("qwen3", {"head_dim": 24, "tie_word_embeddings": True}),
}


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(0, 96, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _setup(variant: str, tmp_path: Path, dtype: torch.dtype = torch.float32):
    kind, overrides = VARIANTS[variant]
    hf = build_hf_model(kind, **overrides)
    path = save_hf(hf, tmp_path / variant)
    harness = KVHarness(ArchConfig.from_model_dir(path), dtype=dtype)
    return hf, harness.load(path), harness


def _batch(harness: KVHarness, chunks: list[tuple[str, list[int]]]) -> ForwardBatch:
    ids, positions, inputs = harness.lay_out(chunks)
    none = torch.empty(0, dtype=torch.int64)
    return ForwardBatch(ids, positions, inputs, none, (), False, none, none, 0)


@pytest.fixture(scope="module")
def kernels():
    return load_small_batch_kernels(cache_root() / "kernels")


@pytest.mark.parametrize("variant", VARIANTS)
def test_small_passes_match_transformers(variant: str, kernels, tmp_path: Path) -> None:
    """Two decode rows on cached prefixes and a 3-token fresh prefill in one pass,
    then a lone decode row: the logits of every token are transformers'."""
    hf, model, harness = _setup(variant, tmp_path)
    small = SmallBatchForward(model, harness.backend, kernels)
    seqs = {
        key: _prompt(n, seed) for seed, (key, n) in enumerate({"a": 9, "b": 14, "c": 3}.items())
    }
    harness.run(model, [("a", seqs["a"][:-1]), ("b", seqs["b"][:-1])])  # eager prefills
    chunks = [("a", seqs["a"][-1:]), ("c", seqs["c"]), ("b", seqs["b"][-1:])]
    batch = _batch(harness, chunks)
    assert small.accepts(batch)
    with torch.inference_mode():
        logits = model.compute_logits(small.run(batch)).split([1, 3, 1])
    twin = exact_twin(hf)
    assert_like_transformers(list(logits), hf, twin, [seqs[key] for key, _ in chunks])
    seqs["c"].append(7)
    with torch.inference_mode():
        ours = model.compute_logits(small.run(_batch(harness, [("c", [7])])))
    assert_like_transformers([ours], hf, twin, [seqs["c"]])
    assert small.passes == 2


def test_small_pass_equals_the_eager_model(kernels, tmp_path: Path) -> None:
    """The same pass through the model's own forward: the same hidden states up to
    float32 summation order, and the same K/V written to the pass's slots."""
    hf, model, harness = _setup("qwen2-bias-untied", tmp_path)
    small = SmallBatchForward(model, harness.backend, kernels)
    prefix = _prompt(12, 0)
    harness.run(model, [("a", prefix)])
    batch = _batch(harness, [("a", [5]), ("b", [1, 2, 3])])
    slots = batch.attn.out_cache_loc
    with torch.inference_mode():
        ours = small.run(batch)
        ours_k, ours_v = harness.pool.k[:, slots].clone(), harness.pool.v[:, slots].clone()
        metadata = harness.backend.prepare(batch.attn)
        eager = model(batch.input_ids, batch.positions, metadata)
    # Against the exact pass (transformers in float64), the small pass is as accurate
    # as the eager one: hidden states and every layer's new K/V.
    hidden, k, v = _exact_pass(exact_twin(hf), [(prefix + [5], 1), ([1, 2, 3], 3)])
    multiple = num.SAME_COMPUTATION
    num.assert_no_worse_than(ours, eager, hidden, multiple, "hidden")
    num.assert_no_worse_than(ours_k, harness.pool.k[:, slots], k, multiple, "k")
    num.assert_no_worse_than(ours_v, harness.pool.v[:, slots], v, multiple, "v")


def _exact_pass(
    twin: torch.nn.Module, sequences: list[tuple[list[int], int]]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """transformers' float64 final hidden states and every layer's K/V (after RoPE) of
    the last n tokens of each (ids, n), in that order: (T, hidden), (L, T, Hkv, D) x 2."""
    hidden, keys, values = [], [], []
    for ids, n in sequences:
        with torch.inference_mode():
            out = twin.model(torch.tensor([ids]), use_cache=True)
        hidden.append(out.last_hidden_state[0, -n:])
        cache = out["cache"].layers  # a DynamicCache: per layer (1, Hkv, T, D) keys, values
        keys.append(torch.stack([c.keys[0, :, -n:].transpose(0, 1) for c in cache]))
        values.append(torch.stack([c.values[0, :, -n:].transpose(0, 1) for c in cache]))
    return torch.cat(hidden), torch.cat(keys, dim=1), torch.cat(values, dim=1)


def test_accepts_one_to_max_rows_tokens(kernels, tmp_path: Path) -> None:
    _, model, harness = _setup("llama-tied-gqa", tmp_path)
    small = SmallBatchForward(model, harness.backend, kernels)
    assert small.accepts(_batch(harness, [("a", list(range(MAX_ROWS)))]))
    assert small.accepts(_batch(harness, [("b", [1])]))
    assert not small.accepts(_batch(harness, [("c", list(range(MAX_ROWS + 1)))]))


def test_the_lm_head_takes_the_kernel_for_few_rows(kernels, tmp_path: Path) -> None:
    _, model, harness = _setup("qwen2-bias-untied", tmp_path)
    assert model.lm_head.small_batch is None
    SmallBatchForward(model, harness.backend, kernels)
    assert model.lm_head.small_batch is kernels


def test_supports_float32_and_bfloat16_on_cpu(tmp_path: Path) -> None:
    _, model, _ = _setup("llama-tied-gqa", tmp_path)
    assert SmallBatchForward.supports(model)
    _, bf16_model, _ = _setup("llama-tied-gqa", tmp_path / "bf16", torch.bfloat16)
    assert SmallBatchForward.supports(bf16_model)
    _, fp16_model, _ = _setup("llama-tied-gqa", tmp_path / "fp16", torch.float16)
    assert not SmallBatchForward.supports(fp16_model)


@pytest.mark.parametrize("backend_kind", ["cpu", "torch"])
def test_bfloat16_small_passes_stay_close_to_float32(
    backend_kind: str, kernels, tmp_path: Path
) -> None:
    """bfloat16 weights and pool, float32 activations: a decode pass (one call
    with the C++ attention backend, over oneDNN's blocked copies where the build has
    AVX512-BF16) and a mixed one (the plain weights), against the float32 model
    through the same kernels, within bfloat16's precision."""
    results = {}
    for dtype in (torch.float32, torch.bfloat16):
        hf, model, harness = _setup("qwen2-bias-untied", tmp_path / str(dtype), dtype)
        backend = harness.backend
        if backend_kind == "cpu":
            scale = harness.config.attention_scale
            backend = CpuAttentionBackend.load(
                harness.pool, harness.table, scale, cache_root() / "kernels"
            )
        small = SmallBatchForward(model, backend, kernels)
        harness.run(model, [("a", _prompt(11, 0)), ("b", _prompt(30, 1))])
        logits = []
        for chunks in ([("a", [3]), ("c", [4, 5, 6]), ("b", [7])], [("a", [8]), ("b", [9])]):
            with torch.inference_mode():
                logits.append(model.compute_logits(small.run(_batch(harness, chunks))))
        assert small.whole_steps == (1 if backend_kind == "cpu" else 0)
        if small.step is not None:  # bfloat16: the step reads oneDNN's blocked copies
            blocked = dtype == torch.bfloat16 and kernels.bf16_blocked and packed_bf16_available()
            assert isinstance(small.step.layers[0].qkv, BlockedMatrix) == blocked
            assert small.layers[0].qkv is model.model.layers[0].self_attn.qkv_proj.weight
        results[dtype] = torch.cat(logits)
    # The rows of the two passes: a's, c's three and b's, then a's and b's next ones.
    a, b, c = _prompt(11, 0) + [3, 8], _prompt(30, 1) + [7, 9], [4, 5, 6]
    rows = [(a, 11), (c, 0), (c, 1), (c, 2), (b, 30), (a, 12), (b, 31)]
    twin, hf_bf16 = exact_twin(hf), copy.deepcopy(hf).to(torch.bfloat16)

    def logits_of(m: torch.nn.Module) -> torch.Tensor:
        return torch.stack([hf_logits(m, ids)[i] for ids, i in rows])

    truth = logits_of(twin)
    # float32: as accurate as transformers' float32; bfloat16 weights and pool (the
    # weights' rounding dominates): as accurate as transformers' bfloat16 model
    num.assert_no_worse_than(
        results[torch.float32], logits_of(hf), truth, num.SAME_COMPUTATION, "float32"
    )
    num.assert_no_worse_than(
        results[torch.bfloat16], logits_of(hf_bf16), truth, num.SAME_ROUNDINGS, "bfloat16"
    )


@pytest.mark.parametrize("variant", ["llama-tied-gqa", "qwen2-bias-untied"])
def test_decode_passes_run_whole_with_the_cpu_backend(variant: str, kernels, tmp_path) -> None:
    """With the C++ decode attention backend a pass of decode rows only is one
    call (K/V written, attention, every layer); a pass with a prefill is not.
    Both give transformers' logits."""
    hf, model, harness = _setup(variant, tmp_path)
    backend = CpuAttentionBackend.load(
        harness.pool, harness.table, harness.config.attention_scale, cache_root() / "kernels"
    )
    small = SmallBatchForward(model, backend, kernels)
    assert small.step is not None
    twin = exact_twin(hf)
    seqs = {"a": _prompt(9, 0), "b": _prompt(20, 1), "c": _prompt(4, 2)}
    harness.run(model, [("a", seqs["a"][:-2]), ("b", seqs["b"][:-2])])
    # (sequence, its length after the pass, new tokens in the pass)
    mixed = [("a", len(seqs["a"]) - 1, 1), ("c", 4, 4), ("b", len(seqs["b"]) - 1, 1)]
    decode = [("a", len(seqs["a"]), 1), ("b", len(seqs["b"]), 1)]
    for steps, whole in ((mixed, 0), (decode, 1)):
        chunks = [(key, seqs[key][end - n : end]) for key, end, n in steps]
        with torch.inference_mode():
            hidden = small.run(_batch(harness, chunks))
            logits = model.compute_logits(hidden).split([n for _, _, n in steps])
        assert small.whole_steps == whole
        assert_like_transformers(list(logits), hf, twin, [seqs[key][:end] for key, end, _ in steps])


def test_the_torch_backend_runs_layer_by_layer(kernels, tmp_path: Path) -> None:
    _, model, harness = _setup("llama-tied-gqa", tmp_path)
    assert SmallBatchForward(model, harness.backend, kernels).step is None
