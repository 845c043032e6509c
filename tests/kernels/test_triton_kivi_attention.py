"""The Triton KIVI attention kernels (decode, extend) against float64 attention over the
pool as ``kivi.gather`` reads it: 4 and 2 bits, GQA, sliding windows, soft-caps,
splits, head dims whose key parameters fill a slot unevenly, 16-bit models. Triton
runs on CUDA, else on CPU through its interpreter (tests/conftest.py)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

pytest.importorskip("triton")

from radixlm.kernels.triton.kivi_cache import KiviCache  # noqa: E402
from radixlm.kernels.triton.kivi_decode_attention import decode_attention_kivi_triton  # noqa: E402
from radixlm.kernels.triton.kivi_extend_attention import extend_attention_kivi_triton  # noqa: E402
from radixlm.runtime.mem_cache import kivi  # noqa: E402
from radixlm.runtime.mem_cache.kivi import KiviWrites  # noqa: E402
from radixlm.runtime.mem_cache.kv_pool import KVPool, ReqToTokenTable  # noqa: E402
from radixlm.runtime.mem_cache.kv_quant import kv_format  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
G = kivi.KIVI_GROUP
# float32 attention over float32 values against float64; 16-bit outputs are rounded
# once (a bfloat16 ulp is 2^-7 of the value: the interpreter truncates, a GPU rounds)
TOLERANCE = {torch.float32: (2e-5, 0.0), torch.float16: (4e-3, 2e-3), torch.bfloat16: (2e-2, 1e-2)}


@dataclass
class _Cache:
    pool: KVPool
    table: ReqToTokenTable
    rows: torch.Tensor  # (B,)
    seq_lens: torch.Tensor  # (B,) tokens stored

    def layer(self) -> KiviCache:
        layout = self.pool.kivi_layout
        pool = self.pool
        return KiviCache(
            pool.k[0],
            pool.v[0],
            pool.meta[0],
            pool.window_k[0],
            pool.window_v[0],
            layout.bits,
            layout.group,
            layout.value_group,
        )


def _cache(fmt: str, lens: list[int], kv_heads: int, dim: int, dtype: torch.dtype) -> _Cache:
    """Requests of ``lens`` tokens each, written in passes of 11 (groups quantized as
    they complete, the rest in the windows), slots in no order."""
    gen = torch.Generator().manual_seed(len(lens) + dim)
    pool = KVPool(1, sum(lens) + 4, kv_heads, dim, dtype, DEVICE, kv_format(fmt, dtype), len(lens))
    table = ReqToTokenTable(len(lens), 192, DEVICE)
    slots = torch.randperm(sum(lens), generator=gen) + 1
    rows = []
    for n in lens:
        row = table.allocate_row()
        assert row is not None
        own, slots = slots[:n], slots[n:]
        table.write(row, 0, own)
        for done in range(0, n, 11):
            m = min(11, n - done)
            k, v = (torch.randn(2, m, kv_heads, dim, generator=gen) * 2 - 1).to(dtype)
            writes = KiviWrites.plan(table.table, [row], [done], [m], G, torch.device(DEVICE))
            writes.store(pool, 0, k.to(DEVICE), v.to(DEVICE))
        rows.append(row)
    return _Cache(pool, table, torch.tensor(rows, device=DEVICE), torch.tensor(lens, device=DEVICE))


def _reference(
    c: _Cache, q: torch.Tensor, row: int, positions: list[int], window: int, softcap: float
) -> torch.Tensor:
    """float64 attention of queries q (T, H, D) at ``positions`` of request ``row``."""
    n = int(c.seq_lens[row])
    slots = c.table.table[c.rows[row], :n][None]
    keys, values = (
        x[0].double().cpu()
        for x in kivi.gather(c.pool, 0, slots, c.rows[row : row + 1], c.seq_lens[row : row + 1])
    )
    group = q.shape[1] // keys.shape[1]
    keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
    scores = torch.einsum("thd,shd->ths", q.double().cpu(), keys) * q.shape[2] ** -0.5
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    p, k = torch.tensor(positions)[:, None], torch.arange(n)[None, :]
    allowed = (k <= p) & ((k > p - window) if window > 0 else True)
    scores = scores.masked_fill(~allowed[:, None, :], float("-inf"))
    return torch.einsum("ths,shd->thd", scores.softmax(-1), values)


def _decode(fmt, lens, heads, kv_heads, dim, dtype, window=0, softcap=0.0, splits=2, floor=1):
    c = _cache(fmt, lens, kv_heads, dim, dtype)
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(len(lens), heads, dim, generator=gen).to(dtype).to(DEVICE)
    table = c.table.table
    out = decode_attention_kivi_triton(
        q, c.layer(), table, c.rows, c.seq_lens, dim**-0.5, None, splits, window, softcap, floor
    )
    want = torch.cat(
        [_reference(c, q[i : i + 1], i, [n - 1], window, softcap) for i, n in enumerate(lens)]
    )
    atol, rtol = TOLERANCE[dtype]
    torch.testing.assert_close(out.double().cpu(), want, atol=atol, rtol=rtol)


def _extend(fmt, shape, heads, kv_heads, dim, dtype, window=0, softcap=0.0):
    """shape: (cached, new) per request; all of them stored, as a KIVI pass stores first."""
    c = _cache(fmt, [a + b for a, b in shape], kv_heads, dim, dtype)
    gen = torch.Generator().manual_seed(8)
    num_tokens = sum(b for _, b in shape)
    q = torch.randn(num_tokens, heads, dim, generator=gen).to(dtype).to(DEVICE)
    prefix = torch.tensor([a for a, _ in shape], device=DEVICE)
    extend = torch.tensor([b for _, b in shape], device=DEVICE)
    starts = torch.cumsum(extend, 0) - extend
    out = extend_attention_kivi_triton(
        q, c.layer(), c.table.table, c.rows, prefix, extend, starts, int(extend.max()),
        dim**-0.5, window=window, softcap=softcap,
    )  # fmt: skip
    want, start = [], 0
    for i, (a, b) in enumerate(shape):
        want.append(_reference(c, q[start : start + b], i, list(range(a, a + b)), window, softcap))
        start += b
    atol, rtol = TOLERANCE[dtype]
    torch.testing.assert_close(out.double().cpu(), torch.cat(want), atol=atol, rtol=rtol)


DECODE_LENS = [1, 31, 32, 33, 70, 96]  # inside a group, on its edges, past several
EXTEND_SHAPE = [(0, 40), (32, 7), (20, 50), (3, 1), (33, 31)]


@pytest.mark.parametrize("fmt", ["kivi4", "kivi2"])
@pytest.mark.parametrize("heads, kv_heads", [(4, 2), (6, 1), (2, 2)])
def test_decode_over_a_kivi_pool(fmt, heads, kv_heads):
    _decode(fmt, DECODE_LENS, heads, kv_heads, 64, torch.float32)


@pytest.mark.parametrize("fmt", ["kivi4", "kivi2"])
@pytest.mark.parametrize("heads, kv_heads", [(4, 2), (3, 1)])
def test_extend_over_a_kivi_pool(fmt, heads, kv_heads):
    _extend(fmt, EXTEND_SHAPE, heads, kv_heads, 64, torch.float32)


@pytest.mark.parametrize("dim", [96, 128])
def test_head_dims(dim):
    """96: each slot holds 6 of its group's 192 key parameters (a padded block of 128)."""
    _decode("kivi4", [33, 70], 2, 1, dim, torch.float32)
    _extend("kivi2", [(10, 30), (0, 33)], 2, 1, dim, torch.float32)


