"""Tensor parallelism end to end: ``Engine(tp_size=2)`` (two processes over gloo) gives
the greedy tokens of ``tp_size=1`` on every family's random checkpoint, quantized
weights, a GGUF file's codes and the default model, with the radix cache serving a
repeat; a rank that dies stops the engine, and ``radixlm serve --tp 2`` exits
non-zero with the reason, never hangs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import torch

from radixlm.runtime.distributed.sharding import ShardingError
from radixlm.runtime.entrypoints.engine import Engine
from radixlm.runtime.errors import EngineStoppedError
from radixlm.runtime.models import write_random_model
from tests.runtime.models import quantized_checkpoints as qc
from tests.servers import free_port

BASE: dict[str, Any] = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,  # fewer KV heads than ranks, more query heads
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
}
EXPERTS = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
FAMILIES: dict[str, dict[str, Any]] = {
    "llama-gqa": {"architectures": ["LlamaForCausalLM"]},
    # 6 query heads over 3 KV heads: ranks of 2 and 1 KV heads; q/k/v biases
    "qwen2-uneven": {
        "architectures": ["Qwen2ForCausalLM"],
        "num_attention_heads": 6,
        "num_key_value_heads": 3,
        "hidden_size": 96,
    },
    "phi3-fused": {"architectures": ["Phi3ForCausalLM"], "partial_rotary_factor": 0.5},
    "gemma2": {
        "architectures": ["Gemma2ForCausalLM"],
        "num_key_value_heads": 2,
        "head_dim": 16,
        "query_pre_attn_scalar": 16,
        "sliding_window": 16,
    },
    "qwen3-moe": {"architectures": ["Qwen3MoeForCausalLM"], "num_key_value_heads": 2, **EXPERTS},
    "qwen2-moe-shared": {
        "architectures": ["Qwen2MoeForCausalLM"],
        "num_key_value_heads": 2,
        "shared_expert_intermediate_size": 64,
        **EXPERTS,
    },
    # q/k norms over the whole projections: their sums of squares cross the ranks
    "olmoe": {"architectures": ["OlmoeForCausalLM"], "num_key_value_heads": 4, **EXPERTS},
}
GREEDY = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}
# token ids, not text: every family's random tokenizer differs
PROMPTS = [[(7 * i + k) % 120 + 3 for i in range(30)] for k in range(3)]


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The llama-gqa checkpoint, written once for the module's tests that need any model."""
    config = {**BASE, **FAMILIES["llama-gqa"]}
    return write_random_model(tmp_path_factory.mktemp("llama-gqa"), config, torch.float32)


@pytest.fixture(scope="module", params=FAMILIES)
def family_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    if request.param == "llama-gqa":
        return request.getfixturevalue("llama_dir")
    config = {**BASE, **FAMILIES[request.param]}
    return write_random_model(tmp_path_factory.mktemp(request.param), config, torch.float32)


_ONE_RANK: dict[tuple, tuple[list, list, int]] = {}  # _greedy(1, ...) by its arguments


def _greedy(tp_size: int, model_path: str | None, **options: Any) -> tuple[list, list, int]:
    """Greedy ids of PROMPTS, of the first prompt again (from the radix cache), and the
    cached tokens of that repeat. One rank's are computed once per module (the reference
    several tests compare with); two ranks' every time."""
    key = (model_path, tuple(sorted(options.items())))
    if tp_size == 1 and key in _ONE_RANK:
        return _ONE_RANK[key]
    with Engine(
        model_path=model_path, tp_size=tp_size, max_total_tokens=2048, chunked_prefill_size=16,
        **options,
    ) as engine:  # fmt: skip
        outputs = engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)
        again = engine.generate(input_ids=PROMPTS[0], sampling_params=GREEDY)
        first = [r["output_ids"] for r in outputs]
        result = first, again["output_ids"], again["meta_info"]["cached_tokens"]
    if tp_size == 1:
        _ONE_RANK[key] = result
    return result


def test_two_ranks_decode_the_tokens_of_one(family_dir: Path) -> None:
    one = _greedy(1, str(family_dir), dtype="float32")
    two = _greedy(2, str(family_dir), dtype="float32")
    assert two[0] == one[0]
    assert two[1] == one[0][0]  # the repeat, over its cached prefix, decodes the same
    assert two[2] == one[2] > 0


