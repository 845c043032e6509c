"""SmallBatchForward: passes of a few tokens through the C++ layer kernels give the
model's logits (and transformers'), on tiny random Llama, Qwen2 and Qwen3 models."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from radixlm.kernels.small_batch import MAX_ROWS, load_small_batch_kernels
from radixlm.runtime.batch import ForwardBatch
from radixlm.runtime.layers.attention import CpuAttentionBackend
from radixlm.runtime.model_store import cache_root
from radixlm.runtime.models import ArchConfig
from radixlm.runtime.small_batch import SmallBatchForward
from tests.runtime.models.helpers import KVHarness, build_hf_model, hf_logits, save_hf

FP32_TOL = 1e-4
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
    for (key, tokens), ours in zip(chunks, logits, strict=True):
        expected = hf_logits(hf, seqs[key])[-len(tokens) :]
        torch.testing.assert_close(ours, expected, atol=FP32_TOL, rtol=0, msg=key)
    seqs["c"].append(7)
    with torch.inference_mode():
        ours = model.compute_logits(small.run(_batch(harness, [("c", [7])])))
    torch.testing.assert_close(ours, hf_logits(hf, seqs["c"])[-1:], atol=FP32_TOL, rtol=0)
    assert small.passes == 2


def test_small_pass_equals_the_eager_model(kernels, tmp_path: Path) -> None:
    """The same pass through the model's own forward: the same hidden states up to
    float32 summation order, and the same K/V written to the pass's slots."""
    hf, model, harness = _setup("qwen2-bias-untied", tmp_path)
    small = SmallBatchForward(model, harness.backend, kernels)
    harness.run(model, [("a", _prompt(12, 0))])
    batch = _batch(harness, [("a", [5]), ("b", [1, 2, 3])])
    slots = batch.attn.out_cache_loc
    with torch.inference_mode():
        ours = small.run(batch)
        ours_k, ours_v = harness.pool.k[:, slots].clone(), harness.pool.v[:, slots].clone()
        metadata = harness.backend.prepare(batch.attn)
        eager = model(batch.input_ids, batch.positions, metadata)
    torch.testing.assert_close(ours, eager, atol=1e-5, rtol=0)
    torch.testing.assert_close(harness.pool.k[:, slots], ours_k, atol=1e-5, rtol=0)
    torch.testing.assert_close(harness.pool.v[:, slots], ours_v, atol=1e-5, rtol=0)


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
    with the C++ attention backend) and a mixed one, against the float32 model
    through the same kernels, within bfloat16's precision."""
    results = {}
    for dtype in (torch.float32, torch.bfloat16):
        _, model, harness = _setup("qwen2-bias-untied", tmp_path / str(dtype), dtype)
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
        results[dtype] = torch.cat(logits)
    ref, got = results[torch.float32], results[torch.bfloat16]
    assert (got - ref).abs().max() <= 0.05 * ref.abs().max()
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.8


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
        for (key, end, n), ours in zip(steps, logits, strict=True):
            expected = hf_logits(hf, seqs[key][:end])[-n:]
            torch.testing.assert_close(ours, expected, atol=FP32_TOL, rtol=0, msg=key)


def test_the_torch_backend_runs_layer_by_layer(kernels, tmp_path: Path) -> None:
    _, model, harness = _setup("llama-tied-gqa", tmp_path)
    assert SmallBatchForward(model, harness.backend, kernels).step is None
