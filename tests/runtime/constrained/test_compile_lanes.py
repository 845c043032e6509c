"""Compiles cannot starve each other: the cheap limits refuse a spec before
it queues (``spec_limits``), a small spec takes the fast lane past slow compiles, and a
compile's limit counts from its arrival (``compile_worker``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from radixlm.runtime.config import GrammarConfig
from radixlm.runtime.constrained import GrammarCompiler, GrammarSpec, compile_worker
from radixlm.runtime.constrained.schema_check import check_schema
from radixlm.runtime.constrained.spec_limits import check_spec_limits, is_small
from radixlm.runtime.errors import (
    GrammarCompileTimeoutError,
    GrammarError,
    RequestLimitError,
)

CONFIG = GrammarConfig()
# outlines-core's FSM for these runs for minutes; each is under every cheap limit
SLOW = ".{0,5000}"


def nested(depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def lark_alternatives(n: int) -> str:
    return "start: " + " | ".join(f'"a{i}"' for i in range(n))


# ---- the cheap limits ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "limit"),
    [
        (GrammarSpec("regex", "a{100000}"), "grammar_max_regex_size"),
        (GrammarSpec("regex", "(a{1000}){1000}"), "grammar_max_regex_size"),
        (GrammarSpec("lark", lark_alternatives(50_000)), "grammar_max_chars"),
        (GrammarSpec("ebnf", 'root ::= "' + "a" * 70_000 + '"'), "grammar_max_chars"),
        (GrammarSpec("choices", json.dumps([f"c{i}" for i in range(20_000)])), "grammar_max_chars"),
        (GrammarSpec("json_schema", json.dumps({"enum": list(range(100_000))})),
         "grammar_max_enum_values"),
    ],
)  # fmt: skip
def test_a_spec_past_a_limit_is_refused_naming_it(spec, limit):
    with pytest.raises(RequestLimitError) as info:
        check_spec_limits(spec, CONFIG)
    assert info.value.limit == limit and info.value.field == spec.kind
    assert limit in str(info.value)


def test_enum_values_count_over_the_whole_schema_and_name_the_largest():
    schema = {
        "type": "object",
        "properties": {"a": {"enum": list(range(6000))}, "b": {"enum": list(range(5000))}},
    }
    with pytest.raises(RequestLimitError, match=r"11000 values in all .*6000, at #/properties/a"):
        check_spec_limits(GrammarSpec("json_schema", json.dumps(schema)), CONFIG)
    check_spec_limits(GrammarSpec("json_schema", json.dumps({"enum": list(range(10_000))})), CONFIG)


def test_a_structural_tags_schemas_are_checked_too():
    tag = {
        "type": "structural_tag",
        "format": {
            "type": "triggered_tags",
            "triggers": ["<tool_call>"],
            "tags": [
                {
                    "begin": "<tool_call>",
                    "content": {"type": "json_schema", "json_schema": {"enum": [0] * 20_000}},
                    "end": "</tool_call>",
                }
            ],
        },
    }
    with pytest.raises(RequestLimitError, match="grammar_max_enum_values"):
        check_spec_limits(GrammarSpec("structural_tag", json.dumps(tag)), CONFIG)


def test_the_depth_check_refuses_as_the_workers_schema_check_does():
    text = json.dumps(nested(30))
    with pytest.raises(GrammarError) as early:
        check_spec_limits(GrammarSpec("json_schema", text), CONFIG)
    with pytest.raises(GrammarError) as late:
        check_schema(text, "llguidance", CONFIG.grammar_max_schema_depth)
    assert (early.value.field, early.value.reason) == (late.value.field, late.value.reason)
    assert "nested deeper than 24 levels" in early.value.reason
    check_spec_limits(GrammarSpec("json_schema", json.dumps(nested(24))), CONFIG)


def test_specs_within_the_limits_pass():
    for spec in (
        GrammarSpec("regex", r"[0-9]{3}-[0-9]{4}"),
        GrammarSpec("regex", "a{10000}"),
        GrammarSpec("lark", lark_alternatives(1000)),
        GrammarSpec("json_schema", json.dumps(nested(24))),
    ):
        check_spec_limits(spec, CONFIG)


@pytest.mark.parametrize(
    ("spec", "backend", "small"),
    [
        (GrammarSpec("json_schema", '{"type":"integer"}'), "auto", True),
        (GrammarSpec("json_schema", json.dumps({"enum": list(range(3000))})), "auto", False),
        (GrammarSpec("json_schema", '{"type":"integer"}'), "outlines", False),  # its slow kind
        (GrammarSpec("regex", r"[0-9]{3}-[0-9]{4}"), "outlines", True),
        (GrammarSpec("regex", r"[0-9]{3}-[0-9]{4}"), "auto", True),
        (GrammarSpec("regex", ".{0,64}"), "outlines", False),  # 3.6 s measured
        (GrammarSpec("regex", ".{0,64}"), "llguidance", True),
        (GrammarSpec("choices", '["yes","no"]'), "outlines", True),
        (GrammarSpec("lark", lark_alternatives(1000)), "llguidance", False),
        (GrammarSpec("ebnf", 'root ::= "a"'), "xgrammar", True),
    ],
)
def test_small_is_predicted_from_the_text_and_backend(spec, backend, small):
    assert is_small(spec, backend) is small


# ---- the lanes and the limit from arrival (real compile workers) --------------------------


@pytest.fixture
def new_compiler(vocab):
    built: list[GrammarCompiler] = []

    def build(**options) -> GrammarCompiler:
        built.append(GrammarCompiler(vocab, GrammarConfig(**options)))
        return built[-1]

    yield build
    for compiler in built:
        compiler.close()


def started(compiler: GrammarCompiler, pattern: str):
    """A slow regex's compile, started (the caller does not wait for it)."""
    return compiler.start(GrammarSpec("regex", pattern), "outlines")


