"""The mixture-of-experts MLP in Triton: two grouped GEMMs over (expert, row block) tiles.

Contract: ``radixlm.kernels.moe.grouped_experts_reference``.

The T k slots (s = t k + j: token t's j-th choice) are sorted by expert
(``sort_by_expert``) and each expert's run of sorted positions is cut into blocks
of BLOCK_M rows; an expert no slot chose has no block, so nothing reads its
weights::

    sorted position p:  | expert 0: 20 slots | expert 3: 5 | expert 6: 40 slots      |
    blocks (16 rows):   | 0      | 1         | 2           | 3      | 4      | 5      |  6 7
    block_expert:         0        0           3             6        6        6        E E
    block_start:          0        16          20            25       41       57

    stage 1, program (block, I tile): rows p of the block, t = slots[p] // k
        hidden[p, n] = act(x[t] . gate_e[n]) * (x[t] . up_e[n])         (BLOCK_M, BLOCK_N)
    stage 2, program (block, H tile):
        partial[slots[p], n] = topk_weights[slots[p]] * (hidden[p] . down_e[n])
    stage 3: out[t] = sum_{j < k} partial[t k + j]  (torch, float32), rounded to x's dtype

The grid is sized from shapes alone, for the most blocks any routing can need
(each expert's last block may be partial); programs past the last block find
``block_expert == E`` and exit before reading anything. Nothing is read on the
host (no sync; capture in a CUDA graph is meant to work but not yet tried).

``hidden`` is stored in x's dtype: the down GEMM's operand on the tensor cores,
as a bfloat16 model's own MLP rounds it: one rounding the float32 reference does
not make (the tests' bounds allow it). Accumulators, the activation and
the routing weight's product are float32; float32 operands multiply with IEEE
precision (no TF32).

Why stage 3 rather than float32 atomic adds into (T, H): atomics land in the
order the programs finish, so a token's output could change in its last bits from
one run to the next (and a greedy decode with it). Each slot's contribution is
instead written once, and the k of a token are summed in one fixed order: the
result is reproducible and does not depend on the launch. The price is a
(T k, H) float32 scratch written and read once (T k H 8 bytes of traffic, small
next to the experts' weights at decode sizes; a long prefill can be chunked).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from radixlm.kernels.moe import (
    ExpertArgumentError,
    ExpertOrder,
    check_grouped_experts_args,
    sort_by_expert,
)
from radixlm.kernels.triton.decode_attention import dot_dtype, dot_precision

__all__ = ["grouped_experts_triton"]

# gelu_tanh(g) = 0.5 g (1 + tanh(c (g + 0.044715 g^3))) = g sigmoid(2 c (g + 0.044715 g^3)),
# c = sqrt(2 / pi): the kernel shares silu's sigmoid.
_GELU_C1 = tl.constexpr(2 * math.sqrt(2 / math.pi))
_GELU_C3 = tl.constexpr(2 * math.sqrt(2 / math.pi) * 0.044715)


@triton.jit
def _gate_up_kernel(
    x_ptr,
    w_ptr,
    hidden_ptr,
    slots_ptr,
    offsets_ptr,
    block_expert_ptr,
    block_start_ptr,
    num_experts,
    hidden_size,
    inter_size,
    top_k,
    stride_xt,
    stride_we,
    stride_wn,
    stride_ht,
    ACTIVATION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Program (block, I tile): stage 1 of the module docstring."""
    expert = tl.load(block_expert_ptr + tl.program_id(0))
    if expert >= num_experts:
        return
    expert = expert.to(tl.int64)
    offs_m = tl.load(block_start_ptr + tl.program_id(0)) + tl.arange(0, BLOCK_M)
    m_ok = offs_m < tl.load(offsets_ptr + expert + 1)
    tokens = tl.load(slots_ptr + offs_m, mask=m_ok, other=0) // top_k
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < inter_size
    offs_k = tl.arange(0, BLOCK_K)

    x_ptrs = x_ptr + tokens[:, None] * stride_xt + offs_k[None, :]  # (BLOCK_M, BLOCK_K)
    gate_ptrs = w_ptr + expert * stride_we + offs_n[None, :] * stride_wn + offs_k[:, None]
    up_ptrs = gate_ptrs + inter_size * stride_wn  # (BLOCK_K, BLOCK_N), W^T tiles
    gate = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, hidden_size, BLOCK_K):
        k_ok = offs_k < hidden_size - k0
        a = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0).to(DOT_DTYPE)
        w_ok = k_ok[:, None] & n_ok[None, :]
        w_gate = tl.load(gate_ptrs, mask=w_ok, other=0.0).to(DOT_DTYPE)
        w_up = tl.load(up_ptrs, mask=w_ok, other=0.0).to(DOT_DTYPE)
        gate = tl.dot(a, w_gate, gate, input_precision=DOT_PRECISION)
        up = tl.dot(a, w_up, up, input_precision=DOT_PRECISION)
        x_ptrs += BLOCK_K
        gate_ptrs += BLOCK_K
        up_ptrs += BLOCK_K

    if ACTIVATION == "gelu_tanh":
        z = gate * (_GELU_C1 + _GELU_C3 * (gate * gate))
    else:
        z = gate
    e = tl.exp(-tl.abs(z))  # sigmoid(z) without overflow: 1 / (1 + e) or e / (1 + e)
    sigmoid = tl.math.div_rn(tl.where(z >= 0, 1.0, e), 1.0 + e)
    h = gate * sigmoid * up
    h_ptrs = hidden_ptr + offs_m[:, None] * stride_ht + offs_n[None, :]
    tl.store(h_ptrs, h.to(hidden_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _down_kernel(
    hidden_ptr,
    w_ptr,
    topk_weights_ptr,
    partial_ptr,
    slots_ptr,
    offsets_ptr,
    block_expert_ptr,
    block_start_ptr,
    num_experts,
    hidden_size,
    inter_size,
    stride_ht,
    stride_we,
    stride_wn,
    stride_pt,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Program (block, H tile): stage 2 of the module docstring."""
    expert = tl.load(block_expert_ptr + tl.program_id(0))
    if expert >= num_experts:
        return
    expert = expert.to(tl.int64)
    offs_m = tl.load(block_start_ptr + tl.program_id(0)) + tl.arange(0, BLOCK_M)
    m_ok = offs_m < tl.load(offsets_ptr + expert + 1)
    slots = tl.load(slots_ptr + offs_m, mask=m_ok, other=0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < hidden_size
    offs_k = tl.arange(0, BLOCK_K)

    h_ptrs = hidden_ptr + offs_m[:, None] * stride_ht + offs_k[None, :]  # (BLOCK_M, BLOCK_K)
    w_ptrs = w_ptr + expert * stride_we + offs_n[None, :] * stride_wn + offs_k[:, None]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, inter_size, BLOCK_K):
        k_ok = offs_k < inter_size - k0
        h = tl.load(h_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0).to(DOT_DTYPE)
        w = tl.load(w_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0).to(DOT_DTYPE)
        acc = tl.dot(h, w, acc, input_precision=DOT_PRECISION)
        h_ptrs += BLOCK_K
        w_ptrs += BLOCK_K

    weight = tl.load(topk_weights_ptr + slots, mask=m_ok, other=0.0)  # (BLOCK_M,) float32
    p_ptrs = partial_ptr + slots[:, None] * stride_pt + offs_n[None, :]
    tl.store(p_ptrs, acc * weight[:, None], mask=m_ok[:, None] & n_ok[None, :])


@dataclass(frozen=True)
class _Tiles:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


def _launch_config(element_size: int, num_slots: int, num_experts: int) -> _Tiles:
    """Tile sizes for a Hopper-class GPU (not yet tuned or compiled on one).

    BLOCK_M follows the mean rows an expert gets, as a power of 2 in 16 (tl.dot's
    smallest) .. 64: decode's few rows an expert waste little of a 16-row block.
    16-bit operands: 64 x 64 weight tiles on the tensor cores, 3 stages; float32
    (IEEE products on the FMA units) halves them. Stage 1 keeps two accumulators.
    """
    mean_rows = triton.next_power_of_2(triton.cdiv(num_slots, num_experts))
    if element_size == 2:
        return _Tiles(min(64, max(16, mean_rows)), 64, 64, num_warps=4, num_stages=3)
    return _Tiles(min(32, max(16, mean_rows)), 32, 32, num_warps=4, num_stages=2)


@dataclass(frozen=True)
class _ExpertBlocks:
    """The row blocks of stages 1 and 2 (module docstring): block b covers sorted
    positions block_start[b] .. min(+ BLOCK_M, offsets[expert + 1]) of expert
    block_expert[b]; block_expert[b] == E past the last block."""

    expert: torch.Tensor  # (max_blocks,) int64
    start: torch.Tensor  # (max_blocks,) int64


def _max_blocks(num_slots: int, num_experts: int, block_m: int) -> int:
    """The most blocks any routing of num_slots slots needs: each expert that has
    slots (at most min(E, slots) of them) wastes at most BLOCK_M - 1 rows of its
    last block, and no block is empty."""
    padded = num_slots + min(num_experts, num_slots) * (block_m - 1)
    return min(num_slots, padded // block_m)


def _expert_blocks(order: ExpertOrder, block_m: int) -> _ExpertBlocks:
    """Cuts each expert's run of sorted positions into blocks, on the device."""
    num_experts, device = order.num_experts, order.slots.device
    per_expert = (order.counts + block_m - 1) // block_m  # (E,) 0 for an unchosen expert
    ends = per_expert.cumsum(0)  # (E,) one past each expert's last block
    blocks = torch.arange(_max_blocks(order.slots.shape[0], num_experts, block_m), device=device)
    expert = torch.searchsorted(ends, blocks, right=True)  # skips experts of no block
    e = expert.clamp(max=num_experts - 1)  # past the last block: unread
    start = order.offsets[e] + (blocks - (ends[e] - per_expert[e])) * block_m
    return _ExpertBlocks(expert, start)


def _check_last_dims(**tensors: torch.Tensor) -> None:
    """The kernels read each row with stride 1 (vector loads)."""
    for name, t in tensors.items():
        if t.numel() and t.stride(-1) != 1:
            raise ExpertArgumentError(
                name, f"expected {name} with a contiguous last dim, got strides {t.stride()}"
            )


def grouped_experts_triton(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str,
) -> torch.Tensor:
    """Same contract as :func:`grouped_experts_reference`, as two Triton launches and a
    sum (tensors on a GPU, or on CPU under TRITON_INTERPRET=1). No host sync.

    x may be row-strided (copied if its last dim is not contiguous); the weights'
    last dims must be contiguous. Ids are the caller's to keep in [0, E): a slot
    whose id is outside is never computed, and its token's output is undefined.

    Raises:
        ExpertArgumentError: shapes, dtypes, devices or the activation do not fit,
            or a weight's last dim is strided.
    """
    check_grouped_experts_args(x, gate_up, down, topk_weights, topk_ids, activation)
    _check_last_dims(gate_up=gate_up, down=down)
    num_tokens, hidden_size = x.shape
    num_experts, inter_size, top_k = gate_up.shape[0], down.shape[2], topk_ids.shape[1]
    if num_tokens == 0 or hidden_size == 0:
        return torch.zeros(x.shape, dtype=x.dtype, device=x.device)
    x = x if x.stride(1) == 1 else x.contiguous()
    num_slots = num_tokens * top_k
    order = sort_by_expert(topk_ids, num_experts)
    tiles = _launch_config(x.element_size(), num_slots, num_experts)
    blocks = _expert_blocks(order, tiles.block_m)
    operand = dot_dtype(x.dtype, x.device)
    hidden = torch.empty(num_slots, inter_size, dtype=x.dtype, device=x.device)  # sorted rows
    partial = torch.empty(num_slots, hidden_size, dtype=torch.float32, device=x.device)
    routing = (order.slots, order.offsets, blocks.expert, blocks.start)
    num_blocks = blocks.expert.shape[0]
    common = dict(
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k,
        DOT_DTYPE=operand,
        DOT_PRECISION=dot_precision(operand),
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
    _gate_up_kernel[(num_blocks, triton.cdiv(inter_size, tiles.block_n))](
        x,
        gate_up,
        hidden,
        *routing,
        num_experts,
        hidden_size,
        inter_size,
        top_k,
        x.stride(0),
        gate_up.stride(0),
        gate_up.stride(1),
        hidden.stride(0),
        ACTIVATION=activation,
        **common,
    )
    _down_kernel[(num_blocks, triton.cdiv(hidden_size, tiles.block_n))](
        hidden,
        down,
        topk_weights.contiguous(),
        partial,
        *routing,
        num_experts,
        hidden_size,
        inter_size,
        hidden.stride(0),
        down.stride(0),
        down.stride(1),
        partial.stride(0),
        **common,
    )
    return partial.view(num_tokens, top_k, hidden_size).sum(1).to(x.dtype)
