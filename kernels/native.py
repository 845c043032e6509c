"""Builds radixlm's C++ CPU kernels once per machine and loads them with ctypes.

A kernel is one C++ file beside this module, exporting ``extern "C"`` functions
that take raw pointers and sizes: no torch or Python headers, so a build takes
about a second instead of the ~40 s of a torch extension. A file may
``#include "other.cpp"`` from this directory to call another kernel's code. It
is compiled with ``-march=native`` (so the build is specific to this CPU and
compiler) and OpenMP; the library is cached under ``build_dir`` by a hash of the
source and the files it includes, the compiler, the flags and the CPU, so a
changed file, compiler or machine gets a fresh build and an unchanged one is
loaded as is.

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
from pathlib import Path

import torch  # noqa: F401  (loads torch's libgomp before any kernel library)

__all__ = ["CXX_FLAGS", "KernelBuildError", "find_compiler", "load_library"]

CXX_FLAGS = ("-O3", "-march=native", "-fopenmp", "-std=c++17", "-shared", "-fPIC")


class KernelBuildError(RuntimeError):
    """A C++ kernel could not be built or loaded (no compiler, compile error, ...)."""


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


def load_library(source: Path, build_dir: Path) -> ctypes.CDLL:
    """The library built from ``source``, built into ``build_dir`` if not there yet.

    Loading the same build again returns the same library (dlopen counts references).

    Raises KernelBuildError with the compiler's own message when the build fails.
    """
    compiler = find_compiler()
    if compiler is None:
        raise KernelBuildError("no C++ compiler found: install g++ (or set CXX)")
    code = b"\0".join(path.read_bytes() for path in _local_sources(source))
    version = _compiler_version(compiler)
    key = hashlib.sha256(
        b"\0".join((code, version.encode(), " ".join(CXX_FLAGS).encode(), _cpu_signature()))
    ).hexdigest()[:16]
    target = build_dir / f"{source.stem}-{key}.so"
    if not target.exists():
        _compile(compiler, source, target)
    try:
        return ctypes.CDLL(str(target))
    except OSError as e:
        raise KernelBuildError(f"loading {target} failed: {e}") from e


def _compile(compiler: str, source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: a concurrent process never loads half a file.
    fd, partial = tempfile.mkstemp(suffix=".so.partial", dir=target.parent)
    os.close(fd)
    try:
        result = subprocess.run(
            [compiler, *CXX_FLAGS, str(source), "-o", partial],
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
def _cpu_signature() -> bytes:
    """What ``-march=native`` depends on: the CPU's model and feature flags."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor().encode()
    keep = ("model name", "flags", "Features", "CPU part")  # x86 and ARM spellings
    lines = {line for line in info.splitlines() if line.split(":")[0].strip() in keep}
    return "\n".join(sorted(lines)).encode()
