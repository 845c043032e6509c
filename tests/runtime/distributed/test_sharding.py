"""ShardPlan: which heads, widths and token ids each rank holds, and the slice of each
checkpoint tensor it keeps (the ranks' slices put back together are the tensor)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from radixlm.runtime.distributed.sharding import ShardingError, ShardPlan
from radixlm.runtime.layers.quantization import Int4Codes, Int8Codes
from radixlm.runtime.models.config import ArchConfig, MoEConfig

ARCH = ArchConfig(
    architecture="LlamaForCausalLM",
    vocab_size=101,
    hidden_size=64,
    intermediate_size=96,
    num_layers=2,
    num_heads=9,
    num_kv_heads=3,
    head_dim=8,
)


def plans(arch: ArchConfig, size: int) -> list[ShardPlan]:
    return [ShardPlan(r, size, arch) for r in range(size)]


@pytest.mark.parametrize(
    ("heads", "kv_heads", "size", "expected"),
    [
        # SmolLM2's 9/3 over 2: whole KV groups, 2 and 1
        (9, 3, 2, [(range(0, 6), range(0, 2)), (range(6, 9), range(2, 3))]),
        (8, 8, 4, [(range(2 * r, 2 * r + 2), range(2 * r, 2 * r + 2)) for r in range(4)]),
        # fewer KV heads than ranks: each KV head replicated on the ranks that read it
        (4, 1, 2, [(range(0, 2), range(0, 1)), (range(2, 4), range(0, 1))]),
        (8, 2, 4, [(range(0, 2), range(0, 1)), (range(2, 4), range(0, 1)),
                   (range(4, 6), range(1, 2)), (range(6, 8), range(1, 2))]),
    ],
)  # fmt: skip
def test_heads_follow_their_kv_head(
    heads: int, kv_heads: int, size: int, expected: list[tuple[range, range]]
) -> None:
    arch = dataclasses.replace(ARCH, num_heads=heads, num_kv_heads=kv_heads)
    assert [p.heads() for p in plans(arch, size)] == expected
    for plan in plans(arch, size):  # every rank's local model is a valid GQA config
        local = plan.local_arch()
        assert local.num_heads % local.num_kv_heads == 0


def test_replicated_kv_heads_are_summed_once() -> None:
    arch = dataclasses.replace(ARCH, num_heads=8, num_kv_heads=2)
    assert [p.holds_kv_sum for p in plans(arch, 4)] == [1, 0, 1, 0]
    assert [p.holds_kv_sum for p in plans(ARCH, 2)] == [1, 1]


def test_heads_that_cannot_be_split_are_refused() -> None:
    arch = dataclasses.replace(ARCH, num_heads=6, num_kv_heads=1)
    with pytest.raises(ShardingError, match="6 query heads and 1 KV heads cannot be split over 4"):
        ShardPlan(0, 4, arch)


@pytest.mark.parametrize(("width", "size"), [(96, 2), (1536, 2), (100, 3), (8, 7), (8192, 8)])
def test_widths_split_into_whole_blocks(width: int, size: int) -> None:
    arch = dataclasses.replace(ARCH, num_heads=8, num_kv_heads=8)
    runs = [p.split(width) for p in plans(arch, size)]
    assert runs[0].start == 0 and runs[-1].stop == width
    assert all(a.stop == b.start for a, b in zip(runs, runs[1:]))
    assert max(map(len, runs)) - min(map(len, runs)) <= max(len(r) for r in runs) // 2 + 1
    if width % 32 == 0 and width // 32 >= size:  # quantization groups of 32 stay whole
        assert all(r.start % 32 == 0 for r in runs)
    with pytest.raises(ShardingError, match=f"a width of {size - 1} cannot be split"):
        ShardPlan(0, size, arch).split(size - 1)


def test_vocabulary_slices_cover_every_id() -> None:
    slices = [p.vocab() for p in plans(ARCH, 3)]
    assert slices == [range(0, 34), range(34, 68), range(68, 101)]
    assert {p.vocab_shard for p in plans(ARCH, 3)} == {34}


def _state(arch: ArchConfig) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    d, h, hkv, i = arch.head_dim, arch.num_heads, arch.num_kv_heads, arch.intermediate_size
    shapes = {
        "model.embed_tokens.weight": (arch.vocab_size, arch.hidden_size),
        "lm_head.weight": (arch.vocab_size, arch.hidden_size),
        "model.layers.0.self_attn.q_proj.weight": (h * d, arch.hidden_size),
        "model.layers.0.self_attn.q_proj.bias": (h * d,),
        "model.layers.0.self_attn.k_proj.weight": (hkv * d, arch.hidden_size),
        "model.layers.0.self_attn.v_proj.weight": (hkv * d, arch.hidden_size),
        "model.layers.0.self_attn.o_proj.weight": (arch.hidden_size, h * d),
        "model.layers.0.self_attn.o_proj.bias": (arch.hidden_size,),
        "model.layers.0.self_attn.q_norm.weight": (d,),
        "model.layers.0.mlp.gate_proj.weight": (i, arch.hidden_size),
        "model.layers.0.mlp.up_proj.weight": (i, arch.hidden_size),
        "model.layers.0.mlp.down_proj.weight": (arch.hidden_size, i),
        "model.layers.1.mlp.experts.3.gate_proj.weight": (32, arch.hidden_size),
        "model.layers.1.mlp.experts.3.down_proj.weight": (arch.hidden_size, 32),
        "model.layers.1.mlp.gate.weight": (4, arch.hidden_size),
        "model.layers.0.input_layernorm.weight": (arch.hidden_size,),
    }
    return {name: torch.randn(shape, generator=g) for name, shape in shapes.items()}


def test_the_ranks_slices_put_back_together_are_the_tensor() -> None:
    arch = dataclasses.replace(
        ARCH, moe=MoEConfig(num_experts=4, top_k=2, intermediate_size=32, normalize_top_k=True,
                            sparse_layers=(1,)),
    )  # fmt: skip
    state = _state(arch)
    shards = [dict(p.shard_tensors(iter(state.items()))) for p in plans(arch, 2)]
    row_parallel = {"o_proj", "down_proj"}
    for name, full in state.items():
        module, leaf = name.split(".")[-2:]
        parts = [s[name] for s in shards]
        if module in row_parallel and leaf == "bias":  # added once: rank 0's
            assert torch.equal(parts[0], full) and not parts[1].any()
        elif module in row_parallel:
            assert torch.equal(torch.cat(parts, dim=1), full)
        elif module in ("gate", "input_layernorm", "q_norm"):  # replicated
            assert all(torch.equal(p, full) for p in parts)
        else:
            assert torch.equal(torch.cat(parts), full), name
    # each rank's slice has the shape its local model expects
    for plan, shard in zip(plans(arch, 2), shards):
        local = plan.local_arch()
        q_rows = local.num_heads * local.head_dim
        assert shard["model.layers.0.self_attn.q_proj.weight"].shape[0] == q_rows
        assert shard["model.layers.0.self_attn.o_proj.weight"].shape[1] == q_rows
        assert shard["model.layers.0.mlp.down_proj.weight"].shape[1] == local.intermediate_size
        assert shard["model.layers.1.mlp.experts.3.down_proj.weight"].shape[1] == (
            local.moe.intermediate_size  # type: ignore[union-attr]
        )
        assert shard["lm_head.weight"].shape[0] == local.vocab_size


def test_fused_checkpoint_tensors_are_cut_part_by_part() -> None:
    """Phi-3 stores [q; k; v] and [gate; up] fused: each rank keeps its rows of each part."""
    plan = ShardPlan(1, 2, ARCH)
    d, h, hkv = ARCH.head_dim, ARCH.num_heads, ARCH.num_kv_heads
    qkv = torch.arange((h + 2 * hkv) * d, dtype=torch.float32)[:, None].expand(-1, 4)
    local = plan.shard_tensor("model.layers.0.self_attn.qkv_proj.weight", qkv)[:, 0].long()
    q_rows, kv_rows = range(6 * d, 9 * d), range(2 * d, 3 * d)
    expected = [*q_rows, *(h * d + r for r in kv_rows), *((h + hkv) * d + r for r in kv_rows)]
    assert local.tolist() == expected
    gate_up = torch.arange(2 * 96, dtype=torch.float32)[:, None]
    local = plan.shard_tensor("model.layers.0.mlp.gate_up_proj.weight", gate_up)[:, 0].long()
    assert local.tolist() == [*range(64, 96), *range(96 + 64, 192)]


def test_full_qk_norms_are_cut_with_their_projection() -> None:
    arch = dataclasses.replace(ARCH, qk_norm="full")
    plan = ShardPlan(1, 2, arch)
    weight = torch.arange(arch.num_heads * arch.head_dim, dtype=torch.float32)
    local = plan.shard_tensor("model.layers.0.self_attn.q_norm.weight", weight)
    assert local.tolist() == list(range(6 * 8, 9 * 8))


@pytest.mark.parametrize("kind", [Int4Codes, Int8Codes])
def test_codes_are_cut_on_whole_groups(kind: type) -> None:
    rows, cols, group = 64, 96, 32
    codes = kind(
        torch.randint(0, 15, (rows, cols), dtype=torch.uint8 if kind is Int4Codes else torch.int8),
        torch.rand(rows, cols // group),
        torch.rand(rows, cols // group),
    )
    plans2 = plans(ARCH, 2)
    down = [p.shard_tensor("model.layers.0.mlp.down_proj.weight", codes) for p in plans2]
    assert [c.shape for c in down] == [(64, 64), (64, 32)]
    assert torch.equal(torch.cat([c.dequantize() for c in down], dim=1), codes.dequantize())
    up = [p.shard_tensor("model.layers.0.mlp.up_proj.weight", codes) for p in plans2]
    assert torch.equal(torch.cat([c.dequantize() for c in up]), codes.dequantize())
    # an o_proj over 3 heads of 8 columns cannot keep groups of 32 whole
    with pytest.raises(ShardingError, match="cut its quantization groups of 32"):
        plans2[1].shard_tensor("model.layers.0.self_attn.o_proj.weight", codes)
