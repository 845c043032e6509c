"""SmallBatchForward over quantized weights (int4, int8 per row, int8 in groups): a
pass of decode rows runs as one C++ decode step that reads each matrix as it is
stored, and computes what the float decode step computes on the dequantized
weights; other passes stay with the model's own path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from radixlm.kernels.cpu.native import NATIVE, runnable_targets
from radixlm.kernels.cpu.small_batch import (
    MoeLayerWeights,
    QuantizedMatrix,
    load_small_batch_kernels,
)
from radixlm.runtime.attention import CpuAttentionBackend
from radixlm.runtime.executor.small_batch import INT8G_STEP_MAX_ROWS, SmallBatchForward
from radixlm.runtime.layers.quantization import (
    FEW_ROWS_MAX,
    Quantization,
    QuantizedLinear,
    cpu_int4_block,
)
from radixlm.runtime.model_store import cache_root
from radixlm.runtime.models import ArchConfig
from radixlm.runtime.models.loader import load_model
from radixlm.runtime.models.moe import SparseMoE
from tests.runtime.executor.test_small_batch import _batch, _prompt
from tests.runtime.models.helpers import KVHarness, build_hf_model, save_hf

# int4 groups of 32 divide every layer's inputs here (64 hidden, 160 intermediate)
SHAPE = {"intermediate_size": 160}
METHODS = {
    "int4": Quantization("int4", 32),
    "int8": Quantization("int8"),
    "int8g": Quantization("int8g", 16),
}


@pytest.fixture(scope="module", params=[*runnable_targets(), NATIVE], ids=lambda t: t.name)
def kernels(request: pytest.FixtureRequest):
    """Every ISA build and the native one (its VNNI dot products): the steps' code
    differs by build (vector widths, the dot-product paths)."""
    return load_small_batch_kernels(cache_root() / "kernels", request.param)


def _models(kind: str, method: str, tmp_path: Path, dtype: torch.dtype):
    """(quantized model, float model holding its dequantized weights, harness)."""
    if method == "int4" and not cpu_int4_block():
        pytest.skip("torch's int4 layout on this CPU is not one radixlm reads")
    overrides = {**SHAPE, "tie_word_embeddings": kind == "llama"}
    path = save_hf(build_hf_model(kind, **overrides), tmp_path / kind)
    config = ArchConfig.from_model_dir(path)
    harness = KVHarness(config, dtype=dtype)
    quantized = load_model(
        path, harness.backend, dtype, config=config, quantization=METHODS[method]
    )
    dequantized = load_model(path, harness.backend, dtype, config=config)
    floats = dict(dequantized.named_modules())
    with torch.no_grad():
        for name, q in quantized.named_modules():
            if isinstance(q, QuantizedLinear) and name.startswith("model.layers."):
                floats[name].weight.copy_(q.qweight.dequantize(torch.float32))
        # the token embeddings too (int8 in a quantized model, the LM head's when tied)
        vocabulary = torch.arange(config.vocab_size)
        dequantized.model.embed_tokens.weight.copy_(quantized.model.embed_tokens(vocabulary))
    return quantized, dequantized, harness


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_decode_step_over_quantized_weights_is_the_dequantized_step(
    kind: str, method: str, kernels, tmp_path: Path
) -> None:
    """Prompts prefilled by the float model, then one pass of three decode rows,
    whole, twice over the same pool: quantized weights read as stored, and their
    dequantized values as float32 weights. The same hidden states up to summation
    order (float32 both)."""
    quantized, dequantized, harness = _models(kind, method, tmp_path, torch.float32)
    c = harness.config
    backend = CpuAttentionBackend.load(
        harness.pool, harness.table, c.attention_scale, cache_root() / "kernels"
    )
    assert SmallBatchForward.supports(quantized)
    small = SmallBatchForward(quantized, backend, kernels)
    reference = SmallBatchForward(dequantized, backend, kernels)
    assert all(isinstance(w.qkv, QuantizedMatrix) for w in small.layers)
    seqs = {"a": _prompt(9, 0), "b": _prompt(30, 1), "c": _prompt(3, 2)}
    harness.run(dequantized, [(key, ids) for key, ids in seqs.items()])
    batch = _batch(harness, [("a", [3]), ("b", [4]), ("c", [5])])
    with torch.inference_mode():
        whole = small.run(batch)
        want = reference.run(batch)  # rewrites the same slots, from the same prefix
    assert (small.whole_steps, reference.whole_steps) == (1, 1)
    if any(kernels.dot_products(w.qkv) for w in small.layers):
        # VNNI dot products: every product's inputs rounded to 8 bits per 32 (exact
        # to the rounding in tests/kernels/cpu/test_small_batch_quant.py); through 2
        # layers of random weights that is 0.6-0.9% of the hidden states here, where a
        # bias, a zero point or a scale missing is tens of percent
        assert (whole - want).norm() / want.norm() < 0.02
    else:
        torch.testing.assert_close(whole, want, rtol=1e-4, atol=1e-4)


def test_only_whole_decode_steps_are_taken(kernels, tmp_path: Path) -> None:
    """A prompt pass, or any pass under a backend without the C++ decode kernel,
    stays with the quantized model's own path."""
    quantized, _, harness = _models("llama", "int4", tmp_path, torch.bfloat16)
    c = harness.config
    cpu = CpuAttentionBackend.load(
        harness.pool, harness.table, c.attention_scale, cache_root() / "kernels"
    )
    small = SmallBatchForward(quantized, cpu, kernels)
    harness.run(quantized, [("a", _prompt(9, 0))])
    assert not small.accepts(_batch(harness, [("b", _prompt(4, 1))]))
    assert small.accepts(_batch(harness, [("a", [3])]))
    layered = SmallBatchForward(quantized, harness.backend, kernels)  # the torch backend
    assert layered.step is None
    assert not layered.accepts(_batch(harness, [("a", [3])]))


