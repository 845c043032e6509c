"""Linear layers whose matmul is chosen once, after the weights are loaded.

``Linear`` holds the same parameters as ``nn.Linear`` (weight ``(out, in)``,
optional bias) and runs ``F.linear``; ``prepare()`` then adapts the weight to
the kernel that is fastest for its dtype and device (each choice measured:
benchmarks/README.md, "CPU engine choices"):

- **float32 on CPU**: the weight stays ``(out, in)`` contiguous, the layout of
  radixlm's few-row kernel (below). Where oneDNN is available (any x86-64
  torch build), a copy of the weight is also stored in oneDNN's blocked
  layout, and every product the few-row kernel does not take runs oneDNN's
  matmul on it, faster than MKL's from a few dozen rows up to a whole prefill
  chunk; a row's result was the same bit for bit at 2 to 1,024
  rows (one row may differ: oneDNN's one-row path). The copy costs a second
  copy of every float32 weight in memory.
- **bfloat16 on a CPU whose oneDNN has bf16 kernels**: torch's own bf16
  ``F.linear`` runs oneDNN's matmul on the plain weight, which is slower than
  oneDNN's kernel on a weight laid out in its blocked format ahead of time, so

  - fewer than ``PACKED_MAX_ROWS`` rows (decode steps, small batches) use a
    copy of the weight stored once in oneDNN's blocked layout;
  - more rows (prefill chunks) are computed in ``gemm_dtype``: on a CPU that
    computes bf16 natively (AVX512-BF16 or AMX tiles: ``native_bf16``) that is
    bfloat16 on the packed copy again (oneDNN's bf16 GEMM is several times
    float32's there: benchmarks/README.md, "CPU paths and kernels"); elsewhere
    float32 on the bf16 values: a bf16 x bf16 product is exact in float32 and
    oneDNN's bf16 kernels accumulate in float32 too, so the result is the same
    bf16 matmul up to summation order, and without
    native bf16 oneDNN emulates it, slower than float32.

The packed bf16 copy costs a second copy of every bf16 weight in memory (the
float32 footprint). The bf16 weight itself stays ``(out, in)`` contiguous too,
for radixlm's few-row kernel (below). Other dtypes and GPUs keep the weight as
loaded.

``use_small_batch`` (float32 or bfloat16 on CPU, after ``prepare``) hands inputs of up to
``radixlm.kernels.cpu.small_batch.LINEAR_MAX_ROWS`` rows to radixlm's few-row kernel,
which reads each weight row as a stream, or, for a bfloat16 weight on a CPU with
AVX512-BF16, the packed copy as oneDNN laid it out (``BlockedMatrix``: no third copy;
benchmarks/README.md, "CPU paths and kernels"). The runtime does this for the LM
head when it runs small passes through those kernels.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.kernels.cpu.small_batch import LINEAR_MAX_ROWS as SMALL_BATCH_MAX_ROWS
from radixlm.kernels.cpu.small_batch import BlockedMatrix, SmallBatchKernels

__all__ = [
    "Linear",
    "PACKED_MAX_ROWS",
    "gemm_dtype",
    "native_bf16",
    "packed_bf16_available",
    "packed_float32_available",
    "packed_linear",
    "prepare_linears",
]

# Without native bf16: rows at which float32 GEMM on the bf16 values overtakes the
# packed bf16 kernel (between 64 and 256 rows over all layer matrices:
# benchmarks/README.md, "CPU engine choices").
PACKED_MAX_ROWS = 128


def packed_float32_available() -> bool:
    """Whether this torch build has oneDNN's CPU matmul (x86-64 builds do)."""
    return torch.backends.mkldnn.is_available()


def packed_bf16_available() -> bool:
    """Whether this torch build has oneDNN with bf16 kernels for this CPU."""
    return torch.backends.mkldnn.is_available() and bool(
        torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )


def gemm_dtype(dtype: torch.dtype) -> torch.dtype:
    """What a CPU GEMM of many rows (a prefill chunk) computes in for weights of ``dtype``:
    bfloat16 weights stay bfloat16 on a CPU with native bf16 (``native_bf16``),
    elsewhere float32 (faster than emulated bf16; exact for bf16 products)."""
    if dtype == torch.bfloat16 and native_bf16():
        return torch.bfloat16
    return torch.float32 if dtype in (torch.bfloat16, torch.float32) else dtype


