"""Sliding windows and the attention soft-cap (``AttentionScoring``) in every backend,
against plain attention computed over each whole sequence (float64, tests/numerics).

A window is a mask by absolute position: the pool keeps every token, so a prompt
longer than the window, a chunk on a cached prefix longer than it, decode steps
past it and a mixed pass must all attend exactly the keys p - W < k <= p."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from radixlm.kernels.paged_attention import allowed_keys
from radixlm.runtime.attention import (
    AttentionBackend,
    AttentionInputs,
    AttentionScoring,
    CpuAttentionBackend,
    TorchAttentionBackend,
    TritonAttentionBackend,
)
from radixlm.runtime.mem_cache.kv_pool import KVPool, ReqToTokenTable
from radixlm.runtime.model_store import cache_root
from radixlm.runtime.models import ArchConfig
from tests import numerics as num

H, HKV, D = 4, 2, 16
SCALE = D**-0.5
# "cpu-sdpa": the cpu backend without its extend kernel (prefills through SDPA groups).
BACKENDS = ["torch", "cpu", "cpu-sdpa", "triton"]
# Layer 0 slides over 5 positions, layer 1 attends fully, layer 2 slides over 12.
WINDOWS = (5, None, 12)
SCORINGS = {
    "windows": AttentionScoring(WINDOWS),
    "softcap": AttentionScoring((), 2.0),
    "windows+softcap": AttentionScoring(WINDOWS, 2.0),
}
LAYERS = len(WINDOWS)


def _backend(name: str, pool: KVPool, table: ReqToTokenTable, scoring: AttentionScoring):
    if name == "torch":
        return TorchAttentionBackend(pool, table, SCALE, scoring)
    if name == "triton":
        return TritonAttentionBackend(pool, table, SCALE, scoring=scoring)
    extend = name == "cpu"
    build_dir = cache_root() / "kernels"
    return CpuAttentionBackend.load(pool, table, SCALE, build_dir, extend=extend, scoring=scoring)


@dataclass
class _Sequence:
    """One request's whole sequence: every position's q/k/v in every layer, and
    the slots of its req_to_token row."""

    row: int
    slots: torch.Tensor  # (N,)
    q: torch.Tensor  # (L, N, H, D)
    k: torch.Tensor  # (L, N, Hkv, D)
    v: torch.Tensor


class _Harness:
    """A pool and table holding some sequences, and a backend over them."""

    def __init__(self, backend: str, scoring: AttentionScoring, lengths: list[int]) -> None:
        gen = torch.Generator().manual_seed(sum(lengths))
        self.scoring = scoring
        self.pool = KVPool(LAYERS, sum(lengths) + 8, HKV, D, torch.float32)
        self.pool.k.zero_()
        self.pool.v.zero_()
        self.table = ReqToTokenTable(len(lengths), max(lengths))
        self.sequences: list[_Sequence] = []
        next_slot = 1
        for n in lengths:
            row = self.table.allocate_row()
            assert row is not None
            slots = torch.arange(next_slot, next_slot + n)
            next_slot += n
            self.table.write(row, 0, slots)
            q = torch.randn(LAYERS, n, H, D, generator=gen) * 3  # scores of a few units
            k, v = torch.randn(2, LAYERS, n, HKV, D, generator=gen)
            self.sequences.append(_Sequence(row, slots, q, k, v))
        self.backend: AttentionBackend = _backend(backend, self.pool, self.table, scoring)

    def run(self, shape: list[tuple[int, int]], staged: bool = False) -> list[torch.Tensor]:
        """One pass: request i's positions cached .. cached + new - 1, its first
        ``cached`` K/V in the pool (as the radix cache holds them). Checks every
        layer's output against ``expected``; returns each layer's output."""
        for seq, (cached, _) in zip(self.sequences, shape, strict=True):
            for layer in range(LAYERS):
                self.pool.write(
                    layer, seq.slots[:cached], seq.k[layer, :cached], seq.v[layer, :cached]
                )
        inputs = AttentionInputs(
            rows=torch.tensor([s.row for s in self.sequences]),
            prefix_lens=torch.tensor([c for c, _ in shape]),
            extend_lens=torch.tensor([n for _, n in shape]),
            out_cache_loc=torch.cat(
                [s.slots[c : c + n] for s, (c, n) in zip(self.sequences, shape)]
            ),
        )
        backend = self.backend
        metadata = backend.prepare_staged_decode(inputs) if staged else backend.prepare(inputs)
        outs = []
        for layer in range(LAYERS):
            q, k, v = (
                torch.cat(
                    [getattr(s, name)[layer, c : c + n] for s, (c, n) in zip(self.sequences, shape)]
                )
                for name in ("q", "k", "v")
            )
            out = backend.forward(layer, q, k, v, metadata)
            start = 0
            for i, (cached, new) in enumerate(shape):
                want = self.expected(i, layer, cached, new)
                got = out[start : start + new]
                num.assert_within(
                    got, want.value, num.from_exact(want), f"request {i}, layer {layer}"
                )
                start += new
            outs.append(out)
        backend.commit(metadata)
        return outs

    def expected(self, i: int, layer: int, cached: int, new: int) -> num.Bounded:
        """Positions cached .. cached + new - 1 of sequence i over its whole sequence
        up to the last of them, windowed and capped as the layer says. (new, H, D)."""
        seq, end = self.sequences[i], cached + new
        keys, values = (
            num.exact(t[layer, :end]).map(lambda x: x.transpose(0, 1)) for t in (seq.k, seq.v)
        )
        queries = num.exact(seq.q[layer, cached:end]).map(lambda x: x.transpose(0, 1))
        allowed = allowed_keys(torch.arange(cached, end), end, self.scoring.window(layer) or 0)
        out = num.attention(queries, keys, values, SCALE, allowed, None, self.scoring.softcap)
        return out.map(lambda x: x.transpose(0, 1))


@pytest.mark.parametrize("scoring", list(SCORINGS))
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_prompt_longer_than_the_window_attends_fresh(backend: str, scoring: str) -> None:
    h = _Harness(backend, SCORINGS[scoring], [23])
    h.run([(0, 23)])


@pytest.mark.parametrize("scoring", list(SCORINGS))
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_cached_sequence_extended_by_a_chunk_then_decoded(backend: str, scoring: str) -> None:
    """A chunk of 8 on a cached prefix of 15 (longer than both windows), then decode
    steps past them, the staged (compiled-step) form among them: every step masks
    by absolute position, reading the whole sequence's K/V from the pool."""
    h = _Harness(backend, SCORINGS[scoring], [29])
    h.run([(0, 15)])
    h.run([(15, 8)])
    h.run([(23, 1)])
    h.run([(24, 1)], staged=True)
    h.run([(25, 1)])