def wait_until(done, timeout_s: float) -> float:
    """Waits until ``done()`` (the workers' driver thread moves the compiles on); the
    seconds it took."""
    start = time.monotonic()
    while not done():
        assert time.monotonic() - start < timeout_s, "not done in time"
        time.sleep(0.005)
    return time.monotonic() - start


def test_a_small_compile_passes_two_slow_ones(new_compiler):
    compiler = new_compiler(grammar_compile_timeout=3.0, grammar_compile_workers=2)
    compiler.warm()
    compiler.compile(GrammarSpec("regex", "[0-9]{40}"), "outlines")  # a general worker is up
    slow = [started(compiler, f"{SLOW}{n}") for n in range(2)]
    assert not any(p.done() for p in slow)
    small = compiler.start(GrammarSpec("json_schema", '{"type":"string","maxLength":7}'), "auto")
    waited = wait_until(small.done, 30)
    assert small.result().backend == "llguidance"
    assert waited < 1.5 and not any(p.done() for p in slow)  # it did not wait for them
    wait_until(lambda: all(p.done() for p in slow), 30)
    for pending in slow:
        with pytest.raises(GrammarCompileTimeoutError, match="counted from the request's arrival"):
            pending.result()


def test_a_queued_compile_is_refused_at_its_limit_from_arrival(new_compiler):
    compiler = new_compiler(grammar_compile_timeout=2.0, grammar_compile_workers=1)
    compiler.compile(GrammarSpec("regex", "[0-9]{40}"), "outlines")  # the general worker is up
    first = started(compiler, f"{SLOW}a")
    arrived = time.monotonic()
    second = started(compiler, f"{SLOW}b")  # waits: the one general worker is busy
    wait_until(second.done, 30)
    elapsed = time.monotonic() - arrived
    with pytest.raises(GrammarCompileTimeoutError, match="never started"):
        second.result()
    assert 2.0 <= elapsed < 3.0  # before: 2 s queued, a worker's start, then 2 s more
    wait_until(first.done, 30)
    with pytest.raises(GrammarCompileTimeoutError, match="the compile was stopped"):
        first.result()


def test_a_small_compile_that_overruns_the_fast_lane_moves_to_the_general_lane(
    new_compiler, monkeypatch
):
    monkeypatch.setattr(compile_worker, "FAST_LANE_S", 0.02)
    compiler = new_compiler(grammar_compile_timeout=30.0)
    compiler.warm()
    compiler.compile(GrammarSpec("regex", "[0-9]{3}"), "outlines")  # the fast worker is up
    (fast,) = compiler.workers.lane_pids("fast")
    spec = GrammarSpec("regex", ".{0,16}")  # small, ~0.2 s on outlines: over 0.02 s
    assert is_small(spec, "outlines")
    compiled = compiler.compile(spec, "outlines")
    assert compiled.backend == "outlines"
    assert fast not in compiler.workers.pids()  # it was killed for the job's overrun
    assert compiler.workers.lane_pids("general")  # which the general lane then compiled
    (restarted,) = compiler.workers.lane_pids("fast")  # the warmed lane is kept started
    assert restarted != fast


# ---- the driver thread -------------------------------------------------------------------


def _drivers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == compile_worker.DRIVER_THREAD]


def test_the_driver_runs_while_a_compile_waits_and_ends_after(new_compiler):
    """Nobody pumps: the workers' own thread runs each compile to its end, then stops
    (an idle engine keeps no thread awake); the next compile starts another."""
    compiler = new_compiler()
    wait_until(lambda: not _drivers(), 5)  # no other compiler's driver still winds down
    for n in range(2):
        spec = GrammarSpec("json_schema", json.dumps({"type": "string", "maxLength": 3 + n}))
        pending = compiler.start(spec, "auto")
        assert len(_drivers()) == 1
        wait_until(pending.done, 60)
        assert pending.result().backend == "llguidance"
        wait_until(lambda: not _drivers(), 5)


