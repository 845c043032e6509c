"""Triton kernels, each beside a plain-torch reference (imports only torch/triton).

Each kernel comes as ``*_reference`` (plain torch, any device), ``*_triton`` (a
GPU, or CPU under TRITON_INTERPRET=1) and a dispatcher that picks Triton for
CUDA tensors and the reference otherwise.
"""

from .bitmask import (
    allowed_token_ids,
    apply_token_bitmask,
    apply_token_bitmask_reference,
    apply_token_bitmask_triton,
    bitmask_from_allowed,
    bitmask_width,
    unpack_bitmask,
)
from .sampling import (
    GREEDY_TEMPERATURE,
    masked_sample,
    masked_sample_reference,
    masked_sample_triton,
)

__all__ = [
    "GREEDY_TEMPERATURE",
    "allowed_token_ids",
    "apply_token_bitmask",
    "apply_token_bitmask_reference",
    "apply_token_bitmask_triton",
    "bitmask_from_allowed",
    "bitmask_width",
    "masked_sample",
    "masked_sample_reference",
    "masked_sample_triton",
    "unpack_bitmask",
]
