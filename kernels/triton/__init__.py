"""Triton kernels (GPU, or CPU under TRITON_INTERPRET=1); importing this imports triton.

Each has a plain-torch reference with the same contract one level up
(``radixlm.kernels.bitmask``, ``radixlm.kernels.sampling``).
"""

from radixlm.kernels.triton.bitmask import apply_token_bitmask_triton
from radixlm.kernels.triton.sampling import masked_sample_triton

__all__ = ["apply_token_bitmask_triton", "masked_sample_triton"]
