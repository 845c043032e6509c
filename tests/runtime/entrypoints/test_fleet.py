"""``radixlm serve --dp N``: the launcher's options and the command lines it derives
(no model), then, on the default model, two replicas behind SGLang's router as a user
starts them: answers equal a replica's own, cache_aware keeps each shared prefix on one
replica (more cache hits than round_robin on the same requests, read from each
replica's /metrics), and a replica killed under load is dropped without a hang or a
leaked KV slot."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from radixlm.runtime.child_process import python_module_command
from radixlm.runtime.config import ConfigError
from radixlm.runtime.entrypoints import cli
from radixlm.runtime.entrypoints import fleet as fleet_module
from radixlm.runtime.entrypoints.fleet import (
    FleetConfig,
    RouterNotInstalledError,
    check_router_installed,
    free_ports,
    replica_command,
    router_command,
    threads_per_replica,
)
from radixlm.runtime.entrypoints.http import ServerConfig
from tests.runtime.entrypoints.http.conftest import free_port, sse_events

START_TIMEOUT_S = 150  # two replicas load the model side by side on 2 cores
REQUEST_TIMEOUT_S = 60


# ---- options and command lines (no model) --------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"dp_size": 0}, "dp_size"),
        ({"dp_size": True}, "dp_size"),
        ({"router_policy": "shortest_queue"}, "router_policy"),
        ({"router_log_level": "loud"}, "router_log_level"),
        ({"router_health_check_interval_s": 0}, "router_health_check_interval_s"),
        ({"router_prometheus_port": 70000}, "router_prometheus_port"),
        ({"replica_start_timeout_s": 0}, "replica_start_timeout_s"),
    ],
)
def test_bad_options_are_refused_by_name(kwargs, name):
    with pytest.raises(ConfigError, match=name):
        FleetConfig(**kwargs)


def _serve_args(argv: list[str]):
    return cli._build_parser().parse_args(["serve", *argv])


def test_the_flags_are_derived_with_sglangs_dp_alias():
    args = _serve_args(["--dp", "3", "--router-policy", "round_robin"])
    assert FleetConfig(**cli._prefixed(args, "fleet_")) == FleetConfig(
        dp_size=3, router_policy="round_robin"
    )
    assert _serve_args(["--dp-size", "2"]).fleet_dp_size == 2


def test_a_replica_gets_the_users_options_on_its_own_loopback_port():
    """The replica's command line, parsed by the CLI again, gives back the user's options
    with its own host, port and thread share."""
    args = _serve_args(
        ["--host", "0.0.0.0", "--port", "8000", "--api-key", "k", "--no-log-requests"]
        + ["--max-queued-requests", "9", "--dtype", "float32", "--max-total-tokens", "512"]
        + ["--no-cpu-layer-kernels", "--dp", "2"]
    )
    server = ServerConfig(**cli._prefixed(args, "server_"))
    engine = cli._engine_kwargs(args)
    command = replica_command(server, engine, port=4321, num_threads=3)
    prefix = python_module_command("radixlm.runtime.entrypoints.cli", "serve")
    assert command[: len(prefix)] == prefix
    replica = _serve_args(command[len(prefix) :])
    assert ServerConfig(**cli._prefixed(replica, "server_")) == dataclasses.replace(
        server, host="127.0.0.1", port=4321
    )
    assert cli._engine_kwargs(replica) == {**engine, "num_threads": 3}
    assert replica.fleet_dp_size == 1  # a replica serves; it never starts replicas
    # the user's own thread count wins over the share
    command = replica_command(server, {**engine, "num_threads": 5}, port=4321, num_threads=3)
    assert cli._engine_kwargs(_serve_args(command[len(prefix) :]))["num_threads"] == 5


def test_threads_are_shared_by_the_one_rule(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    assert threads_per_replica(FleetConfig(dp_size=2), {}) == 4
    assert threads_per_replica(FleetConfig(dp_size=4), {}) == 2
    assert threads_per_replica(FleetConfig(dp_size=3), {"tp_size": 2}) == 1
    assert threads_per_replica(FleetConfig(dp_size=16), {}) == 1
    with pytest.raises(ConfigError, match="frobnicate"):
        threads_per_replica(FleetConfig(dp_size=2), {"frobnicate": 1})


def test_the_router_fronts_the_replicas_on_the_users_address():
    fleet = FleetConfig(dp_size=2, router_policy="power_of_two")
    server = ServerConfig(host="0.0.0.0", port=8000, api_key="k")
    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    command = router_command(fleet, server, urls, prometheus_port=9)
    prefix = python_module_command("sglang_router.launch_router")
    assert command[: len(prefix)] == prefix
    flags = " ".join(command[len(prefix) :])
    assert f"--worker-urls {urls[0]} {urls[1]} " in flags
    for expected in ("--host 0.0.0.0 --port 8000", "--policy power_of_two", "--api-key k"):
        assert expected in flags
    assert "--prometheus-port 9" in flags and "--log-level warn" in flags


def test_the_replicas_ports_are_distinct():
    assert len(set(free_ports(16))) == 16


def test_without_the_router_the_error_names_the_extra(monkeypatch, capsys):
    find_spec = fleet_module.importlib.util.find_spec
    monkeypatch.setattr(
        fleet_module.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "sglang_router" else find_spec(name, *a),
    )
    with pytest.raises(RouterNotInstalledError, match=re.escape("pip install 'radixlm[router]'")):
        check_router_installed()
    assert cli.main(["serve", "--dp", "2"]) == 2
    assert "pip install 'radixlm[router]'" in capsys.readouterr().err


def test_a_replica_that_cannot_start_stops_the_launcher(tmp_path):
    """No model at the path: both replicas exit while starting, the launcher exits 1
    and leaves nothing running (nor a router: it is started only once they are up)."""
    port = free_port()
    argv = ["--dp", "2", "--port", str(port), "--model-path", str(tmp_path / "absent")]
    launcher = subprocess.Popen(
        [sys.executable, "-m", "radixlm.runtime.entrypoints.cli", "serve", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _, err = launcher.communicate(timeout=START_TIMEOUT_S)
    finally:
        _stop(launcher)
    assert launcher.returncode == 1, err
    assert re.search(r"replica \d exited while starting", err), err
    assert "sglang::router" not in err


# ---- the real thing: two replicas of the default model behind the router ------------


@dataclass(frozen=True)
class RunningFleet:
    launcher: subprocess.Popen
    url: str  # the router's
    replicas: tuple[str, ...]  # the replicas' own URLs, as the router lists them
    log: Path  # the launcher's and its children's output


@pytest.fixture(scope="module")
def running_fleet(default_model_dir, tmp_path_factory) -> Iterator[RunningFleet]:
    """``radixlm serve --dp 2`` as a user runs it (health checks every second, so a dead
    replica is dropped within seconds); stopped with SIGTERM at the end, which must exit 0."""
    port = free_port()
    log = tmp_path_factory.mktemp("fleet") / "launcher.log"
    argv = ["--dp", "2", "--port", str(port), "--model-path", str(default_model_dir)]
    argv += ["--max-total-tokens", "8192", "--router-health-check-interval-s", "1"]
    with open(log, "w") as out:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "radixlm.runtime.entrypoints.cli", "serve", *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _await(lambda: "serving on" in log.read_text() or launcher.poll() is not None)
        assert launcher.poll() is None, log.read_text()
        workers = httpx.get(url + "/workers", timeout=5).json()["workers"]
        yield RunningFleet(launcher, url, tuple(sorted(w["url"] for w in workers)), log)
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        _stop(launcher)


@pytest.fixture(scope="module")
def http(running_fleet):
    with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
        yield client


GREEDY_CHAT = {
    "model": "default",
    "messages": [{"role": "user", "content": "Name three colours."}],
    "max_tokens": 12,
    "temperature": 0,
}
GREEDY_GENERATE = {
    "text": "The capital of France is",
    "sampling_params": {"max_new_tokens": 12, "temperature": 0},
}


@pytest.mark.e2e
def test_answers_through_the_router_are_a_replicas_own(running_fleet, http):
    router, replica = running_fleet.url, running_fleet.replicas[0]
    assert len(running_fleet.replicas) == 2
    for path, body, text in [
        ("/v1/chat/completions", GREEDY_CHAT, lambda a: a["choices"][0]["message"]["content"]),
        ("/generate", GREEDY_GENERATE, lambda a: a["text"]),
    ]:
        routed, direct = (http.post(base + path, json=body) for base in (router, replica))
        assert routed.status_code == direct.status_code == 200, routed.text
        assert text(routed.json()) == text(direct.json()) != ""
    # streamed: the same text, event by event, ending in [DONE]
    direct = http.post(replica + "/generate", json=GREEDY_GENERATE).json()
    response = http.post(router + "/generate", json={**GREEDY_GENERATE, "stream": True})
    events = sse_events(response)
    chunks = [json.loads(e) for e in events[:-1]]
    assert events[-1] == "[DONE]" and len(chunks) == len(direct["output_ids"])
    assert "".join(c["delta"] for c in chunks) == chunks[-1]["text"] == direct["text"]
    response = http.post(router + "/v1/chat/completions", json={**GREEDY_CHAT, "stream": True})
    deltas = [json.loads(e)["choices"][0]["delta"] for e in sse_events(response)[:-1]]
    streamed = "".join(d.get("content") or "" for d in deltas)
    assert (
        streamed
        == http.post(replica + "/v1/chat/completions", json=GREEDY_CHAT).json()["choices"][0][
            "message"
        ]["content"]
    )


@pytest.mark.e2e
def test_the_router_lists_a_model_the_replicas_accept(running_fleet, http):
    [model] = http.get(running_fleet.url + "/v1/models").json()["data"]
    body = {**GREEDY_CHAT, "model": model["id"], "max_tokens": 1}
    assert http.post(running_fleet.url + "/v1/chat/completions", json=body).status_code == 200
    flushed = http.post(running_fleet.url + "/flush_cache").json()
    assert flushed["workers_flushed"] == 2, flushed
    loads = http.get(running_fleet.url + "/get_loads").json()["workers"]
    assert sorted(w["load"] for w in loads) == [0, 0]  # each replica's /get_load, idle


# Four long shared system prompts (~300 tokens each), each asked several questions.
_TOPICS = ("astronomy", "cooking", "sailing", "chess")
_QUESTIONS = ("What is it?", "Who does it?", "Why learn it?", "Where to start?", "How long?")


def _system_prompt(topic: str) -> str:
    facts = " ".join(f"Fact {i} about {topic}: it rewards patience number {i}." for i in range(24))
    return f"You are an expert on {topic}. {facts} Answer in one short sentence."


def _shared_prefix_order(seed: int = 7) -> list[tuple[str, str]]:
    """Every (topic, question), shuffled so that each topic falls on both parities of
    position: round_robin over 2 replicas then sends each topic to both."""
    pairs = [(t, q) for t in _TOPICS for q in _QUESTIONS]
    random.Random(seed).shuffle(pairs)
    for topic in _TOPICS:
        assert {i % 2 for i, (t, _) in enumerate(pairs) if t == topic} == {0, 1}
    return pairs


def _prefix_cache_hits(http: httpx.Client, replica: str) -> float:
    metrics = http.get(replica + "/metrics").text
    match = re.search(r"^radixlm:prefix_cache_hits_total\{[^}]*\} (\S+)$", metrics, re.M)
    assert match, metrics[:500]
    return float(match.group(1))


def _conversation(topic: str, question: str) -> list[dict]:
    return [
        {"role": "system", "content": _system_prompt(topic)},
        {"role": "user", "content": question},
    ]


def _shared_prefix_tokens(tokenizer) -> int:
    """The fewest prompt tokens two requests of one topic share (their system prompt)."""

    def ids(topic, question):
        return tokenizer.apply_chat_template(_conversation(topic, question), tokenize=False)

    shared = []
    for topic in _TOPICS:
        first, *others = (tokenizer(ids(topic, q))["input_ids"] for q in _QUESTIONS)
        for other in others:
            shared.append(next(i for i, (a, b) in enumerate(zip(first, other)) if a != b))
    return min(shared)


def _run_shared_prefix_load(http: httpx.Client, router: str, replicas) -> tuple[float, list]:
    """The requests one at a time through ``router`` on flushed replicas: the prompt
    tokens found cached over both replicas, and each request's (topic, cached tokens)."""
    for replica in replicas:
        assert http.post(replica + "/flush_cache").status_code == 200
    before = [_prefix_cache_hits(http, r) for r in replicas]
    cached = []
    for topic, question in _shared_prefix_order():
        messages = _conversation(topic, question)
        body = {"model": "default", "messages": messages, "max_tokens": 1, "temperature": 0}
        answer = http.post(router + "/v1/chat/completions", json=body)
        assert answer.status_code == 200, answer.text
        cached.append((topic, answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"]))
    after = [_prefix_cache_hits(http, r) for r in replicas]
    return sum(after) - sum(before), cached


@contextlib.contextmanager
def _router(worker_urls, policy: str) -> Iterator[str]:
    """SGLang's router CLI itself in front of plain ``radixlm serve`` replicas."""
    port = free_port()
    command = [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls"]
    command += [*worker_urls, "--policy", policy, "--host", "127.0.0.1", "--port", str(port)]
    command += ["--prometheus-port", str(free_port()), "--prometheus-host", "127.0.0.1"]
    command += ["--log-level", "warn"]
    router = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        _await(lambda: _healthy_workers(url) == len(worker_urls) or router.poll() is not None)
        assert router.poll() is None, router.stderr.read().decode()
        yield url
    finally:
        _stop(router)


@pytest.mark.e2e
def test_cache_aware_keeps_each_prefix_on_one_replica(running_fleet, http, hf_tokenizer):
    """The launcher's cache_aware router against SGLang's own router CLI with
    round_robin, over the same replicas and the same requests."""
    replicas, prefix = running_fleet.replicas, _shared_prefix_tokens(hf_tokenizer)
    assert prefix > 250
    aware_hits, aware = _run_shared_prefix_load(http, running_fleet.url, replicas)
    with _router(replicas, "round_robin") as round_robin:
        rr_hits, rr = _run_shared_prefix_load(http, round_robin, replicas)
    # cache_aware: after its first request, every request of a topic found the whole
    # system prompt cached on the replica it was sent to
    for topic in _TOPICS:
        cached = [n for t, n in aware if t == topic]
        assert cached[0] < prefix and all(n >= prefix for n in cached[1:]), (topic, cached)
    # round_robin sent each topic to both replicas: a second miss of the prompt per topic
    for topic in _TOPICS:
        assert sum(n < prefix for t, n in rr if t == topic) == 2, (topic, rr)
    assert aware_hits > rr_hits + len(_TOPICS) * prefix * 0.9, (aware_hits, rr_hits)


# Openings with nothing in common: the router spreads them (no cached prefix to follow).
_OPENINGS = ("In Paris", "Far north", "Under the sea", "Long ago", "Quietly", "At dawn")


@pytest.mark.e2e
def test_a_replica_killed_under_load_is_dropped(running_fleet, http):
    """SIGKILL one replica while both run long requests: none hangs, only the victim's
    end with errors (sglang-router retries a request whose replica died before it
    answered, so a victim's request may also complete on the survivor: how many do
    depends on which ones the router gave it), the router stops sending it anything,
    every later request completes on the survivor, and the survivor leaks no KV slot.
    (Last: it kills a replica.)"""
    router, replicas = running_fleet.url, running_fleet.replicas
    outcomes: dict[int, str] = {}

    def request(i: int) -> None:
        body = {
            "text": f"{_OPENINGS[i]}, once upon a time,",
            "sampling_params": {"max_new_tokens": 200, "ignore_eos": True},
            "stream": i % 2 == 0,
        }
        try:
            with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
                with client.stream("POST", router + "/generate", json=body) as response:
                    text = "".join(response.iter_text())
            done = response.status_code == 200 and (not body["stream"] or "[DONE]" in text)
            outcomes[i] = "completed" if done else f"error {response.status_code}"
        except httpx.TransportError as e:  # the router cut the connection
            outcomes[i] = f"error {type(e).__name__}"

    threads = [threading.Thread(target=request, args=(i,)) for i in range(len(_OPENINGS))]
    for thread in threads:
        thread.start()
    _await(lambda: sum(_load(http, r)["num_reqs"] for r in replicas) == len(threads), 60)
    # the victim: the replica running more of them (the router decides who runs what)
    num_reqs = {r: _load(http, r)["num_reqs"] for r in replicas}
    victim, survivor = sorted(replicas, key=num_reqs.__getitem__, reverse=True)
    os.kill(_replica_pid(running_fleet.launcher, victim), signal.SIGKILL)
    for thread in threads:
        thread.join(timeout=2 * REQUEST_TIMEOUT_S)
    assert not any(t.is_alive() for t in threads), "a request hung"
    errors = [o for o in outcomes.values() if o.startswith("error")]
    assert len(outcomes) == len(threads), outcomes
    assert len(errors) <= num_reqs[victim], (num_reqs, outcomes)
    assert len(outcomes) - len(errors) >= num_reqs[survivor], (num_reqs, outcomes)
    _await(lambda: not _is_healthy(http, router, victim), timeout_s=30)
    _await(lambda: f"({victim}, pid" in running_fleet.log.read_text(), timeout_s=10)
    _await(lambda: _load(http, survivor)["num_reqs"] == 0, timeout_s=30)
    before = _request_successes(http, survivor)
    for i in range(4):
        body = {**GREEDY_GENERATE, "text": f"Question {i}: why is the sky blue?"}
        assert http.post(router + "/generate", json=body).status_code == 200
    assert _request_successes(http, survivor) == before + 4
    # the survivor: idle, and once flushed every KV slot is free again
    _await(lambda: _load(http, survivor)["num_reqs"] == 0, timeout_s=30)
    assert http.post(survivor + "/flush_cache").status_code == 200
    metrics = http.get(survivor + "/metrics").text
    assert _metric(metrics, "kv_cache_free_slots") == _metric(metrics, "kv_cache_slots") > 0


# ---- helpers ----------------------------------------------------------------------------


def _await(condition, timeout_s: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s} s"
        time.sleep(0.2)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _healthy_workers(router: str) -> int:
    try:
        return httpx.get(router + "/readiness", timeout=2).json().get("healthy_workers", 0)
    except (httpx.HTTPError, ValueError):
        return 0


def _is_healthy(http: httpx.Client, router: str, replica: str) -> bool:
    workers = http.get(router + "/workers").json()["workers"]
    return any(w["url"] == replica and w["is_healthy"] for w in workers)


def _load(http: httpx.Client, replica: str) -> dict:
    [load] = http.get(replica + "/get_load").json()
    return load


def _request_successes(http: httpx.Client, replica: str) -> float:
    return _metric(http.get(replica + "/metrics").text, "request_success_total")


def _metric(metrics: str, name: str) -> float:
    match = re.search(rf"^radixlm:{name}\{{[^}}]*\}} (\S+)$", metrics, re.M)
    assert match, name
    return float(match.group(1))


def _replica_pid(launcher: subprocess.Popen, url: str) -> int:
    """The launcher's child serving ``url`` (its command line names the port)."""
    import psutil

    port = url.rsplit(":", 1)[1]
    for child in psutil.Process(launcher.pid).children():
        if f"--port={port}" in child.cmdline():
            return child.pid
    raise AssertionError(f"no child of the launcher serves {url}")
