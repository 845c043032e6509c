"""SmallBatchForward over a quantized KV pool (int8 / fp8 codes with bfloat16 scales)
and the "cpu" attention backend: a decode pass run whole in C++ writes each layer's
new K/V as ``KVPool.write`` would (kv_quant.quantize), and computes what the
layer-by-layer path computes over the same pool."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from radixlm.kernels.cpu.small_batch import load_small_batch_kernels
from radixlm.runtime.attention import CpuAttentionBackend
from radixlm.runtime.executor.small_batch import SmallBatchForward
from radixlm.runtime.mem_cache.kv_pool import KVPool
from radixlm.runtime.mem_cache.kv_quant import kv_format
from radixlm.runtime.model_store import cache_root
from tests.runtime.executor.test_small_batch import _batch, _prompt, _setup


@pytest.fixture(scope="module")
def kernels():
    return load_small_batch_kernels(cache_root() / "kernels")


def _pool_bits(pool: KVPool) -> tuple[torch.Tensor, ...]:
    """Codes and scales, every layer, as their bits (the slots never written hold
    whatever the memory did, NaN patterns included, which compare unequal as floats)."""
    assert pool.k_scale is not None and pool.v_scale is not None
    codes = (pool.k.view(torch.uint8), pool.v.view(torch.uint8))
    return (*codes, pool.k_scale.view(torch.int16), pool.v_scale.view(torch.int16))


def _pool_state(pool: KVPool) -> list[torch.Tensor]:
    """``_pool_bits``, copied."""
    return [t.clone() for t in _pool_bits(pool)]


@pytest.mark.parametrize("name", ["int8", "fp8_e4m3", "fp8_e5m2"])
def test_whole_decode_step_writes_and_reads_a_quantized_pool(
    name: str, kernels, tmp_path: Path
) -> None:
    """Prompts prefilled layer by layer (the extend kernel over the codes), then one
    decode pass twice over the same pool: whole (one C++ call, K/V quantized in C++)
    and layer by layer (K/V quantized by ``KVPool.write``, the backend's decode
    kernel). Every layer's new codes and scales are bit-equal, and so are the hidden
    states up to the final norm's summation order."""
    _, model, harness = _setup("llama-tied-gqa", tmp_path)
    c = harness.config
    fmt = kv_format(name, torch.float32)
    pool = KVPool(
        c.num_layers, harness.num_slots, c.num_kv_heads, c.head_dim, torch.float32, fmt=fmt
    )
    backend = CpuAttentionBackend.load(
        pool, harness.table, c.attention_scale, cache_root() / "kernels"
    )
    small = SmallBatchForward(model, backend, kernels)
    with torch.inference_mode():
        small.run(_batch(harness, [("a", _prompt(9, 0)), ("b", _prompt(30, 1))]))
    assert small.whole_steps == 0
    batch = _batch(harness, [("a", [3]), ("b", [4])])
    slots = batch.attn.out_cache_loc
    before = _pool_state(pool)
    with torch.inference_mode():
        whole = small.run(batch)
    assert small.whole_steps == 1
    written = _pool_state(pool)
    for live, saved in zip(_pool_bits(pool), before, strict=True):
        live.copy_(saved)
    small.step = None  # the layer-by-layer path over the same pool
    with torch.inference_mode():
        layered = small.run(batch)
    assert small.whole_steps == 1
    for got, want in zip(written, _pool_state(pool), strict=True):
        assert torch.equal(got[:, slots], want[:, slots])
        untouched = torch.ones(got.shape[1], dtype=torch.bool)
        untouched[slots] = False
        assert torch.equal(got[:, untouched], want[:, untouched])
    torch.testing.assert_close(whole, layered, rtol=1e-5, atol=1e-6)
