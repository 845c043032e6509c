"""Mixture-of-experts MLP, computed grouped by expert: each expert once on all its tokens.

Shapes (T tokens, H hidden, E experts of intermediate width I, k choices a token)::

    x:            (T, H)        float32, bfloat16 or float16
    gate_up:      (E, 2I, H)    x's dtype; rows 0 .. I-1 the gate, I .. 2I-1 the up projection
    down:         (E, H, I)     x's dtype
    topk_weights: (T, k)        float32, token t's weight for its j-th expert
    topk_ids:     (T, k)        int64 (or int32) in [0, E), token t's j-th expert

Token t's output, act = silu (SwiGLU) or gelu with the tanh approximation (GeGLU)::

    out[t] = sum_j topk_weights[t, j] * down_e (act(gate_e x_t) * up_e x_t),  e = topk_ids[t, j]

Grouping: slot s = t * k + j is token t's j-th choice. ``sort_by_expert`` orders
the T k slots by expert (``ExpertOrder``); an expert's slots then sit side by side
and it runs once, as a matmul over all of their tokens. An expert no slot chose is
never read. The k contributions of a token are summed in float32 in the order
j = 0 .. k-1, after all experts ran.

This module is the plain-torch reference (float32 arithmetic, one expert at a
time; it imports only torch) and the argument checks; the kernel is
``radixlm.kernels.triton.moe``, with the same signature.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

__all__ = [
    "ACTIVATIONS",
    "ExpertArgumentError",
    "ExpertOrder",
    "check_grouped_experts_args",
    "grouped_experts_reference",
    "sort_by_expert",
]

# The gate's activation by name (``ArchConfig.hidden_act``'s names).
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "gelu_tanh": partial(F.gelu, approximate="tanh"),
}
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class ExpertArgumentError(ValueError):
    """An argument of the grouped-experts kernels that does not fit; ``argument`` names it."""

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(message)
        self.argument = argument


@dataclass(frozen=True)
class ExpertOrder:
    """The T k slots (s = t * k + j: token t's j-th choice) grouped by expert.

    ``slots[offsets[e] : offsets[e + 1]]`` are expert e's slots, ascending; an expert
    no token chose has an empty range. For T = 3, k = 2::

        topk_ids = [[2, 0],     slots 0, 1
                    [0, 1],           2, 3
                    [2, 0]]           4, 5

        slots   = [1, 2, 5 | 3 | 0, 4]      experts 0 | 1 | 2
        offsets = [0,        3,  4,    6]
        counts  = [3,        1,  2]

    Every tensor lives on topk_ids' device; building one reads no value on the host.
    """

    slots: torch.Tensor  # (T k,) int64, grouped by expert
    offsets: torch.Tensor  # (E + 1,) int64, offsets[0] = 0, offsets[E] = T k
    counts: torch.Tensor  # (E,) int64, offsets[e + 1] - offsets[e]
    top_k: int

    @property
    def num_experts(self) -> int:
        return self.counts.shape[0]

    def tokens(self) -> torch.Tensor:
        """(T k,) the token of each slot, in ``slots``' order."""
        return self.slots // self.top_k


def sort_by_expert(topk_ids: torch.Tensor, num_experts: int) -> ExpertOrder:
    """Groups the slots of ``topk_ids`` (T, k) by expert, each expert's in slot order.

    Ids must lie in [0, num_experts) (not checked: that would read them on the host);
    one outside falls into no expert's range.
    """
    ids = topk_ids.reshape(-1)
    expert_of_slot, slots = torch.sort(ids, stable=True)
    bounds = torch.arange(num_experts + 1, dtype=ids.dtype, device=ids.device)
    offsets = torch.searchsorted(expert_of_slot, bounds)  # slots of lower experts
    return ExpertOrder(slots, offsets, offsets.diff(), topk_ids.shape[1])


def grouped_experts_reference(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str,
) -> torch.Tensor:
    """The experts' weighted sum for each token (module doc), one expert at a time.

    Args:
        x: (T, H) tokens.
        gate_up: (E, 2I, H) each expert's gate (first I rows) and up projections.
        down: (E, H, I) each expert's down projection.
        topk_weights: (T, k) float32 routing weights.
        topk_ids: (T, k) integer expert ids in [0, E).
        activation: "silu" or "gelu_tanh".

    Returns:
        (T, H) in x's dtype, computed in float32 and rounded once.

    Raises:
        ExpertArgumentError: shapes, dtypes, devices or the activation do not fit,
            or an id is outside [0, E) (read here: the reference syncs anyway).
    """
    check_grouped_experts_args(x, gate_up, down, topk_weights, topk_ids, activation)
    num_experts, top_k = gate_up.shape[0], topk_ids.shape[1]
    if topk_ids.numel() and not 0 <= int(topk_ids.min()) <= int(topk_ids.max()) < num_experts:
        raise ExpertArgumentError("topk_ids", f"expected expert ids in [0, {num_experts})")
    order = sort_by_expert(topk_ids, num_experts)
    act, inter = ACTIVATIONS[activation], down.shape[2]
    weights = topk_weights.reshape(-1)
    out = torch.zeros(topk_ids.numel(), x.shape[1], dtype=torch.float32, device=x.device)
    offsets = order.offsets.tolist()
    for e in range(num_experts):
        if offsets[e] == offsets[e + 1]:
            continue  # no token chose e: its weights are never read
        slots = order.slots[offsets[e] : offsets[e + 1]]
        gate, up = (x[slots // top_k].float() @ gate_up[e].float().t()).split(inter, dim=1)
        hidden = act(gate) * up  # (n, I)
        out[slots] = (hidden @ down[e].float().t()) * weights[slots, None]  # (n, H)
    return out.view(x.shape[0], top_k, x.shape[1]).sum(1).to(x.dtype)


# ---- argument checks --------------------------------------------------------------------


def check_grouped_experts_args(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str,
) -> None:
    """Shapes, dtypes, devices and the activation (never values: reading them would
    sync a GPU).

    Raises:
        ExpertArgumentError: naming the first argument that does not fit.
    """
    if x.dim() != 2 or x.dtype not in SUPPORTED_DTYPES:
        raise ExpertArgumentError(
            "x",
            f"expected x of shape (T, H) in {_names(SUPPORTED_DTYPES)}, got "
            f"{x.dtype} {tuple(x.shape)}",
        )
    hidden = x.shape[1]
    if gate_up.dim() != 3 or 0 in gate_up.shape[:2] or gate_up.shape[1] % 2:
        raise ExpertArgumentError(
            "gate_up",
            f"expected gate_up of shape (E >= 1, 2I >= 2, {hidden}), got {tuple(gate_up.shape)}",
        )
    num_experts, inter = gate_up.shape[0], gate_up.shape[1] // 2
    _check_tensor("gate_up", gate_up, (num_experts, 2 * inter, hidden), x.dtype, x.device)
    _check_tensor("down", down, (num_experts, hidden, inter), x.dtype, x.device)
    if topk_ids.dim() != 2 or not 1 <= topk_ids.shape[1] <= num_experts:
        raise ExpertArgumentError(
            "topk_ids",
            f"expected topk_ids of shape (T, k), 1 <= k <= {num_experts}, got "
            f"{tuple(topk_ids.shape)}",
        )
    choices = (x.shape[0], topk_ids.shape[1])
    if topk_ids.dtype not in (torch.int64, torch.int32):
        raise ExpertArgumentError(
            "topk_ids", f"expected int64 or int32 topk_ids, got {topk_ids.dtype}"
        )
    _check_tensor("topk_ids", topk_ids, choices, topk_ids.dtype, x.device)
    _check_tensor("topk_weights", topk_weights, choices, torch.float32, x.device)
    if activation not in ACTIVATIONS:
        raise ExpertArgumentError(
            "activation", f"expected activation in {sorted(ACTIVATIONS)}, got {activation!r}"
        )


def _check_tensor(
    name: str, t: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> None:
    if tuple(t.shape) != tuple(shape) or t.dtype != dtype or t.device != device:
        raise ExpertArgumentError(
            name,
            f"expected {name} of shape {tuple(shape)}, {dtype} on {device}; got "
            f"{tuple(t.shape)}, {t.dtype} on {t.device}",
        )


def _names(dtypes: tuple[torch.dtype, ...]) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)
