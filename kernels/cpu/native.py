"""Builds radixlm's C++ CPU kernels once per machine and loads them with ctypes.

A kernel is one C++ file beside this module, exporting ``extern "C"`` functions
that take raw pointers and sizes: no torch or Python headers, so a build is a
plain compile of one file, far shorter than a torch extension's. A file may
``#include "other.cpp"`` from this directory to call another kernel's code.

Each build is for one ``KernelTarget``: ``native`` (``-march=native``: this
CPU's instruction set and tuning, what the engine uses), or a named x86-64
level, ``avx2`` (``-march=x86-64-v3``) or ``avx512`` (``-march=x86-64-v4``),
which the tests and benchmarks use to run both ISAs' builds on any machine
that can. ``vector_cpu.h`` sizes the kernels' vectors and register tiles for
the ISA the build targets. A CPU without AVX2 (or a non-x86 one) gets no build:
``load_library`` raises ``KernelBuildError`` saying so, and the engine runs
the torch path. The library is cached under ``build_dir`` by a hash of the
source and the files it includes, the compiler, the flags (the target among
them) and the CPU, so a changed file, compiler, target or machine gets a fresh
build and an unchanged one is loaded as is; the file name shows the ISA.

OpenMP: the library asks for ``libgomp.so.1``, which torch (imported here
first) has loaded already, so the kernels run on torch's own OpenMP thread
pool and obey ``torch.set_num_threads``. A second OpenMP runtime in the
process would make the two pools fight over the cores.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch  # noqa: F401  (loads torch's libgomp before any kernel library)

__all__ = [
    "AVX2",
    "AVX512",
    "CXX_FLAGS",
    "KERNEL_TARGETS",
    "NATIVE",
    "KernelBuildError",
    "KernelTarget",
    "cpu_flags",
    "cpu_isa",
    "find_compiler",
    "load_library",
    "runnable_targets",
]

CXX_FLAGS = ("-O3", "-fopenmp", "-std=c++17", "-shared", "-fPIC")  # and the target's -march

# What each ISA needs of /proc/cpuinfo's flags: x86-64-v3's AVX2 level and
# x86-64-v4's AVX-512 subsets (the ones vector_cpu.h asks the compiler for).
_ISA_FLAGS = {
    "avx2": frozenset({"avx", "avx2", "fma", "bmi1", "bmi2", "f16c", "movbe"}),
    "avx512": frozenset({"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}),
}
_LANES = {"avx2": 8, "avx512": 16}  # floats per vector of each ISA's build


class KernelBuildError(RuntimeError):
    """A C++ kernel could not be built or loaded (no compiler, compile error,
    a CPU without AVX2, ...)."""


@dataclass(frozen=True)
class KernelTarget:
    """What a kernel library is built for.

    name: "native", "avx2" or "avx512".
    march: the compiler's ``-march`` value.
    isa: the ISA the build requires, or None for native (this CPU's own).
    """

    name: str
    march: str
    isa: str | None

    def resolved_isa(self) -> str | None:
        """The ISA this target's build uses on this CPU (None: the CPU has
        neither AVX2 nor AVX-512)."""
        return self.isa if self.isa is not None else cpu_isa()


NATIVE = KernelTarget("native", "native", None)
AVX2 = KernelTarget("avx2", "x86-64-v3", "avx2")
AVX512 = KernelTarget("avx512", "x86-64-v4", "avx512")
KERNEL_TARGETS = {t.name: t for t in (NATIVE, AVX2, AVX512)}


def cpu_isa() -> str | None:
    """This CPU's widest vector ISA the kernels use: "avx512", "avx2" or None."""
    flags = _cpu_flags()
    for isa in ("avx512", "avx2"):
        if _ISA_FLAGS[isa] <= flags and _ISA_FLAGS["avx2"] <= flags:
            return isa
    return None