@functools.cache
def native_bf16() -> bool:
    """Whether this CPU computes bfloat16 products natively: AVX512-BF16 dot products
    or AMX tiles (oneDNN uses either; without them it emulates bf16 in float32)."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


class Linear(nn.Module):
    """y = x W^T + b over the last dim of x; call ``prepare()`` once weights are final."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        dtype: torch.dtype,
        device: torch.device | str,
        *,
        shared_weight: nn.Parameter | None = None,
    ) -> None:
        """shared_weight: use this ``(out, in)`` parameter (tied embeddings) instead
        of allocating one."""
        super().__init__()
        if shared_weight is not None and shared_weight.shape != (out_features, in_features):
            raise ValueError(
                f"shared weight has shape {tuple(shared_weight.shape)}, "
                f"expected {(out_features, in_features)}"
            )
        # Uninitialised: weights come from the checkpoint, and a random init of a
        # large model would take longer than loading it.
        if shared_weight is None:
            shared_weight = nn.Parameter(
                torch.empty(out_features, in_features, dtype=dtype, device=device)
            )
        self.weight = shared_weight
        self.bias = (
            nn.Parameter(torch.empty(out_features, dtype=dtype, device=device)) if bias else None
        )
        self.packed: torch.Tensor | None = None  # oneDNN blocked copy of weight
        self.small_batch: SmallBatchKernels | None = None  # few-row float32 kernel
        self.blocked: BlockedMatrix | None = None  # the packed copy, as the kernel reads it
        self.many_rows_packed = True  # prefill chunks run on the packed copy (set by prepare)

    def prepare(self) -> None:
        """Lays the weight out for the fastest kernel (see the module doc).

        Call again after changing the weight's values; until then a packed copy is
        stale. A weight shared with another module (a tied embedding) changes
        layout for both; its values and shape stay the same.
        """
        weight = self.weight.data
        self.packed = self.small_batch = self.blocked = None
        if weight.device.type != "cpu":
            return
        if weight.dtype == torch.bfloat16 and packed_bf16_available():
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), 1)
        elif weight.dtype == torch.float32 and packed_float32_available():
            # The row-count hint only picks the blocking: 64 and 1,024 measured alike.
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), 64)
        if weight.dtype in (torch.float32, torch.bfloat16):
            self.weight.data = weight.contiguous()  # the few-row kernel's layout
        self.many_rows_packed = gemm_dtype(weight.dtype) == weight.dtype

    def use_small_batch(self, kernels: SmallBatchKernels) -> None:
        """Computes inputs of up to ``LINEAR_MAX_ROWS`` rows with radixlm's few-row kernel
        (float32 or bfloat16 on CPU, after ``prepare``), which reads the weight from
        memory once (a block of its rows at a time, which every chunk of input rows
        goes over while cached; it computes in float32 and rounds the result to the
        weight's dtype). A bfloat16 weight's packed copy is read instead where the
        kernels can (``SmallBatchKernels.blocked_matrix``: AVX512-BF16), faster from
        4 rows (benchmarks/README.md, "CPU paths and kernels"). Raises
        KernelShapeError for other weights."""
        kernels.check_weight(self.weight, self.bias)
        self.small_batch = kernels
        if self.packed is not None and self.weight.dtype == torch.bfloat16:
            self.blocked = kernels.blocked_matrix(self.weight.data, self.packed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., in) -> (..., out), in the weight's dtype."""
        if self.small_batch is not None:
            rows = x.numel() // x.shape[-1]
            if rows <= SMALL_BATCH_MAX_ROWS and not torch.compiler.is_compiling():
                flat = x.reshape(rows, -1).float().contiguous()
                if self.blocked is not None:
                    y = self.small_batch.quant_product(flat, self.blocked, self.bias)
                else:
                    y = self.small_batch.linear(flat, self.weight, self.bias)
                return y.to(self.weight.dtype).view(*x.shape[:-1], -1)
        if self.packed is None:
            return F.linear(x, self.weight, self.bias)
        rows = x.numel() // x.shape[-1]
        if rows < PACKED_MAX_ROWS or self.many_rows_packed:
            if torch.compiler.is_compiling():  # opaque to the compiler, see packed_linear
                return packed_linear(x, self.packed, self.bias, self.weight.shape[0])
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        bias = None if self.bias is None else self.bias.float()
        return F.linear(x.float(), self.weight.float(), bias).to(x.dtype)

    def extra_repr(self) -> str:
        out_features, in_features = self.weight.shape
        packed = ", packed" if self.packed is not None else ""
        return f"in={in_features}, out={out_features}, bias={self.bias is not None}{packed}"


@torch.library.custom_op("radixlm::packed_linear", mutates_args=())
def packed_linear(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int
) -> torch.Tensor:
    """oneDNN's matmul on a pre-blocked weight, as an op ``torch.compile`` calls as is.

    Inductor lowers ``mkldnn._linear_pointwise`` only for weights it froze into the
    graph itself; an op it cannot see into takes the blocked weight as an input.
    Eager code calls the oneDNN op directly (a custom op costs a dispatch more).
    """
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@packed_linear.register_fake
def _(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int
) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], out_features))


def prepare_linears(model: nn.Module) -> int:
    """Calls ``prepare()`` on every ``Linear`` in ``model``; returns how many packed."""
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    for linear in linears:
        linear.prepare()
    return sum(linear.packed is not None for linear in linears)
