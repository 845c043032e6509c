"""Building and loading the C++ kernels: cache, rebuilds, errors, one OpenMP runtime."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixlm.kernels.cpu import native
from radixlm.kernels.cpu.native import KernelBuildError, load_library

SOURCE = """
#include <omp.h>
extern "C" int radixlm_test_answer(void) { return %d; }
extern "C" int radixlm_test_threads(void) {
  int n = 0;
#pragma omp parallel
  {
#pragma omp single
    n = omp_get_num_threads();
  }
  return n;
}
"""


def _source(tmp_path: Path, answer: int = 42, name: str = "probe.cpp") -> Path:
    path = tmp_path / name
    path.write_text(SOURCE % answer)
    return path


def test_builds_once_and_reuses_the_build(tmp_path: Path) -> None:
    build = tmp_path / "build"
    lib = load_library(_source(tmp_path), build)
    assert lib.radixlm_test_answer() == 42
    (built,) = build.glob("probe-*.so")
    stamp = built.stat().st_mtime_ns
    again = load_library(_source(tmp_path), build)  # as a new process would: from disk
    assert again.radixlm_test_answer() == 42
    assert [p.name for p in build.iterdir()] == [built.name]  # no partial files left
    assert built.stat().st_mtime_ns == stamp


def test_a_changed_source_gets_a_new_build(tmp_path: Path) -> None:
    build = tmp_path / "build"
    assert load_library(_source(tmp_path, 1), build).radixlm_test_answer() == 1
    assert load_library(_source(tmp_path, 2), build).radixlm_test_answer() == 2
    assert len(list(build.glob("probe-*.so"))) == 2


def test_a_changed_local_include_gets_a_new_build(tmp_path: Path) -> None:
    """A kernel may include another kernel's source; the build key covers it."""
    build = tmp_path / "build"
    (tmp_path / "nested.h").write_text("constexpr int kBase = 1;\n")
    (tmp_path / "part.cpp").write_text('#include "nested.h"\nconstexpr int kPart = kBase + 1;\n')
    main = tmp_path / "main.cpp"
    main.write_text(
        ' #  include "part.cpp"\nextern "C" int radixlm_test_answer(void) { return kPart; }\n'
    )
    assert load_library(main, build).radixlm_test_answer() == 2
    (tmp_path / "nested.h").write_text("constexpr int kBase = 10;\n")  # two includes deep
    assert load_library(main, build).radixlm_test_answer() == 11
    assert len(list(build.glob("main-*.so"))) == 2


def test_compile_errors_are_reported(tmp_path: Path) -> None:
    bad = tmp_path / "bad.cpp"
    bad.write_text('extern "C" int f(void) { return undeclared_name; }\n')
    with pytest.raises(KernelBuildError, match="undeclared_name"):
        load_library(bad, tmp_path / "build")
    assert list((tmp_path / "build").iterdir()) == []


def test_missing_or_broken_compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(KernelBuildError, match="no-such-compiler"):
        load_library(_source(tmp_path), tmp_path / "build")
    monkeypatch.setenv("CXX", "false")  # runs, fails
    with pytest.raises(KernelBuildError, match="false --version exited with 1"):
        load_library(_source(tmp_path), tmp_path / "build")
    monkeypatch.delenv("CXX")
    monkeypatch.setattr(native.shutil, "which", lambda name: None)
    with pytest.raises(KernelBuildError, match="no C\\+\\+ compiler found"):
        load_library(_source(tmp_path), tmp_path / "build")


def test_kernels_share_torchs_openmp_runtime(tmp_path: Path) -> None:
    """The kernel's parallel regions run on torch's libgomp: they obey
    torch.set_num_threads (a second OpenMP runtime would keep its own default of
    one thread per core, and its own thread pool competing for the cores)."""
    import torch

    lib = load_library(_source(tmp_path), tmp_path / "build")
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            assert lib.radixlm_test_threads() == n
    finally:
        torch.set_num_threads(threads)


def test_each_target_gets_its_own_build(tmp_path: Path) -> None:
    """The named ISA targets this CPU runs build apart from native, their ISA in the
    file name; radixlm's kernels report their vector width, which the loader checks."""
    build = tmp_path / "build"
    for target in native.runnable_targets():
        assert load_library(_source(tmp_path), build, target).radixlm_test_answer() == 42
        assert len(list(build.glob(f"probe-{target.isa}-*.so"))) == 1
    load_library(_source(tmp_path), build)  # native: the CPU's own ISA, its own flags
    assert len(list(build.glob("probe-*.so"))) == len(native.runnable_targets()) + 1
    lanes = {"avx2": 8, "avx512": 16}
    vector_source = tmp_path / "vectors.cpp"
    vector_source.write_text(f'#include "{Path(native.__file__).parent}/vector_cpu.h"\n')
    for target in native.runnable_targets():
        library = load_library(vector_source, build, target)
        assert library.radixlm_vector_lanes() == lanes[target.isa]


def test_a_cpu_without_the_isa_gets_no_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No AVX2 (or not x86): no build at all, saying why; an AVX2-only CPU runs the
    avx2 build and refuses the avx512 one."""
    avx2_only = frozenset({"avx", "avx2", "fma", "bmi1", "bmi2", "f16c", "movbe", "sse4_2"})
    monkeypatch.setattr(native, "_cpu_flags", lambda: avx2_only)
    assert native.cpu_isa() == "avx2"
    assert native.runnable_targets() == [native.AVX2]
    with pytest.raises(KernelBuildError, match="needs AVX-512; this CPU has AVX2 only"):
        load_library(_source(tmp_path), tmp_path / "build", native.AVX512)
    monkeypatch.setattr(native, "_cpu_flags", lambda: frozenset({"sse4_2", "avx"}))
    assert native.cpu_isa() is None and native.runnable_targets() == []
    for target in native.KERNEL_TARGETS.values():
        with pytest.raises(KernelBuildError, match="neither AVX2 nor AVX-512"):
            load_library(_source(tmp_path), tmp_path / "build", target)
    assert not (tmp_path / "build").exists()
