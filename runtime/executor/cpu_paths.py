"""Which forward path each kind of pass takes on the CPU, chosen once at start-up.

Three kinds of pass have a C++ kernel path beside the torch one:

  decode attention   decode rows: ``decode_attention_cpu.cpp`` vs gather + SDPA
  extend attention   prefill rows, fresh or on a cached prefix:
                     ``extend_attention_cpu.cpp`` vs SDPA
  few-row layers     passes of up to 64 tokens: ``small_batch_cpu.cpp`` (a pass of
                     decode rows in one call) vs the eager model; the same option
                     runs a float32 model's elementwise steps as C++ passes

``attention_backend="auto"`` and ``cpu_layer_kernels=True`` (the defaults) take a
kernel path where ``KERNEL_IS_FASTER`` says it beats the torch path for the ISA the
kernels are built for, a rule that ``benchmarks/bench_cpu_paths.py`` measures on
both ISAs (it runs the avx2 and the avx512 build where the CPU has AVX-512; figures
in benchmarks/README.md). A rule rather than a calibration at start-up: the
choice is the same on every run of a machine, so are the outputs, and start-up
costs nothing. A CPU without AVX2 (or a non-x86 one) gets the torch path on
every kind, said in one logged line. ``attention_backend="cpu"`` insists on the
attention kernels; ``"torch"`` and ``cpu_layer_kernels=False`` turn them off.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixlm.runtime.attention import AttentionBackend, kernel_attention

__all__ = ["KERNEL", "KERNEL_IS_FASTER", "TORCH", "CpuPaths", "attention_paths"]

KERNEL, TORCH = "kernel", "torch"

# Whether the kernel path beats the torch path, per ISA build and pass kind,
# as bench_cpu_paths.py measured it on both builds (the avx2 one with torch's
# own kernels held to AVX2 too, as on an AVX2-only CPU): every kernel path was
# faster on every pass kind measured (benchmarks/README.md, "CPU paths and kernels").
KERNEL_IS_FASTER: dict[str, dict[str, bool]] = {
    "avx512": {"decode_attention": True, "extend_attention": True, "few_row_layers": True},
    "avx2": {"decode_attention": True, "extend_attention": True, "few_row_layers": True},
}


@dataclass(frozen=True)
class CpuPaths:
    """The path ("kernel" or "torch") each pass kind takes, and why.

    isa: the kernels' build ("avx512" or "avx2"), None when no kernel is used.
    decode_attention, extend_attention, few_row_layers: KERNEL or TORCH.
    elementwise: KERNEL when a float32 model's eager RMSNorm, RoPE and SwiGLU
        run as C++ passes (with the few-row layer kernels).
    notes: why a kind takes the torch path where the kernel could have served.
    """

    isa: str | None
    decode_attention: str = TORCH
    extend_attention: str = TORCH
    few_row_layers: str = TORCH
    elementwise: str = TORCH
    notes: tuple[str, ...] = ()

    def describe(self) -> str:
        """One line for the start-up log."""
        kinds = (
            f"decode attention {self.decode_attention}, extend attention "
            f"{self.extend_attention}, few-row layers {self.few_row_layers}, "
            f"elementwise {self.elementwise}"
        )
        build = f"{self.isa} kernels" if self.isa else "no kernels"
        notes = f" ({'; '.join(self.notes)})" if self.notes else ""
        return f"CPU paths ({build}): {kinds}{notes}"


def attention_paths(backend: AttentionBackend[Any]) -> tuple[str, str]:
    """The (decode attention, extend attention) paths ``backend`` takes: KERNEL for
    the rows it attends through radixlm's C++ kernels, else TORCH."""
    rows = kernel_attention(backend)
    return (KERNEL if rows.decode else TORCH, KERNEL if rows.extend else TORCH)