@pytest.mark.parametrize(
    ("method", "rows"),
    [("int4", FEW_ROWS_MAX), ("int8", FEW_ROWS_MAX), ("int8g", INT8G_STEP_MAX_ROWS)],
)
def test_the_whole_step_takes_fewer_rows_over_int8_group_layers(
    method: str, rows: int, kernels, tmp_path: Path
) -> None:
    """FEW_ROWS_MAX rows, INT8G_STEP_MAX_ROWS over int8-group layers (past it the
    model's dequantize + GEMM decodes faster)."""
    quantized, _, harness = _models("llama", method, tmp_path, torch.float32)
    c = harness.config
    cpu = CpuAttentionBackend.load(
        harness.pool, harness.table, c.attention_scale, cache_root() / "kernels"
    )
    assert SmallBatchForward(quantized, cpu, kernels).max_rows == rows
    assert SmallBatchForward(quantized, cpu, kernels, max_rows=8).max_rows == 8


def test_bfloat16_step_stays_close_to_the_model(kernels, tmp_path: Path) -> None:
    """The bfloat16 model's own path rounds activations to bfloat16 around each
    product; the step keeps them float32 (or rounds them to 8 bits per 32 on dot
    products): close, not equal."""
    quantized, _, harness = _models("llama", "int4", tmp_path, torch.bfloat16)
    c = harness.config
    backend = CpuAttentionBackend.load(
        harness.pool, harness.table, c.attention_scale, cache_root() / "kernels"
    )
    small = SmallBatchForward(quantized, backend, kernels)
    prompt = _prompt(12, 0)
    harness.run(quantized, [("a", prompt), ("b", prompt)])
    with torch.inference_mode():  # the same token after the same prefix, each way
        whole = quantized.compute_logits(small.run(_batch(harness, [("a", [3])])))[0].float()
        model = harness.run(quantized, [("b", [3])])[0][0].float()
    assert small.whole_steps == 1
    assert whole.argmax() == model.argmax()
    # bfloat16 activations against float32 ones (and, on VNNI dot products, inputs
    # rounded to 8 bits per 32): 1.8% of the logits here; a wrong scale or bias is
    # tens of percent
    assert (whole - model).norm() / model.norm() < 0.04


@pytest.mark.parametrize("method", ["int4", "int8g"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mixture_of_experts_step_is_the_model(
    method: str, dtype: torch.dtype, kernels, tmp_path: Path
) -> None:
    """A Qwen3-MoE model whose attention matrices and experts are quantized runs its
    decode rows in one step: each layer's router, routes and experts inside it. Its
    logits are the model's own path's, which takes the same products
    (``use_small_batch``, ``use_cpu_experts``): float32 sums in another order, and
    in bfloat16 the model's activations rounded between its ops."""
    if method == "int4" and not cpu_int4_block():
        pytest.skip("torch's int4 layout on this CPU is not one radixlm reads")
    path = save_hf(build_hf_model("qwen3_moe"), tmp_path / "moe")
    config = ArchConfig.from_model_dir(path)
    harness = KVHarness(config, dtype=dtype)
    model = load_model(path, harness.backend, dtype, config=config, quantization=METHODS[method])
    assert not SmallBatchForward.supports(model)  # its experts are not in one call yet
    for module in model.modules():
        if isinstance(module, SparseMoE):
            assert module.use_cpu_experts(kernels)
        elif isinstance(module, QuantizedLinear):
            module.use_small_batch(kernels)
    assert SmallBatchForward.supports(model)
    backend = CpuAttentionBackend.load(
        harness.pool, harness.table, config.attention_scale, cache_root() / "kernels"
    )
    small = SmallBatchForward(model, backend, kernels)
    assert all(isinstance(w, MoeLayerWeights) for w in small.layers)
    first, second = _prompt(12, 0), _prompt(5, 1)
    harness.run(model, [("a", first), ("b", first), ("c", second), ("d", second)])
    batch = _batch(harness, [("a", [3]), ("c", [7])])
    assert small.accepts(batch)
    with torch.inference_mode():  # the same tokens after the same prefixes, each way
        whole = model.compute_logits(small.run(batch)).float()
        own = torch.cat(harness.run(model, [("b", [3]), ("d", [7])])).float()
    assert small.whole_steps == 1
    assert torch.equal(whole.argmax(dim=-1), own.argmax(dim=-1))
    # float32: the same products summed in another order (an expert chosen wrongly,
    # or a weight of the route, is tens of percent); bfloat16: ~1-2% here
    bound = 1e-3 if dtype == torch.float32 else 0.04
    assert (whole - own).norm() / own.norm() < bound
    assert not small.accepts(_batch(harness, [("a", [4, 5])]))  # a prompt pass: the model's
