"""radixlm's kernels; this package imports only torch.

- ``radixlm.kernels.bitmask``, ``radixlm.kernels.sampling``: the token-bitmask and
  constrained-sampling kernels' plain-torch references and their dispatchers
  (Triton for CUDA tensors, the reference otherwise).
- ``radixlm.kernels.paged_attention``, ``radixlm.kernels.norm`` (residual add +
  RMSNorm, with its dispatcher), ``radixlm.kernels.rope_kv`` (RoPE + the KV pool
  write), ``radixlm.kernels.moe``: the other kernels' references and contracts.
- ``radixlm.kernels.triton``: those kernels in Triton (imports triton; loaded by
  the dispatchers on first CUDA use, or directly by tests under TRITON_INTERPRET=1).
- ``radixlm.kernels.cpu``: the C++ CPU kernels (attention, few-row decoder layers,
  elementwise), built on the user's machine, each beside a torch reference.
"""

from radixlm.kernels.bitmask import (
    allowed_token_ids,
    apply_token_bitmask,
    apply_token_bitmask_reference,
    bitmask_from_allowed,
    bitmask_width,
    unpack_bitmask,
)
from radixlm.kernels.sampling import GREEDY_TEMPERATURE, masked_sample, masked_sample_reference

__all__ = [
    "GREEDY_TEMPERATURE",
    "allowed_token_ids",
    "apply_token_bitmask",
    "apply_token_bitmask_reference",
    "bitmask_from_allowed",
    "bitmask_width",
    "masked_sample",
    "masked_sample_reference",
    "unpack_bitmask",
]
