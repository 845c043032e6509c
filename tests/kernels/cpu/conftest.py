"""The C++ kernels' tests run against every ISA build this CPU can run: the avx2
build (``-march=x86-64-v3``) on any x86-64 CPU with AVX2, and the avx512 build
(``-march=x86-64-v4``) where the CPU has AVX-512, so both builds' tiles and vector
widths are held to the references on a machine of either kind; kernels with paths
for the CPU's own extensions (``kernel_target_and_native``) the native build too."""

from __future__ import annotations

import pytest

from radixlm.kernels.cpu.native import NATIVE, KernelTarget, runnable_targets


@pytest.fixture(scope="module", params=runnable_targets(), ids=lambda t: t.name)
def kernel_target(request: pytest.FixtureRequest) -> KernelTarget:
    return request.param


@pytest.fixture(scope="module", params=[*runnable_targets(), NATIVE], ids=lambda t: t.name)
def kernel_target_and_native(request: pytest.FixtureRequest) -> KernelTarget:
    """Every ISA build, and the native one (``-march=native``, what the engine runs):
    for kernels with paths only this CPU's own extensions compile (VNNI dot products)."""
    return request.param
