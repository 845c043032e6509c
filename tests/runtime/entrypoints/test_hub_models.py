"""Engines, servers and the CLI on a model named by hub id, fetched from a hub on
127.0.0.1 (tests/runtime/model_store/loopback_hub.py) by the real ``huggingface_hub``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from radixlm.runtime.entrypoints.engine import Engine
from radixlm.runtime.entrypoints.perplexity import measure_perplexity
from tests.runtime.model_store.hub_fixtures import point_client_at
from tests.runtime.model_store.loopback_hub import LoopbackHub
from tests.servers import running_server

ENGINE_OPTIONS = {
    "max_total_tokens": 1024,
    "cpu_layer_kernels": False,
    "attention_backend": "torch",
    "device": "cpu",
    "dtype": "float32",
}
GREEDY = {"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True}
PROMPT_IDS = [1, 17, 42, 5, 63, 8]
CLI_TIMEOUT_S = 240
CLI_ENGINE_FLAGS = [
    "--max-total-tokens", "1024", "--no-cpu-layer-kernels", "--attention-backend", "torch",
    "--device", "cpu", "--dtype", "float32",
]  # fmt: skip


@pytest.fixture(scope="module")
def hub_engine(hub_repos, tmp_path_factory) -> Iterator[tuple[Engine, LoopbackHub]]:
    """An engine on ``tiny-org/tiny``, as fetched into a fresh cache (the hub stays up,
    the client pointed at it, for the module's tests)."""
    cache = tmp_path_factory.mktemp("hf-cache")
    with LoopbackHub(hub_repos[0]) as hub, pytest.MonkeyPatch.context() as patch:
        point_client_at(patch, hub.url, cache)
        with Engine(model_path="tiny-org/tiny", **ENGINE_OPTIONS) as engine:
            yield engine, hub


@pytest.fixture(scope="module")
def local_engine(hub_repos) -> Iterator[Engine]:
    """An engine on the tiny model's own directory: what a hub id must serve alike."""
    with Engine(model_path=str(hub_repos[1]), **ENGINE_OPTIONS) as engine:
        yield engine


def test_an_engine_on_a_hub_id_decodes_as_on_the_local_directory(hub_engine, local_engine) -> None:
    engine, _ = hub_engine
    expected = local_engine.generate(input_ids=PROMPT_IDS, sampling_params=GREEDY)["output_ids"]
    got = engine.generate(input_ids=PROMPT_IDS, sampling_params=GREEDY)["output_ids"]
    assert len(expected) == 8 and got == expected
    assert engine.model_name == "tiny-org/tiny"


def test_a_draft_model_by_hub_id_changes_no_greedy_token(hub_engine, check_no_leaks) -> None:
    """``speculative_draft_model_path`` a hub id: the draft is fetched as the target is,
    proposes, and greedy tokens equal the target's alone."""
    engine, hub = hub_engine
    prompts = [PROMPT_IDS, [3, 9, 27, 81, 50, 22, 66, 4, 12], [7, 7, 7, 7]]
    params = {**GREEDY, "max_new_tokens": 24}
    want = [engine.generate(input_ids=p, sampling_params=params)["output_ids"] for p in prompts]
    hub.clear()
    spec_options = {"speculative": "draft", "speculative_adaptive": False}
    with Engine(
        model_path="tiny-org/tiny",
        speculative_draft_model_path="tiny-org/tiny-draft",
        **spec_options,
        **ENGINE_OPTIONS,
    ) as spec:
        got = [spec.generate(input_ids=p, sampling_params=params)["output_ids"] for p in prompts]
        stats = spec.get_stats().speculative
        check_no_leaks(spec)
    assert got == want
    assert stats.verify_rows > 0 and set(stats.proposed) == {"draft"}
    draft = hub.repos["tiny-org/tiny-draft"]
    fetched = {r.path.rsplit("/", 1)[1] for r in hub.requests if "/tiny-draft/resolve/" in r.path}
    assert fetched == set(draft.commits[draft.refs["main"]])  # its files, from the hub


@pytest.mark.parametrize(
    ("served_model_name", "model_id"), [(None, "tiny-org/tiny"), ("my-tiny", "my-tiny")]
)
def test_the_server_reports_the_id_typed_or_served_model_name(
    hub_engine, served_model_name, model_id
) -> None:
    engine, _ = hub_engine
    with (
        running_server(engine, served_model_name=served_model_name) as server,
        httpx.Client(base_url=server.base_url, timeout=30) as http,
    ):
        models = http.get("/v1/models").json()
        assert [m["id"] for m in models["data"]] == ["default", model_id]
        assert [m["root"] for m in models["data"]] == [str(engine.model_path)] * 2
        info = http.get("/model_info").json()
        assert (info["model_name"], info["served_model_name"]) == (model_id, model_id)
        assert info["architectures"] == ["LlamaForCausalLM"]
        body = {"model": model_id, "prompt": "w5 w6", "max_tokens": 2, "temperature": 0}
        assert http.post("/v1/completions", json=body).status_code == 200


# One Python process runs several commands (importing torch and transformers costs a
# launch 3-4 s): ``main`` as ``python -m radixlm.runtime.entrypoints.cli`` calls it, each
# command's exit status, stdout and stderr its own. Order the commands so that the one
# whose stderr is compared whole runs first (a warning shows once a process).
_CLI_DRIVER = """
import contextlib, io, json, sys, traceback
from radixlm.runtime.entrypoints.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:
            traceback.print_exc()
            code = 1
    results.append((argv, code, out.getvalue(), err.getvalue()))
sys.__stdout__.write(json.dumps(results))
"""


def _cli(commands: list[list[str]], env: dict[str, str]) -> list[subprocess.CompletedProcess]:
    """``radixlm`` once per argument list in ``commands``, in one fresh process under
    ``env`` (added to this one's)."""
    proc = subprocess.run(
        [sys.executable, "-c", _CLI_DRIVER, json.dumps(commands)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr
    return [subprocess.CompletedProcess(*run) for run in json.loads(proc.stdout)]


def test_pull_and_models_check_by_hub_id_through_the_environment(hub_repos, tmp_path) -> None:
    """HF_ENDPOINT and HF_HUB_CACHE point the CLI at the hub and the cache; with
    HF_HUB_OFFLINE=1, the model checks from the cache and a missing one says so."""
    cache = tmp_path / "hf-cache"
    with LoopbackHub(hub_repos[0]) as hub:
        env = {"HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(cache), "HF_HOME": str(tmp_path)}
        env |= {"HF_HUB_OFFLINE": "0", "HF_TOKEN": ""}
        missing, pulled = _cli([["pull", "tiny-org/nope"], ["pull", "tiny-org/tiny"]], env)
        assert pulled.returncode == 0, pulled.stderr
        sha = hub.repos["tiny-org/tiny"].refs["main"]
        snapshot = cache / "models--tiny-org--tiny" / "snapshots" / sha
        assert pulled.stdout == f"tiny-org/tiny ready: {snapshot}\n"
        assert (missing.returncode, missing.stdout) == (2, "")
        assert missing.stderr == (
            f"radixlm: error: tiny-org/nope is not on {hub.url} (404), nor a local path: "
            "check the name (ORG/NAME), or give a model directory or a .gguf file\n"
        )
        hub.clear()
        offline = {**env, "HF_HUB_OFFLINE": "1"}
        checks = [["models", "--check", "tiny-org/tiny-GGUF:Q8_0"]]
        checks.append(["models", "--check", "tiny-org/tiny"])
        gone, checked = _cli(checks, offline)
        assert checked.returncode == 0, checked.stderr
        assert checked.stdout.startswith("tiny-org/tiny: LlamaForCausalLM, served: 2 layers")
        assert hub.requests == []  # neither command asked the hub
    assert gone.returncode == 2
    assert gone.stderr == (
        f"radixlm: error: tiny-org/tiny-GGUF:Q8_0 (revision main) is not in the hub cache "
        f"({cache}) and HF_HUB_OFFLINE is set: download it once where the hub can be "
        "reached (`radixlm pull tiny-org/tiny-GGUF:Q8_0`), or give a local path\n"
    )


def test_generate_and_perplexity_by_hub_id_print_what_the_local_directory_gives(
    hub_repos, local_engine, tmp_path: Path
) -> None:
    """``radixlm generate`` and ``radixlm perplexity`` on ``--model-path ORG/NAME``
    (HF_ENDPOINT, HF_HUB_CACHE) print what an engine on the model's directory computes."""
    text = tmp_path / "words.txt"
    text.write_text(" ".join(f"w{3 + (i * 7) % 90}" for i in range(100)))
    messages = [{"role": "user", "content": "w5 w6 w7"}]
    prompt = local_engine.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    reply = local_engine.generate(prompt, {"max_new_tokens": 6, "temperature": 0})["text"]
    scored = measure_perplexity(local_engine, text.read_text(), context=16, max_windows=3)
    with LoopbackHub(hub_repos[0]) as hub:
        env = {"HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(tmp_path / "hf-cache")}
        env |= {"HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "0", "HF_TOKEN": ""}
        model = ["--model-path", "tiny-org/tiny", *CLI_ENGINE_FLAGS]
        ppl = ["perplexity", "--text", str(text), "--context", "16", "--max-windows", "3"]
        generate = ["generate", "w5 w6 w7", "--max-new-tokens", "6"]
        generated, perplexity = _cli([[*generate, *model], [*ppl, *model]], env)
    assert generated.returncode == 0, generated.stderr
    assert reply and generated.stdout == f"{reply}\n"
    assert perplexity.returncode == 0, perplexity.stderr
    assert perplexity.stdout == f"{scored.describe()}\n"


def test_a_gguf_repository_quantization_serves_like_its_file(hub_repos, tmp_path: Path) -> None:
    """``ORG/NAME-GGUF:Q8_0`` serves the Q8_0 file, as naming that file's path does; the
    same Q8_0 split into files serves alike (its parts fetched, its first part named)."""
    cache = tmp_path / "hf-cache"
    with LoopbackHub(hub_repos[0]) as hub, pytest.MonkeyPatch.context() as patch:
        point_client_at(patch, hub.url, cache)
        with Engine(model_path="tiny-org/tiny-GGUF:Q8_0", **ENGINE_OPTIONS) as engine:
            got = engine.generate(input_ids=PROMPT_IDS, sampling_params=GREEDY)["output_ids"]
            path = engine.model_path
            assert engine.model_name == "tiny-org/tiny-GGUF:Q8_0"
        assert hub.fetched() == ["tiny-Q8_0.gguf"]
        hub.clear()
        with Engine(model_path="tiny-org/split-GGUF:Q8_0", **ENGINE_OPTIONS) as split:
            assert split.generate(input_ids=PROMPT_IDS, sampling_params=GREEDY)["output_ids"] == got
            assert split.model_path.name == "tiny-Q8_0-00001-of-00003.gguf"
        assert len(hub.fetched()) == 3
    with Engine(model_path=str(path), **ENGINE_OPTIONS) as local:
        assert local.generate(input_ids=PROMPT_IDS, sampling_params=GREEDY)["output_ids"] == got
