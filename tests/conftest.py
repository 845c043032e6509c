"""Shared fixtures: the real default model (pulled by the set-up) and engines on it;
and the suite's hygiene: after every test module, nothing it started may still run
(engines, compile workers, test servers), and, when ``RADIXLM_TEST_RSS_LOG`` names a
file, the resident memory of this process and its children is appended to it."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

# Triton reads TRITON_INTERPRET when @triton.jit decorates a kernel, i.e. when a
# radixlm.kernels module is first imported (not at `import triton`, not at launch):
# set it here, before any test module can import one. Without CUDA the kernels
# then run on CPU tensors through Triton's interpreter.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

# transformers 5.25+ import Hugging Face's ``kernels``; pytest puts the repository root,
# which holds radixlm's own kernels/ folder, first on sys.path (see the module).
from radixlm.runtime.model_store.transformers_compat import import_hub_kernels  # noqa: E402

import_hub_kernels()

# What session-scoped fixtures share across modules on purpose: the loops of their
# engines and the compilers whose workers they keep. The module check allows these.
_SHARED_LOOPS: list = []
_SHARED_COMPILERS: list = []

ENGINE_THREAD = "radixlm-engine"
SERVER_THREAD = "radixlm-test-server"  # tests/servers.py names its uvicorn threads so
_CHILD_MARK = "radixlm"  # in the command line of a compile worker or a `radixlm serve`
_EXIT_GRACE_S = 5.0  # how long a child just killed may take to go


def share_engine(engine):
    """Marks a session fixture's engine as shared: the module check leaves it running."""
    _SHARED_LOOPS.append(engine._loop)
    return engine


def share_compiler(compiler):
    """Marks a shared fixture's GrammarCompiler: its workers may outlive a module."""
    _SHARED_COMPILERS.append(compiler)
    return compiler


def unshare_compiler(compiler) -> None:
    """Before the fixture closes it: its workers are no longer shared."""
    _SHARED_COMPILERS.remove(compiler)


_BUILT_RUNTIMES: list = []


def close_after_test(runtime):
    """Marks a runtime a test built without an engine (``build_runtime``): it is closed
    when the test ends. Its parts refer to each other, so dropped, its compile worker
    would run until the next collection, past the module check."""
    _BUILT_RUNTIMES.append(runtime)
    return runtime


