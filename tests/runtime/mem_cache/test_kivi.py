"""KIVI pools: codes, parameters and windows written pass by pass, read back by
position, against quantizing each sequence's floats directly."""

from __future__ import annotations

import pytest
import torch

from radixlm.runtime.mem_cache.kivi import (
    KiviLayout,
    KiviWrites,
    dequantize_keys,
    dequantize_values,
    gather,
    pack,
    quantize_keys,
    quantize_values,
    unpack,
)
from radixlm.runtime.mem_cache.kv_pool import KVPool, ReqToTokenTable, SlotAllocator
from radixlm.runtime.mem_cache.kv_quant import KVCacheDtypeError, kv_format

G = 32


@pytest.mark.parametrize("bits", [4, 2])
def test_pack_round_trips(bits):
    layout = KiviLayout(bits)
    codes = torch.randint(0, 1 << bits, (5, 3, 64), dtype=torch.uint8)
    packed = pack(codes, layout)
    assert packed.shape == (5, 3, 64 * bits // 8)
    assert torch.equal(unpack(packed, layout), codes)


@pytest.mark.parametrize("bits", [4, 2])
def test_quantize_spans_each_range(bits):
    layout = KiviLayout(bits)
    torch.manual_seed(0)
    x = torch.randn(3, G, 2, 64) * 4 + 7
    codes, scale, minimum = quantize_keys(x, layout)
    assert int(codes.max()) == layout.max_code and int(codes.min()) == 0
    back = dequantize_keys(codes, scale, minimum, torch.float32)
    # each value within half a step (and the float16 parameters' rounding)
    step = scale.float()[:, None]
    assert bool(((back - x).abs() <= step / 2 + 1e-2).all())
    v_codes, v_scale, v_min = quantize_values(x, layout)
    assert v_scale.shape == (3, G, 2, 2)
    v_back = dequantize_values(v_codes, v_scale, v_min, layout, torch.float32)
    v_step = v_scale.float().repeat_interleave(32, -1)
    assert bool(((v_back - x).abs() <= v_step / 2 + 1e-2).all())


def test_constant_group_is_exact():
    layout = KiviLayout(4)
    x = torch.full((1, G, 1, 64), 0.5)
    codes, scale, minimum = quantize_keys(x, layout)
    assert bool((scale == 0).all()) and bool((codes == 0).all())
    assert torch.equal(dequantize_keys(codes, scale, minimum, torch.float32), x)


def test_formats_and_bytes():
    fmt = kv_format("kivi4", torch.bfloat16)
    assert fmt.kivi == KiviLayout(4) and not fmt.quantized
    # per token-head: 32 + 32 bytes of codes, 8 float16 parameters (4 of its key
    # group's, 2 value scales, 2 value minimums): 80 bytes against bfloat16's 256
    assert fmt.bytes_per_token(30, 3, 64) == 30 * 3 * (64 + 2 * 8)
    assert kv_format("kivi2", torch.bfloat16).bytes_per_token(1, 1, 64) == 16 + 16 + 16
    with pytest.raises(KVCacheDtypeError, match="kivi4"):
        kv_format("kivi3", torch.bfloat16)
    with pytest.raises(ValueError, match="multiple of 32"):
        KVPool(1, 8, 1, 40, torch.float32, fmt=fmt, rows=1)
    with pytest.raises(ValueError, match="rows="):
        KVPool(1, 8, 1, 64, torch.float32, fmt=fmt)


def _expected(x: torch.Tensor, n: int, layout: KiviLayout) -> torch.Tensor:
    """What a KIVI pool holds of one sequence's first n keys (x: (n, Hkv, D))."""
    whole = n // G * G
    out = x.clone()
    if whole:
        groups = x[:whole].view(-1, G, *x.shape[1:])
        codes, scale, minimum = quantize_keys(groups, layout)
        out[:whole] = dequantize_keys(codes, scale, minimum, torch.float32).flatten(0, 1)
    return out


def _expected_values(x: torch.Tensor, n: int, layout: KiviLayout) -> torch.Tensor:
    whole = n // G * G
    out = x.clone()
    if whole:
        codes, scale, minimum = quantize_values(x[:whole], layout)
        out[:whole] = dequantize_values(codes, scale, minimum, layout, torch.float32)
    return out


@pytest.mark.parametrize("bits", [4, 2])
def test_passes_write_what_quantizing_each_sequence_gives(bits):
    """Two sequences written by prefills, chunks and decode steps of every size (groups
    completed across passes, from the window and the pass together) read back as their
    floats quantized group by group, the positions past the last whole group as floats."""
    layers, heads, dim = 2, 2, 64
    fmt = kv_format(f"kivi{bits}", torch.float32)
    layout = fmt.kivi
    pool = KVPool(layers, 400, heads, dim, torch.float32, fmt=fmt, rows=3)
    table = ReqToTokenTable(3, 256)
    allocator = SlotAllocator(400)
    torch.manual_seed(1)
    truth = {r: torch.randn(layers, 200, 2, heads, dim) * 3 for r in (0, 2)}  # K, V
    lens = {0: 0, 2: 0}
    # each pass: {row: new tokens}
    passes = [{0: 45, 2: 7}, {0: 1, 2: 30}, {0: 18}, {2: 1}, {0: 1, 2: 1}, {0: 64, 2: 33}]
    for step in passes:
        rows, prefix, extend = list(step), [lens[r] for r in step], list(step.values())
        for r, s, n in zip(rows, prefix, extend):
            table.write(r, s, allocator.allocate(n))
        writes = KiviWrites.plan(table.table, rows, prefix, extend, G, torch.device("cpu"))
        for layer in range(layers):
            new = torch.cat([truth[r][layer, s : s + n] for r, s, n in zip(rows, prefix, extend)])
            writes.store(pool, layer, new[:, 0], new[:, 1])
        for r, n in zip(rows, extend):
            lens[r] += n
        width = max(lens.values()) + 5  # padded past every sequence
        seq = torch.tensor([lens[0], lens[2]])
        slots = torch.stack([table.table[r, :width] for r in (0, 2)])
        slots = torch.where(torch.arange(width) < seq[:, None], slots, 0)
        for layer in range(layers):
            k, v = gather(pool, layer, slots, torch.tensor([0, 2]), seq)
            for i, r in enumerate((0, 2)):
                n = lens[r]
                x = truth[r][layer, :n]
                assert torch.equal(k[i, :n], _expected(x[:, 0], n, layout))
                assert torch.equal(v[i, :n], _expected_values(x[:, 1], n, layout))
                assert bool(torch.isfinite(k[i]).all() and torch.isfinite(v[i]).all())
