"""radixlm's C++ CPU kernels, built on the user's machine for its instruction set
(``native``), each wrapped with ctypes beside a plain-torch reference:

- ``decode_attention``: decode rows attending straight from the KV pool;
- ``extend_attention``: prefill rows (fresh or on a cached prefix), causal;
- ``kivi_attention``: both, over a KIVI pool's packed 4/2-bit codes;
- ``small_batch``: whole decoder layers for passes of a few rows, and the LM head;
- ``elementwise``: fused add + RMS norm and SwiGLU for float32 models.

``native`` builds and caches the libraries (``KernelTarget``: native, avx2, avx512).
"""

from radixlm.kernels.cpu.native import KERNEL_TARGETS, NATIVE, KernelBuildError, KernelTarget

__all__ = ["KERNEL_TARGETS", "NATIVE", "KernelBuildError", "KernelTarget"]