@pytest.fixture(autouse=True)
def _close_built_runtimes() -> Iterator[None]:
    yield
    while _BUILT_RUNTIMES:
        _BUILT_RUNTIMES.pop().close()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that needs the real default model carries the ``e2e`` marker: each
    real-model fixture (``engine``, ``hf_model``, ``hf_tokenizer``, ...) depends on
    ``default_model_dir``, so a test needs the model iff that fixture is in its closure.
    ``pytest -m "not e2e"`` is then the fast suite, which never touches the model."""
    for item in items:
        if "default_model_dir" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(autouse=True)
def _single_threaded_main_thread():
    """The tests' own torch work (transformers references, checks) runs single-threaded
    on the main thread, which so never gets an OpenMP worker team: next to an engine
    loop's team it would outnumber 2 cores and halve every engine's speed for the rest
    of the session (docs/engine.md, "Engine options"). Per test, because loading a
    transformers model sets the thread count again (benchmarks/README.md, "CPU engine
    choices")."""
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def default_model_dir():
    from radixlm.runtime.model_store import pull_default_model

    return pull_default_model(progress=False)


@pytest.fixture(scope="session")
def hf_tokenizer(default_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(default_model_dir))


@pytest.fixture(scope="session")
def hf_model(default_model_dir):
    """transformers' own implementation of the default model: the numerical reference."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(default_model_dir), dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="session")
def engine(default_model_dir):
    """A float32 engine on the default model, shared by tests that leave it idle."""
    from radixlm import Engine

    eng = Engine(model_path=str(default_model_dir), dtype="float32", max_total_tokens=16384)
    yield share_engine(eng)
    _SHARED_LOOPS.remove(eng._loop)
    eng.shutdown()


@pytest.fixture
def check_no_leaks():
    return assert_no_leaks


def assert_no_leaks(engine) -> None:
    """Integrity after requests end: every KV slot is free or held (unlocked) by the
    prefix cache; nothing runs or waits."""
    import time

    deadline = time.time() + 5
    while time.time() < deadline:
        stats = engine.get_stats()
        if stats.num_running == 0 and stats.num_waiting == 0:
            break
        time.sleep(0.01)
    assert stats.num_running == 0 and stats.num_waiting == 0
    assert stats.kv_used == 0, stats  # free + cached == capacity: no slot leaked or locked


# ---- after each module: nothing left running, and what memory it holds --------------


def _children() -> dict[int, str]:
    """This process's live descendants (zombies excluded): pid -> command line."""
    from tests.tree_rss import descendants

    found = {}
    for pid in descendants(os.getpid()):
        try:
            cmdline = (Path("/proc") / str(pid) / "cmdline").read_bytes()
        except OSError:  # gone meanwhile
            continue
        found[pid] = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
    return found


def _rss_kb(pid: int | str = "self") -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in kB; zeros when it is gone."""
    try:
        status = (Path("/proc") / str(pid) / "status").read_text()
    except OSError:
        return 0, 0
    values = {}
    for line in status.splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0])
    return values.get("VmRSS", 0), values.get("VmHWM", 0)


def _live_loops() -> list:
    """Every engine loop in this process that was built and not shut down (found among
    the collector's objects: the runtime keeps no registry of its engines). One left
    unreachable still counts: a test forgot its shutdown. No collection first (it
    costs ~0.1 s a module): a loop whose build raised has no runtime and is skipped."""
    from radixlm.runtime.entrypoints.engine_loop import EngineLoop

    return [
        o
        for o in gc.get_objects()
        if type(o) is EngineLoop and hasattr(o, "runtime") and not o.stopping
    ]


def _leftovers() -> list[str]:
    """What runs now that no shared fixture owns: engine loops, their threads, test
    server threads, and radixlm child processes (compile workers, `radixlm serve`)."""
    shared_threads = {loop.thread for loop in _SHARED_LOOPS}
    shared_pids = {pid for c in _SHARED_COMPILERS for pid in c.workers.pids()}
    for loop in _SHARED_LOOPS:
        shared_pids.update(loop.runtime.request_builder.grammars.workers.pids())
    found = [
        f"an engine not shut down ({loop.config.model.model_path})"
        for loop in _live_loops()
        if loop not in _SHARED_LOOPS
    ]
    found += [
        f"a thread {t.name!r}"
        for t in threading.enumerate()
        if t.name in (ENGINE_THREAD, SERVER_THREAD) and t not in shared_threads
    ]
    found += [
        f"child process {pid}: {cmd}"
        for pid, cmd in _children().items()
        if _CHILD_MARK in cmd and pid not in shared_pids
    ]
    return found


def _stop_leftovers() -> None:
    """Shuts down what a module left, so the next module starts clean."""
    import signal

    for loop in _live_loops():
        if loop not in _SHARED_LOOPS:
            loop.shutdown()
    shared_pids = {pid for c in _SHARED_COMPILERS for pid in c.workers.pids()}
    for loop in _SHARED_LOOPS:
        shared_pids.update(loop.runtime.request_builder.grammars.workers.pids())
    for pid, cmd in _children().items():
        if _CHILD_MARK in cmd and pid not in shared_pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _settled_leftovers() -> list[str]:
    """Leftovers, after giving what is stopping a moment to finish stopping (a killed
    worker until it is reaped, a shut-down loop's thread until it returns)."""
    deadline = time.monotonic() + _EXIT_GRACE_S
    while (found := _leftovers()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def _trim_heap() -> None:
    """Hands the C heap's free pages back to the OS. An engine's tensors are freed into
    glibc's arenas (one per loop thread), which keep them resident; one module's engines
    would otherwise inflate the memory of every later module."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _log_memory(name: str) -> None:
    """Appends ``name``'s line to ``RADIXLM_TEST_RSS_LOG``: this process's resident
    memory now and its peak since the last line (the peak is reset after each line),
    and its children's."""
    log = os.environ.get("RADIXLM_TEST_RSS_LOG")
    if not log:
        return
    rss, hwm = _rss_kb()
    children = _children()
    child_rss = sum(_rss_kb(pid)[0] for pid in children)
    with open(log, "a") as f:
        f.write(
            f"{name}\trss_mb={rss // 1024}\tpeak_mb={hwm // 1024}\t"
            f"children={len(children)}\tchildren_rss_mb={child_rss // 1024}\n"
        )
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS (Linux)


@pytest.fixture(autouse=True)
def _test_memory(request) -> Iterator[None]:
    """With ``RADIXLM_TEST_RSS_LOG`` set, a line per test too: which test needs the
    memory."""
    yield
    if os.environ.get("RADIXLM_TEST_RSS_LOG"):
        _log_memory("  " + request.node.nodeid)


@pytest.fixture(scope="module", autouse=True)
def _module_leaves_nothing_running(request) -> Iterator[None]:
    """Fails the module (an error at its last test's teardown) when, once its own
    fixtures are torn down, an engine, an engine thread, a test server or a radixlm
    child process it started is still running. Shared session fixtures
    (``share_engine``/``share_compiler``) are allowed; what is left is stopped, so the
    next module is judged on its own."""
    yield
    # this fixture is set up first in the module, so torn down after the module's others
    found = _settled_leftovers()
    if found:
        _stop_leftovers()
    _trim_heap()
    _log_memory(request.module.__name__)
    if found:
        pytest.fail(f"{request.module.__name__} left running: " + "; ".join(found), pytrace=False)