@pytest.mark.parametrize("scoring", list(SCORINGS))
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_mixed_pass(backend: str, scoring: str) -> None:
    """Fresh prompts (longer and shorter than the windows), chunks on cached
    prefixes and decode rows of different lengths, interleaved, in one pass."""
    shape = [(0, 19), (6, 1), (14, 6), (0, 3), (20, 1), (3, 1), (0, 1), (11, 1)]
    h = _Harness(backend, SCORINGS[scoring], [c + n for c, n in shape])
    h.run(shape)


@pytest.mark.parametrize("scoring", list(SCORINGS))
@pytest.mark.parametrize("backend", BACKENDS)
def test_staged_decode_rows_of_different_lengths(backend: str, scoring: str) -> None:
    shape = [(2, 1), (17, 1), (9, 1), (30, 1)]
    h = _Harness(backend, SCORINGS[scoring], [c + n for c, n in shape])
    h.run(shape, staged=True)


def test_the_windows_and_the_cap_change_the_result() -> None:
    """The bounds are tight enough to tell: the plain attention of the same rows is
    far outside them (a test above passing is no accident of loose bounds)."""
    h = _Harness("torch", SCORINGS["windows+softcap"], [23])
    outs = h.run([(0, 23)])
    plain = _Harness("torch", AttentionScoring(), [23])
    for layer in range(LAYERS):
        want = h.expected(0, layer, 0, 23)
        ratio = (outs[layer].double() - plain.expected(0, layer, 0, 23).value).abs()
        assert (ratio / num.from_exact(want)).amax() > 100


def test_plain_layers_keep_the_fast_paths() -> None:
    """torch backend: a prompt no longer than a window attends with is_causal (no
    mask built), decode rows of one length without a mask, in every layer; a
    window narrower than the rows gets its own mask, the full layers none."""
    h = _Harness("torch", AttentionScoring((8, None)), [6, 6, 6])
    backend = h.backend
    fresh = backend.prepare(
        AttentionInputs(
            rows=torch.tensor([0]),
            prefix_lens=torch.tensor([0]),
            extend_lens=torch.tensor([6]),
            out_cache_loc=torch.arange(1, 7),
        )
    )
    (group,) = fresh.groups
    assert group.masks == {}
    decode = AttentionInputs(
        rows=torch.tensor([0, 1, 2]),
        prefix_lens=torch.tensor([5, 5, 5]),
        extend_lens=torch.ones(3, dtype=torch.int64),
        out_cache_loc=torch.tensor([6, 12, 18]),
    )
    (group,) = backend.prepare(decode).groups
    assert group.mask is None and group.window_masks == {8: None}
    narrow = TorchAttentionBackend(h.pool, h.table, SCALE, AttentionScoring((3, None)))
    (group,) = narrow.prepare(decode).groups
    assert group.mask is None and group.window_masks[3].shape == (3, 1, 1, 6)


def test_scoring_of_an_arch_and_its_checks() -> None:
    arch = ArchConfig(
        "Gemma2ForCausalLM",
        vocab_size=96,
        hidden_size=64,
        intermediate_size=112,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        layer_windows=(4096, None),
        attn_logit_softcap=50.0,
    )
    scoring = AttentionScoring.of(arch)
    assert scoring == AttentionScoring((4096, None), 50.0)
    assert [scoring.window(layer) for layer in range(2)] == [4096, None]
    assert [scoring.kernel_args(layer) for layer in range(2)] == [(4096, 50.0), (0, 50.0)]
    assert AttentionScoring().kernel_args(7) == (0, 0.0) and AttentionScoring().window(7) is None
    with pytest.raises(ValueError, match="sliding window must be positive, got 0"):
        AttentionScoring((0,))
    with pytest.raises(ValueError, match="soft-cap must be positive"):
        AttentionScoring((), 0.0)