def test_close_fails_queued_and_running_compiles_and_stops_the_driver(new_compiler):
    compiler = new_compiler(grammar_compile_timeout=60.0, grammar_compile_workers=1)
    compiler.compile(GrammarSpec("regex", "[0-9]{40}"), "outlines")  # the general worker is up
    wait_until(lambda: not _drivers(), 5)
    running, queued = started(compiler, f"{SLOW}r"), started(compiler, f"{SLOW}q")
    assert len(_drivers()) == 1
    compiler.close()
    assert not _drivers()  # close joined the driver it stopped
    # the first is running by now, unless the driver had not handed it over yet
    with pytest.raises(GrammarError, match="shut down while it compiled|shutting down"):
        running.result()
    with pytest.raises(GrammarError, match="shutting down"):
        queued.result()
    assert compiler.workers.pids() == []
    late = compiler.start(GrammarSpec("regex", "[0-9]{41}"), "outlines")
    with pytest.raises(GrammarError, match="shutting down"):
        late.result()


def test_a_driver_that_fails_fails_its_compiles_and_the_next_compile_gets_a_new_one(
    new_compiler, monkeypatch, caplog
):
    compiler = new_compiler()
    pump = compile_worker.CompileWorkers._pump

    def broken(self, timeout):
        raise RuntimeError("a bug")

    monkeypatch.setattr(compile_worker.CompileWorkers, "_pump", broken)
    pending = compiler.start(GrammarSpec("json_schema", '{"type":"string","maxLength":5}'), "auto")
    wait_until(pending.done, 30)
    with pytest.raises(GrammarError, match=r"the compile driver failed: RuntimeError\('a bug'\)"):
        pending.result()
    assert "the grammar compile driver failed" in caplog.text
    monkeypatch.setattr(compile_worker.CompileWorkers, "_pump", pump)
    again = compiler.compile(GrammarSpec("json_schema", '{"type":"string","maxLength":6}'), "auto")
    assert again.backend == "llguidance"


def test_workers_released_under_a_running_driver_stop_it_quietly(new_compiler, caplog):
    """What the interpreter's exit does to a compiler nobody closed (its finalizer kills
    the workers from the main thread) while the driver waits on a worker's start: the
    driver ends without calling it a failure."""
    compiler = new_compiler()
    compiler.warm()
    wait_until(lambda: compiler.workers.pids() and _drivers(), 10)
    compiler.workers._finalizer()  # what weakref.finalize's exit hook calls
    wait_until(lambda: not _drivers(), 5)
    assert compiler.workers.pids() == []
    assert "driver failed" not in caplog.text


def test_wait_warm_waits_for_the_fast_lanes_worker(new_compiler):
    compiler = new_compiler()
    assert not compiler.wait_warm(0.01)  # not warmed: nothing to wait for
    compiler.warm()
    assert compiler.wait_warm(60)
    (fast,) = compiler.workers.lane_pids("fast")
    assert fast in compiler.workers.pids()
    compiler.close()
    assert not compiler.wait_warm(0.01)  # closed: no worker, and no wait


def _may_lower_niceness() -> bool:
    """Whether this process may lower a niceness (CAP_SYS_NICE, or root)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        os.setpriority(os.PRIO_PROCESS, child.pid, os.getpriority(os.PRIO_PROCESS, 0) + 1)
        os.setpriority(os.PRIO_PROCESS, child.pid, os.getpriority(os.PRIO_PROCESS, 0))
        return True
    except PermissionError:
        return False
    finally:
        child.kill()
        child.wait()


def test_the_fast_lanes_worker_starts_nicer_than_the_engine_and_is_set_back_when_ready(
    new_compiler,
):
    """Its start (seconds of imports) yields the cores to the engine's passes."""
    engine = os.getpriority(os.PRIO_PROCESS, 0)
    compiler = new_compiler()
    compiler.warm()
    wait_until(lambda: compiler.workers.lane_pids("fast"), 5)
    (fast,) = compiler.workers.lane_pids("fast")
    assert os.getpriority(os.PRIO_PROCESS, fast) == min(19, engine + 10)
    assert compiler.wait_warm(60)
    if _may_lower_niceness():
        assert os.getpriority(os.PRIO_PROCESS, fast) == engine
    else:  # its compiles stay nicer too
        assert os.getpriority(os.PRIO_PROCESS, fast) == min(19, engine + 10)


def test_wait_warm_returns_when_the_worker_cannot_start(new_compiler, monkeypatch):
    monkeypatch.setattr(
        compile_worker, "python_module_command", lambda module: [sys.executable, "-c", "pass"]
    )
    compiler = new_compiler()
    compiler.warm()
    started = time.monotonic()
    assert not compiler.wait_warm(30)
    assert time.monotonic() - started < 10
