"""Triton kernels (GPU, or CPU under TRITON_INTERPRET=1); importing this imports triton.

Each has a plain-torch reference with the same contract one level up
(``radixlm.kernels.bitmask``, ``radixlm.kernels.sampling``,
``radixlm.kernels.paged_attention``, ``radixlm.kernels.moe``, ``radixlm.kernels.norm``,
``radixlm.kernels.rope_kv``), but the KIVI attention kernels, whose reference reading is
the runtime's (``radixlm.runtime.mem_cache.kivi.gather``).
"""

from radixlm.kernels.triton.bitmask import apply_token_bitmask_triton
from radixlm.kernels.triton.decode_attention import decode_attention_triton
from radixlm.kernels.triton.extend_attention import extend_attention_triton
from radixlm.kernels.triton.kivi_decode_attention import decode_attention_kivi_triton
from radixlm.kernels.triton.kivi_extend_attention import extend_attention_kivi_triton
from radixlm.kernels.triton.moe import grouped_experts_triton
from radixlm.kernels.triton.norm import add_rms_norm_triton
from radixlm.kernels.triton.rope_kv import rotate_and_store_triton
from radixlm.kernels.triton.sampling import masked_sample_triton

__all__ = [
    "add_rms_norm_triton",
    "apply_token_bitmask_triton",
    "decode_attention_kivi_triton",
    "decode_attention_triton",
    "extend_attention_kivi_triton",
    "extend_attention_triton",
    "grouped_experts_triton",
    "masked_sample_triton",
    "rotate_and_store_triton",
]
