"""enable_torch_compile: the same tokens as the eager engine, and what compiles when.

One compiled engine per attention backend ("cpu": the C++ decode kernel as an
opaque op in the graph; "torch": gather + SDPA with padding and masks) on a small
random-weight model of the default model's head layout (head dim 64, three query
heads per KV head), against an eager engine on the same weights. What compiles
does not depend on the weights' values; a graph's compile time grows with the
layers, so three layers, not the default model's thirty (its start compiles two
graphs: batch size 1, and 2 and up).
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters, guard_failures

from radixlm import Engine
from radixlm.runtime.config import ConfigError
from radixlm.runtime.entrypoints import engine_loop
from radixlm.runtime.executor import compiled_decode
from radixlm.runtime.models import write_random_model

CONFIG = {
    "vocab_size": 4096,
    "hidden_size": 192,
    "intermediate_size": 512,
    "num_hidden_layers": 3,
    "num_attention_heads": 3,
    "num_key_value_heads": 1,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
}
_rng = random.Random(0)
PROMPTS = [[_rng.randrange(3, 4096) for _ in range(n)] for n in (5, 9, 4, 6, 11, 7)]
MAX_BS = 4
OPTIONS = {"dtype": "float32", "max_total_tokens": 4096}


def _greedy(n: int) -> dict:
    return {"temperature": 0, "max_new_tokens": n, "ignore_eos": True}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_random_model(tmp_path_factory.mktemp("small"), CONFIG, torch.float32, seed=5)


@pytest.fixture(scope="module")
def engine(model_dir):
    """The eager reference on the same weights (the few-row C++ kernels off, as in the
    compiled engines, so both sides run the same layers)."""
    eng = Engine(model_path=str(model_dir), cpu_layer_kernels=False, **OPTIONS)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module", params=["cpu", "torch"])
def compiled_engine(request, model_dir):
    eng = Engine(
        model_path=str(model_dir),
        enable_torch_compile=True,
        torch_compile_max_bs=MAX_BS,
        attention_backend=request.param,
        cpu_layer_kernels=False,  # they would take every pass of up to 8 rows
        **OPTIONS,
    )
    yield eng
    eng.shutdown()


def _recompile_reasons() -> str:
    """Why dynamo compiled again (the guards that failed), for a failing assertion."""
    return "; ".join(str(r) for reasons in guard_failures.values() for r in reasons)


class _Compiled:
    """The compiled-pass count of an engine with ``enable_torch_compile``."""

    def __init__(self, engine: Engine) -> None:
        assert engine.config.model.enable_torch_compile
        self.engine = engine

    @property
    def passes(self) -> int:
        return self.engine.get_stats().passes.compiled


def test_single_stream_gives_the_eager_tokens(compiled_engine, engine, check_no_leaks) -> None:
    compiled = _Compiled(compiled_engine)
    graphs, passes = counters["stats"]["unique_graphs"], compiled.passes
    for prompt in PROMPTS[:3]:
        got = compiled_engine.generate(input_ids=prompt, sampling_params=_greedy(24))
        want = engine.generate(input_ids=prompt, sampling_params=_greedy(24))
        assert got["output_ids"] == want["output_ids"], prompt
    # 23 decode passes per prompt (the first token comes from the prefill), all
    # compiled, and the warm-up's graphs served them: nothing was compiled again.
    assert compiled.passes - passes == 3 * 23
    assert counters["stats"]["unique_graphs"] == graphs, _recompile_reasons()
    check_no_leaks(compiled_engine)


def test_batches_give_the_eager_tokens(compiled_engine, engine, check_no_leaks) -> None:
    """Six rows of different lengths: passes of more than MAX_BS rows run eager,
    smaller ones (as requests finish) compiled, with padding and masks."""
    compiled = _Compiled(compiled_engine)
    graphs, passes = counters["stats"]["unique_graphs"], compiled.passes
    lengths = [20, 5, 12, 30, 8, 16]
    params = [_greedy(n) for n in lengths]
    got = compiled_engine.generate(input_ids=PROMPTS, sampling_params=params)
    want = engine.generate(input_ids=PROMPTS, sampling_params=params)
    assert [g["output_ids"] for g in got] == [w["output_ids"] for w in want]
    # Decode pass t makes token t (2..30) of every row still short of its length:
    # 6 rows up to t = 5, 5 up to t = 8, then at most 4: t = 9..30 run compiled.
    assert compiled.passes - passes == 22
    assert counters["stats"]["unique_graphs"] == graphs, _recompile_reasons()
    check_no_leaks(compiled_engine)


def test_one_token_prompts_compile_nothing(compiled_engine, engine, check_no_leaks) -> None:
    """torch.compile specialises sizes 0 and 1: passes whose longest row has fewer
    than 2 cached tokens run eager instead of compiling a graph of their own."""
    compiled = _Compiled(compiled_engine)
    compiled_engine.flush_cache()  # no cached prefix may lengthen a row
    graphs, passes = counters["stats"]["unique_graphs"], compiled.passes
    alone = compiled_engine.generate(input_ids=[504], sampling_params=_greedy(8))
    want_alone = engine.generate(input_ids=[504], sampling_params=_greedy(8))
    assert alone["output_ids"] == want_alone["output_ids"]
    # Prefill (prefix 0) and the first decode pass (prefix 1) eager; 6 compiled.
    assert compiled.passes - passes == 6
    ids = [[504], [2683], [504, 314]]
    got = compiled_engine.generate(input_ids=ids, sampling_params=_greedy(8))
    want = engine.generate(input_ids=ids, sampling_params=_greedy(8))
    assert [g["output_ids"] for g in got] == [w["output_ids"] for w in want]
    # The mixed prefill runs eager; every decode pass has a 2-token row: 7 compiled.
    assert compiled.passes - passes == 6 + 7
    assert counters["stats"]["unique_graphs"] == graphs, _recompile_reasons()
    check_no_leaks(compiled_engine)


def test_passes_over_the_padded_kv_budget_run_eager(
    compiled_engine, engine, monkeypatch, check_no_leaks
) -> None:
    """Past MAX_PADDED_KV cached tokens (rows x longest) the torch backend's eager
    attention, which groups rows by length, is the faster one: those passes run
    eager. The C++ kernel pads nothing, so with it every pass runs compiled."""
    monkeypatch.setattr(compiled_decode, "MAX_PADDED_KV", 40)
    compiled = _Compiled(compiled_engine)
    compiled_engine.flush_cache()
    graphs, passes = counters["stats"]["unique_graphs"], compiled.passes
    prompt = list(range(1000, 1010))
    got = compiled_engine.generate(input_ids=prompt, sampling_params=_greedy(40))
    want = engine.generate(input_ids=prompt, sampling_params=_greedy(40))
    assert got["output_ids"] == want["output_ids"]
    # Decode pass k (k = 1..39) has 9 + k cached tokens: k = 1..31 are within 40.
    padded = compiled_engine.config.model.attention_backend == "torch"
    assert compiled.passes - passes == (31 if padded else 39)
    assert counters["stats"]["unique_graphs"] == graphs, _recompile_reasons()
    check_no_leaks(compiled_engine)


def test_options_are_validated() -> None:
    with pytest.raises(ConfigError, match="enable_torch_compile"):
        Engine(enable_torch_compile="yes")
    with pytest.raises(ConfigError, match="torch_compile_max_bs"):
        Engine(enable_torch_compile=True, torch_compile_max_bs=0)


def test_a_resumed_loop_thread_compiles_nothing(compiled_engine, monkeypatch, check_no_leaks):
    """A loop thread that retired while idle and started again runs with the engine's
    thread count, even when the caller's thread set another count in between (the
    graphs guard on the count: a thread given the caller's 1 compiled them again)."""
    compiled = _Compiled(compiled_engine)
    want = compiled_engine.generate(input_ids=PROMPTS[0], sampling_params=_greedy(8))
    monkeypatch.setattr(engine_loop, "IDLE_EXIT_S", 0.05)
    monkeypatch.setattr(engine_loop, "_another_loop_thread_runs", lambda: True)
    deadline = time.monotonic() + 10
    while compiled_engine._loop.thread is not None:
        assert time.monotonic() < deadline, "the idle loop thread did not retire"
        time.sleep(0.01)
    monkeypatch.setattr(engine_loop, "IDLE_EXIT_S", 2.0)
    compiled_engine.get_stats()  # a fresh loop thread starts (and runs no torch op)
    torch.set_num_threads(1)  # the caller's thread sets its own count meanwhile
    graphs, passes = counters["stats"]["unique_graphs"], compiled.passes
    got = compiled_engine.generate(input_ids=PROMPTS[0], sampling_params=_greedy(8))
    assert got["output_ids"] == want["output_ids"]
    # The cached prompt's last token (a one-token extend) and the 7 decode passes.
    assert compiled.passes - passes == 8
    assert counters["stats"]["unique_graphs"] == graphs, _recompile_reasons()
    check_no_leaks(compiled_engine)


def test_an_int8_kv_pool_compiles_and_gives_the_eager_tokens(model_dir, check_no_leaks) -> None:
    """The staged decode reads codes and scales, its new tokens as they will be stored,
    and commit quantizes them: the compiled engine's tokens are the eager one's."""
    options = {**OPTIONS, "cpu_layer_kernels": False, "kv_cache_dtype": "int8"}
    with Engine(model_path=str(model_dir), **options) as eager:
        want = eager.generate(input_ids=PROMPTS[:2], sampling_params=_greedy(16))
    with Engine(
        model_path=str(model_dir),
        enable_torch_compile=True,
        torch_compile_max_bs=MAX_BS,
        attention_backend="torch",
        **options,
    ) as compiled:
        got = compiled.generate(input_ids=PROMPTS[:2], sampling_params=_greedy(16))
        assert _Compiled(compiled).passes > 0
        check_no_leaks(compiled)
    assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]