def test_quantized_weights_are_sharded_before_quantizing(llama_dir: Path) -> None:
    """int4 groups of 32: every rank's row-parallel inputs (32 of o_proj's, 64 / 32 of
    down_proj's) hold whole groups."""
    model = llama_dir
    options = {"quantization": "int4", "quantization_group_size": 32}
    assert _greedy(2, str(model), **options)[0] == _greedy(1, str(model), **options)[0]


def test_a_quantized_checkpoints_codes_are_sharded_as_they_are(
    llama_dir: Path, tmp_path: Path
) -> None:
    """An AWQ checkpoint (groups of 32) over two ranks: every rank holds its slice of the
    file's codes; a GPTQ act-order one is refused, naming why."""
    awq = qc.write_awq(llama_dir, tmp_path / "awq", 32, reference=False).path
    assert _greedy(2, str(awq))[0] == _greedy(1, str(awq))[0]
    act_order = qc.write_gptq(llama_dir, tmp_path / "gptq", 4, 32, desc_act=True, reference=False)
    with pytest.raises(ShardingError, match="act-order codes"):
        Engine(model_path=str(act_order.path), tp_size=2, max_total_tokens=256)


def test_a_kivi_kv_cache_over_two_ranks(tmp_path: Path) -> None:
    """kivi4 (heads of 32: one key group's parameters over 32 slots), one KV head per
    rank, prompts in chunks of 16: every rank's pool writes and reads its heads' codes
    and windows as one rank does."""
    config = {**BASE, **FAMILIES["llama-gqa"], "hidden_size": 128, "num_key_value_heads": 2}
    model = str(write_random_model(tmp_path, config, torch.float32))
    options = {"dtype": "float32", "kv_cache_dtype": "kivi4"}
    one, two = _greedy(1, model, **options), _greedy(2, model, **options)
    assert two == one
    assert two[1] == one[0][0] and two[2] == 0  # 30-token prompts: no whole group to reuse


def test_speculative_verify_passes_run_over_two_ranks(llama_dir: Path) -> None:
    """n-gram speculation's verify passes (several logits rows per request) replay on
    every rank: the same greedy tokens as one rank without speculation."""
    model = str(llama_dir)
    one = _greedy(1, model, dtype="float32")
    options = {"dtype": "float32", "speculative": "ngram", "speculative_adaptive": False}
    with Engine(model_path=model, tp_size=2, max_total_tokens=2048, **options) as engine:
        outputs = engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)
        assert [r["output_ids"] for r in outputs] == one[0]
        assert engine.get_stats().speculative.verify_rows > 0


def test_a_dead_rank_stops_the_engine(llama_dir: Path) -> None:
    engine = Engine(model_path=str(llama_dir), tp_size=2, max_total_tokens=1024, dtype="float32")
    try:
        engine.generate(input_ids=PROMPTS[0], sampling_params=GREEDY)
        rank = engine._rt.runner.tensor_parallel.processes[0]  # type: ignore[union-attr]
        rank.popen.kill()
        deadline = time.monotonic() + 30
        while engine.failure is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "rank 1's process exited with code -9" in str(engine.failure)
        with pytest.raises(EngineStoppedError):
            engine.generate(input_ids=PROMPTS[1], sampling_params=GREEDY)
    finally:
        engine.shutdown()


def test_serve_exits_non_zero_when_a_rank_dies(llama_dir: Path) -> None:
    model = llama_dir
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "radixlm.runtime.entrypoints.cli", "serve", "--tp", "2",
         "--model-path", str(model), "--port", str(port), "--max-total-tokens", "1024",
         "--dtype", "float32"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url)
        body = {"input_ids": PROMPTS[0], "sampling_params": GREEDY}
        assert httpx.post(f"{url}/generate", json=body, timeout=60).status_code == 200
        ranks = [
            p for p in psutil.Process(server.pid).children()
            if "radixlm.runtime.distributed.ranks" in " ".join(p.cmdline())
        ]  # fmt: skip
        assert len(ranks) == 1
        os.kill(ranks[0].pid, signal.SIGKILL)
        code = server.wait(timeout=60)
        _, stderr = server.communicate(timeout=10)
        assert code == 1
        assert "rank 1's process exited with code -9" in stderr
        assert "the server exits" in stderr
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(timeout=10)