@pytest.mark.parametrize("window, softcap", [(5, 0.0), (40, 0.0), (0, 3.0), (20, 2.5)])
def test_window_and_softcap(window, softcap):
    _decode("kivi4", DECODE_LENS, 4, 2, 64, torch.float32, window, softcap)
    _extend("kivi2", EXTEND_SHAPE, 4, 2, 64, torch.float32, window, softcap)


@pytest.mark.parametrize("splits, floor", [(1, 1), (3, 1), (4, 40)])
def test_decode_splits(splits, floor):
    """Splits of whole groups: more splits than groups, a floor over a group."""
    _decode("kivi4", [1, 33, 96, 150], 4, 2, 64, torch.float32, 0, 0.0, splits, floor)
    _decode("kivi2", [70, 150], 4, 2, 64, torch.float32, 50, 0.0, splits, floor)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_16_bit_models(dtype):
    _decode("kivi4", DECODE_LENS, 4, 2, 64, dtype, 0, 2.0)
    _extend("kivi4", EXTEND_SHAPE, 4, 2, 64, dtype, 30)


def test_argument_errors():
    c = _cache("kivi4", [5], 2, 64, torch.float32)
    q = torch.zeros(1, 4, 64, device=DEVICE)
    table, rows, lens = c.table.table, c.rows, c.seq_lens
    with pytest.raises(ValueError, match="head dim"):
        decode_attention_kivi_triton(q[..., :32], c.layer(), table, rows, lens, 1.0)
    with pytest.raises(ValueError, match="window_k"):
        decode_attention_kivi_triton(q.half(), c.layer(), table, rows, lens, 1.0)
    with pytest.raises(ValueError, match="seq_lens"):
        decode_attention_kivi_triton(q, c.layer(), table, rows, lens.float(), 1.0)
    with pytest.raises(ValueError, match="extend_starts"):
        extend_attention_kivi_triton(q, c.layer(), table, rows, lens, lens, lens[:0], 1, 1.0)
