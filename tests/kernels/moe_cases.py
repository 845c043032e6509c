"""Random grouped-experts cases and the error bounds of their computation, shared by
the reference's tests (tests/kernels/test_moe_reference.py) and the Triton kernel's
(tests/kernels/test_triton_moe.py).

Each slot's contribution w * down_e(act(gate_e x) * up_e x) is bounded as a chain
of tests/numerics.py operations (float32 matmuls of stored, possibly 16-bit,
operands); a token's k contributions are then summed in float32, and rounded to x's
dtype. The Triton kernel also rounds the activation to x's dtype before the down
matmul (``rounded_to``); the reference keeps it in float32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from tests import numerics as num

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
# gelu_tanh(g) = g sigmoid(z), z = 2c (g + A g^3), c = sqrt(2 / pi).
GELU_C = math.sqrt(2 / math.pi)
GELU_A = 0.044715
# Roundings in gelu_tanh's argument z: g^2 or g^3, the products by the constants,
# the sum, and the two constants themselves (each side: torch and the kernel).
GELU_ARG_ROUNDINGS = 8


@dataclass(frozen=True)
class MoECase:
    x: torch.Tensor  # (T, H)
    gate_up: torch.Tensor  # (E, 2I, H)
    down: torch.Tensor  # (E, H, I)
    topk_weights: torch.Tensor  # (T, k) float32
    topk_ids: torch.Tensor  # (T, k) int64
    activation: str

    def args(self, device: str = "cpu") -> tuple:
        tensors = (self.x, self.gate_up, self.down, self.topk_weights, self.topk_ids)
        return (*(t.to(device) for t in tensors), self.activation)

    def with_routing(self, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> MoECase:
        return replace(self, topk_weights=topk_weights, topk_ids=topk_ids)


def moe_case(
    num_tokens: int,
    hidden: int,
    inter: int,
    num_experts: int,
    top_k: int,
    dtype: torch.dtype = F32,
    activation: str = "silu",
    seed: int = 0,
    logits: torch.Tensor | None = None,
) -> MoECase:
    """Gates of order 2 (both sides of silu's and gelu's bend), routing by the top k
    of softmax(logits) (random (T, E) logits unless given; -inf keeps an expert out)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, hidden, generator=gen).to(dtype)
    gate_up = (torch.randn(num_experts, 2 * inter, hidden, generator=gen) * 2 / hidden**0.5).to(
        dtype
    )
    down = (torch.randn(num_experts, hidden, inter, generator=gen) / inter**0.5).to(dtype)
    if logits is None:
        logits = torch.randn(num_tokens, num_experts, generator=gen)
    weights, ids = logits.softmax(-1).topk(top_k, dim=-1)
    return MoECase(x, gate_up, down, weights, ids, activation)


# ---- bounds -------------------------------------------------------------------------------


def gelu_tanh_mul(gate: num.Bounded, up: num.Bounded) -> num.Bounded:
    """y = gelu_tanh(g) * p = g s(z) p, s = sigmoid, z = 2c (g + A g^3): torch's
    0.5 g (1 + tanh(z / 2)) and the kernel's g / (1 + exp(-z)) alike.

    Rounding, as an absolute error of s: z's roundings (GELU_ARG_ROUNDINGS u of
    2c (|g| + A |g|^3)) move s by s (1 - s) |dz|; the exp or tanh (EXP_ULPS u), the sum
    and the quotient add (EXP_ULPS + 2) u: absolute, not relative, as 1 + tanh cancels
    when tanh -> -1. Times |g p|, with 3u |y| for the products by g, 0.5 and p. Errors
    in g propagate through the slope s + g s (1 - s) z'(g), z' = 2c (1 + 3A g^2); errors
    in p through gelu_tanh(g)."""
    g, p = gate.value, up.value
    z = 2 * GELU_C * (g + GELU_A * g**3)
    s = torch.sigmoid(z)
    gelu = g * s
    v = gelu * p
    dz = GELU_ARG_ROUNDINGS * num.U * 2 * GELU_C * (g.abs() + GELU_A * g.abs() ** 3)
    ds = (num.EXP_ULPS + 2) * num.U + s * (1 - s) * dz
    rounding = (g * p).abs() * ds + 3 * num.U * v.abs()
    slope = (s + g * s * (1 - s) * 2 * GELU_C * (1 + 3 * GELU_A * g**2)).abs()
    return num.Bounded(v, rounding + slope * gate.error * p.abs() + gelu.abs() * up.error)


ACT_MUL = {"silu": num.silu_mul, "gelu_tanh": gelu_tanh_mul}


def _rounded(x: num.Bounded, dtype: torch.dtype | None) -> num.Bounded:
    """x stored in dtype: one more rounding of the float32 result."""
    if dtype is None or dtype == F32:
        return x
    return num.Bounded(x.value, x.error + num.unit_roundoff(dtype) * (x.value.abs() + x.error))


def output(case: MoECase, hidden_rounded_to: torch.dtype | None = None) -> num.Bounded:
    """(T, H) float32 result before its rounding to x's dtype, exact value and bound.

    hidden_rounded_to: the dtype the activation is stored in before the down matmul
    (the kernel's x.dtype), None for float32 (the reference)."""
    num_tokens, top_k = case.topk_ids.shape
    inter = case.down.shape[2]
    weights = case.topk_weights.double()
    terms = torch.zeros(num_tokens, top_k, case.x.shape[1], dtype=torch.float64)
    errors = torch.zeros_like(terms)
    for e in case.topk_ids.unique().tolist():
        tokens, choices = (case.topk_ids == e).nonzero(as_tuple=True)
        x = num.exact(case.x[tokens])
        gate = num.linear(x, case.gate_up[e, :inter])
        up = num.linear(x, case.gate_up[e, inter:])
        hidden = _rounded(ACT_MUL[case.activation](gate, up), hidden_rounded_to)
        out = num.linear(hidden, case.down[e])  # (n, H)
        w = weights[tokens, choices, None]
        terms[tokens, choices] = w * out.value
        errors[tokens, choices] = w.abs() * out.error + num.U * (w * out.value).abs()
    summing = num.gamma(top_k - 1) * terms.abs().sum(1)  # k terms: k - 1 additions
    return num.Bounded(terms.sum(1), errors.sum(1) + summing)


def between_kernel_and_reference(case: MoECase) -> torch.Tensor:
    """(T, H) bound on |kernel - reference|, both rounded to x's dtype at the end:
    each side within its bound of the exact value, and the two final roundings."""
    kernel, reference = output(case, case.x.dtype), output(case)
    bound = kernel.error + reference.error
    if case.x.dtype != F32:
        u = num.unit_roundoff(case.x.dtype)
        bound = bound + u * (2 * kernel.value.abs() + bound)
    return bound


def naive_per_token(case: MoECase) -> torch.Tensor:
    """The layer's definition, token by token and choice by choice, in float64."""
    act = {
        "silu": torch.nn.functional.silu,
        "gelu_tanh": lambda g: torch.nn.functional.gelu(g, approximate="tanh"),
    }[case.activation]
    inter = case.down.shape[2]
    out = torch.zeros(case.x.shape, dtype=torch.float64)
    for t in range(case.x.shape[0]):
        x = case.x[t].double()
        for j, e in enumerate(case.topk_ids[t].tolist()):
            gate_up = case.gate_up[e].double() @ x  # (2I,)
            hidden = act(gate_up[:inter]) * gate_up[inter:]
            out[t] += case.topk_weights[t, j].double() * (case.down[e].double() @ hidden)
    return out
