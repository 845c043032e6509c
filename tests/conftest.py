"""Shared fixtures: the real default model (pulled by the set-up) and engines on it."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

# Triton reads TRITON_INTERPRET when @triton.jit decorates a kernel, i.e. when a
# radixlm.kernels module is first imported (not at `import triton`, not at launch):
# set it here, before any test module can import one. Without CUDA the kernels
# then run on CPU tensors through Triton's interpreter.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


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
    of the session (README, "Engine options"). Per test, because loading a transformers
    model sets the thread count again (measured: an engine at 31 -> 15 tok/s after one
    `generate` of transformers on the main thread)."""
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
    yield eng
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