@pytest.mark.e2e
def test_default_model_over_two_ranks() -> None:
    """SmolLM2-135M: 9 query heads over 3 KV heads (6 + 3 per rank), tied embeddings."""
    options = {"dtype": "float32"}
    assert _greedy(2, None, **options) == _greedy(1, None, **options)


TEXT = (
    "The radix tree keeps every prefix a request computed, so the next request that "
    "starts the same way reuses its keys and values instead of computing them again."
)


def _prompt_logprobs(tp_size: int) -> tuple[list[float], list[int]]:
    """Each position's logprob of the sentence's next token, and its most likely one.
    On one rank as on two, torch's products (``cpu_layer_kernels=False``): one rank's
    own kernels round the products' inputs to 8 bits (VNNI dot products), a sharded
    rank's do not, and the test is about the sharding."""
    options = {"quantization": "gguf", "max_total_tokens": 1024, "cpu_layer_kernels": False}
    with Engine(tp_size=tp_size, **options) as engine:
        out = engine.generate(TEXT, {"max_new_tokens": 1}, return_logprob=True,
                              logprob_start_len=0, top_logprobs_num=1)  # fmt: skip
        info = out["meta_info"]
        chosen = [entry[0] for entry in info["input_token_logprobs"][1:]]
        return chosen, [top[0][1] for top in info["input_top_logprobs"][1:]]


@pytest.mark.e2e
def test_default_model_gguf_codes_over_two_ranks() -> None:
    """The default model's Q4_1 file, its codes cut on whole groups. Its activations
    are bfloat16, so each rank's partial sums are rounded before they are added: the
    two agree as two bfloat16 summation orders do, not bit for bit (measured: at most
    0.115 nats apart, 0.044 on average; one position's two best tokens tie exactly)."""
    (one, best_one), (two, best_two) = _prompt_logprobs(1), _prompt_logprobs(2)
    assert len(one) == len(two) > 20
    gaps = [abs(a - b) for a, b in zip(one, two)]
    assert max(gaps) < 0.25 and sum(gaps) / len(gaps) < 0.1
    assert sum(a == b for a, b in zip(best_one, best_two)) >= 0.9 * len(best_one)


def test_ranks_span_nodes(llama_dir: Path) -> None:
    """``--nnodes 2``: node 1 (here a second process on this machine) runs rank 1 only,
    joins node 0's rendezvous at ``--dist-init-addr`` and exits 0 when node 0 stops."""
    model = llama_dir
    port, rendezvous = free_port(), f"127.0.0.1:{free_port()}"
    common = [
        "--tp",
        "2",
        "--nnodes",
        "2",
        "--dist-init-addr",
        rendezvous,
        "--model-path",
        str(model),
        "--max-total-tokens",
        "1024",
        "--dtype",
        "float32",
    ]
    cli = [sys.executable, "-m", "radixlm.runtime.entrypoints.cli", "serve"]
    node1 = subprocess.Popen([*cli, *common, "--node-rank", "1"], stderr=subprocess.DEVNULL)
    node0 = subprocess.Popen([*cli, *common, "--node-rank", "0", "--port", str(port)],
                             stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        # one process's tokens, computed while the nodes start
        with Engine(model_path=str(model), max_total_tokens=1024, dtype="float32") as engine:
            alone = engine.generate(input_ids=PROMPTS[0], sampling_params=GREEDY)
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url)
        body = {"input_ids": PROMPTS[0], "sampling_params": GREEDY}
        reply = httpx.post(f"{url}/generate", json=body, timeout=60).json()
        assert reply["output_ids"] == alone["output_ids"]
        node0.send_signal(signal.SIGTERM)
        assert node0.wait(timeout=60) == 0
        assert node1.wait(timeout=60) == 0
    finally:
        for node in (node0, node1):
            if node.poll() is None:
                node.kill()
                node.wait(timeout=10)


def _wait_healthy(url: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not become healthy in {timeout_s} s")
