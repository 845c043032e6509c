"""Residual add fused with RMSNorm: the plain-torch reference and the dispatcher.

One decoder block hands its output to the next block's norm, which first adds it
into the residual stream::

    residual <- residual + x            (in place, rounded once to the stream's dtype)
    out       = residual / rms(residual) * weight
                (float32 inside, rounded once to the stream's dtype)

The Triton kernel (``radixlm.kernels.triton.norm``, imported on first CUDA use) does
both in one pass over the row: one read of x and of the residual, one write of each
result, where torch takes an add and a norm of several launches. This module imports
only torch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["AddRmsNorm", "add_rms_norm", "add_rms_norm_reference", "check_add_rms_norm_args"]

AddRmsNorm = Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor, float], torch.Tensor]
"""(residual, x, weight, eps) -> out: the contract of every implementation below."""


def check_add_rms_norm_args(
    residual: torch.Tensor, x: torch.Tensor | None, weight: torch.Tensor
) -> None:
    """Raises ValueError unless residual is (T, n) with contiguous rows, x (if any)
    the same, and weight (n,) on the same device."""
    if residual.dim() != 2 or residual.stride(-1) != 1:
        raise ValueError(
            f"residual must be (T, n) with a contiguous last dim, got shape "
            f"{tuple(residual.shape)} strides {residual.stride()}"
        )
    if x is not None and (x.shape != residual.shape or x.dtype != residual.dtype):
        raise ValueError(
            f"x must match the residual {tuple(residual.shape)} {residual.dtype}, got "
            f"{tuple(x.shape)} {x.dtype}"
        )
    if x is not None and x.stride(-1) != 1:
        raise ValueError(f"x must have a contiguous last dim, got strides {x.stride()}")
    if weight.shape != (residual.shape[1],) or weight.device != residual.device:
        raise ValueError(
            f"weight must be ({residual.shape[1]},) on {residual.device}, got "
            f"{tuple(weight.shape)} on {weight.device}"
        )


def add_rms_norm_reference(
    residual: torch.Tensor, x: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """residual (T, n) += x unless None, in place; returns rmsnorm(residual) * weight
    (n,) as a new (T, n) tensor of the residual's dtype, computed in float32."""
    check_add_rms_norm_args(residual, x, weight)
    if x is not None:
        residual.add_(x)
    n = residual.shape[1]
    out = torch.nn.functional.rms_norm(residual.float(), (n,), weight.float(), eps)
    return out.to(residual.dtype)


def add_rms_norm(
    residual: torch.Tensor, x: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """:func:`add_rms_norm_reference`'s contract: Triton on CUDA, the reference elsewhere."""
    if residual.is_cuda:
        from radixlm.kernels.triton.norm import add_rms_norm_triton

        return add_rms_norm_triton(residual, x, weight, eps)
    return add_rms_norm_reference(residual, x, weight, eps)
