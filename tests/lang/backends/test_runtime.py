"""``Runtime``'s own behaviour: a model named by hub id, fetched from a hub on 127.0.0.1
(tests/runtime/model_store/loopback_hub.py) by the real ``huggingface_hub``. (Every DSL
program test runs through it too: the ``backend`` fixture in tests/lang/conftest.py.)"""

from __future__ import annotations

import radixlm as sgl
from radixlm.runtime.entrypoints.engine import Engine
from tests.runtime.model_store.hub_fixtures import hub_repos, point_client_at  # noqa: F401
from tests.runtime.model_store.loopback_hub import LoopbackHub

ENGINE_OPTIONS = {
    "max_total_tokens": 1024,
    "cpu_layer_kernels": False,
    "attention_backend": "torch",
    "device": "cpu",
    "dtype": "float32",
}


@sgl.function
def continue_words(s):
    s += "w5 w6 w7" + sgl.gen("more", max_tokens=6, temperature=0)


def test_a_runtime_on_a_hub_id_runs_a_program_as_on_the_local_directory(
    hub_repos,  # noqa: F811
    tmp_path,
    monkeypatch,
) -> None:
    repos, local, _ = hub_repos
    with Engine(model_path=str(local), **ENGINE_OPTIONS) as engine:
        expected = engine.generate("w5 w6 w7", {"max_new_tokens": 6, "temperature": 0})["text"]
    with LoopbackHub(repos) as hub:
        point_client_at(monkeypatch, hub.url, tmp_path / "hf-cache")
        with sgl.Runtime(model_path="tiny-org/tiny", **ENGINE_OPTIONS) as runtime:
            state = continue_words.run(backend=runtime)
            assert runtime.get_server_info()["model_path"] == "tiny-org/tiny"
    assert expected and state["more"] == expected