def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags as /proc/cpuinfo spells them ("avx512_bf16",
    "amx_tile", ...); empty where there is none."""
    return _cpu_flags()


def runnable_targets() -> list[KernelTarget]:
    """The named ISA targets (avx2, avx512) whose builds this CPU can run."""
    best = cpu_isa()
    return [t for t in (AVX2, AVX512) if best == "avx512" or (best == t.isa)]


def find_compiler() -> str | None:
    """``$CXX`` if set, else the first of g++, c++, clang++ on the PATH."""
    configured = os.environ.get("CXX")
    if configured:
        return configured
    for name in ("g++", "c++", "clang++"):
        found = shutil.which(name)
        if found:
            return found
    return None


def load_library(source: Path, build_dir: Path, target: KernelTarget = NATIVE) -> ctypes.CDLL:
    """The library built from ``source`` for ``target``, built into ``build_dir``
    if not there yet.

    Loading the same build again returns the same library (dlopen counts references).

    Raises KernelBuildError when this CPU cannot run the target's build (no AVX2,
    or avx512 asked of an AVX2 CPU), with the compiler's own message when the
    build fails, and when the library is not the ISA's build.
    """
    isa = _runnable_isa(target)
    compiler = find_compiler()
    if compiler is None:
        raise KernelBuildError("no C++ compiler found: install g++ (or set CXX)")
    flags = (*CXX_FLAGS, f"-march={target.march}")
    code = b"\0".join(path.read_bytes() for path in _local_sources(source))
    version = _compiler_version(compiler)
    key = hashlib.sha256(
        b"\0".join((code, version.encode(), " ".join(flags).encode(), _cpu_signature()))
    ).hexdigest()[:16]
    path = build_dir / f"{source.stem}-{isa}-{key}.so"
    if not path.exists():
        _compile(compiler, flags, source, path)
    try:
        library = ctypes.CDLL(str(path))
    except OSError as e:
        raise KernelBuildError(f"loading {path} failed: {e}") from e
    lanes = getattr(library, "radixlm_vector_lanes", None)  # every file of vector_cpu.h's
    if lanes is not None and lanes() != _LANES[isa]:
        raise KernelBuildError(f"{path.name} has {lanes()}-float vectors, not {isa}'s")
    return library


def _runnable_isa(target: KernelTarget) -> str:
    """The ISA of ``target``'s build, if this CPU runs it; KernelBuildError if not."""
    best = cpu_isa()
    if best is None:
        raise KernelBuildError(
            f"this CPU ({platform.machine()}) has neither AVX2 nor AVX-512: radixlm's C++ "
            "kernels need x86-64 with AVX2 or newer"
        )
    if target.isa == "avx512" and best != "avx512":
        raise KernelBuildError("the avx512 kernel build needs AVX-512; this CPU has AVX2 only")
    return target.isa or best


def _compile(compiler: str, flags: tuple[str, ...], source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: a concurrent process never loads half a file.
    fd, partial = tempfile.mkstemp(suffix=".so.partial", dir=target.parent)
    os.close(fd)
    try:
        result = subprocess.run(
            [compiler, *flags, str(source), "-o", partial],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            detail = (result.stderr or result.stdout).strip()[-2000:]
            raise KernelBuildError(f"building {source.name} with {compiler} failed:\n{detail}")
        os.replace(partial, target)
    except OSError as e:
        raise KernelBuildError(f"building {source.name} with {compiler} failed: {e}") from e
    finally:
        if os.path.exists(partial):
            os.unlink(partial)


def _local_sources(source: Path) -> list[Path]:
    """``source`` and the files it includes with ``#include "name"`` from its own
    directory, recursively: everything whose change must give a new build."""
    found, pending = [], [source]
    while pending:
        path = pending.pop()
        if path in found:
            continue
        found.append(path)
        for match in _LOCAL_INCLUDE.finditer(path.read_text()):
            pending.append(path.parent / match.group(1))
    return found


_LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


@functools.cache
def _compiler_version(compiler: str) -> str:
    try:
        result = subprocess.run(
            [compiler, "--version"], capture_output=True, text=True, check=False, timeout=30
        )
    except (OSError, subprocess.SubprocessError) as e:
        raise KernelBuildError(f"running {compiler} --version failed: {e}") from e
    if result.returncode != 0:
        raise KernelBuildError(f"{compiler} --version exited with {result.returncode}")
    return result.stdout


@functools.cache
def _cpu_flags() -> frozenset[str]:
    """/proc/cpuinfo's feature flags (empty where there is none, or on ARM's
    "Features" spelling: no ARM build is made)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in info.splitlines():
        if line.split(":")[0].strip() == "flags":
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


@functools.cache
def _cpu_signature() -> bytes:
    """What ``-march=native`` depends on: the CPU's model and feature flags."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor().encode()
    keep = ("model name", "flags", "Features", "CPU part")  # x86 and ARM spellings
    lines = {line for line in info.splitlines() if line.split(":")[0].strip() in keep}
    return "\n".join(sorted(lines)).encode()
