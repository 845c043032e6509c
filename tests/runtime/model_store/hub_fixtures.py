"""The tests' hub: a tiny random Llama repository (two revisions), a smaller one of its
vocabulary (a draft), a gated copy, a repository of ``.bin`` weights, a GGUF repository
of three quantizations and one of a GGUF split into files, served on 127.0.0.1 to the
real ``huggingface_hub`` client (its endpoint, cache and offline switch pointed at the
test's own, as HF_ENDPOINT / HF_HUB_CACHE / HF_HUB_OFFLINE would)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from radixlm.runtime.models import write_random_model
from tests.runtime.model_store.loopback_hub import HubRepo, LoopbackHub

__all__ = ["CONFIG", "TOKEN", "HubSetup", "point_client_at", "serving_names", "tiny_hub"]

CONFIG = {
    "vocab_size": 96,
    "hidden_size": 64,
    "intermediate_size": 112,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}
DRAFT_CONFIG = {**CONFIG, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1}
TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} </s> {% endfor %}"
    "{% if add_generation_prompt %}<assistant> {% endif %}"
)
TOKEN = "hf_granted"
# Files a repository holds that serving does not need.
EXTRAS = {
    "README.md": b"# tiny\n",
    ".gitattributes": b"*.safetensors filter=lfs\n",
    "pytorch_model.bin": b"not needed: the safetensors are there",
    "original/consolidated.pth": b"not needed either",
    "onnx/model.onnx": b"nor this",
}


@dataclass(frozen=True)
class HubSetup:
    hub: LoopbackHub
    local: Path  # the tiny model's own directory (main's files)
    local_v1: Path  # the files of tag v1 (other weights)
    cache: Path  # HF_HUB_CACHE
    main_sha: str
    v1_sha: str


def serving_names(directory: Path) -> set[str]:
    """The files of a random model's directory serving reads (all of them)."""
    return {p.name for p in directory.iterdir() if p.is_file()}


def _tiny(directory: Path, seed: int, config: dict | None = None) -> Path:
    write_random_model(directory, config or CONFIG, torch.float32, seed=seed)
    config_path = directory / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text())
    tokenizer_config["chat_template"] = TEMPLATE
    config_path.write_text(json.dumps(tokenizer_config, indent=1))
    return directory


def _gguf_files(root: Path) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """Three quantizations of a tiny Llama, named as llama.cpp's repositories name them;
    and a repository's files holding its Q8_0 split into three (in a folder, as large
    models' repositories hold them) beside a whole Q4_0."""
    from gguf import GGMLQuantizationType as Q

    from tests.runtime.model_store.gguf_writer import write_gguf
    from tests.runtime.models.helpers import build_hf_model, save_hf

    checkpoint = save_hf(build_hf_model("llama", intermediate_size=128), root / "hf")
    files = {}
    for kind in (Q.F32, Q.Q8_0, Q.Q4_0):
        path = write_gguf(checkpoint, root / f"tiny-{kind.name}.gguf", kind)
        files[path.name] = path.read_bytes()
    (root / "Q8_0").mkdir()
    write_gguf(checkpoint, root / "Q8_0" / "tiny-Q8_0.gguf", Q.Q8_0, split_max_tensors=8)
    split = {f"Q8_0/{p.name}": p.read_bytes() for p in sorted((root / "Q8_0").iterdir())}
    assert len(split) == 3, sorted(split)
    return files, {**split, "tiny-Q4_0.gguf": files["tiny-Q4_0.gguf"]}


def point_client_at(monkeypatch: pytest.MonkeyPatch, endpoint: str, cache: Path) -> None:
    """What HF_ENDPOINT and HF_HUB_CACHE do, for a client already imported (it reads
    them once); no token from the environment or HF_HOME, offline mode off."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(
        constants,
        "HUGGINGFACE_CO_URL_TEMPLATE",
        endpoint + "/{repo_id}/resolve/{revision}/{filename}",
    )
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(cache / "no-token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(cache / "no-stored-tokens"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)


@pytest.fixture(scope="module")
def hub_repos(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, HubRepo], Path, Path]:
    root = tmp_path_factory.mktemp("hub")
    local, local_v1 = _tiny(root / "main", seed=1), _tiny(root / "v1", seed=2)
    tiny = HubRepo()
    tiny.add_commit({**HubRepo.files_of(local_v1), **EXTRAS}, ref="v1")
    tiny.add_commit({**HubRepo.files_of(local), **EXTRAS}, ref="main")
    gated = HubRepo(token=TOKEN)
    gated.add_commit(HubRepo.files_of(local))
    legacy = HubRepo()
    legacy.add_commit({"config.json": b"{}", "pytorch_model.bin": b"weights", "README.md": b""})
    gguf_files, split_files = _gguf_files(root / "gguf")
    ggufs = HubRepo()
    ggufs.add_commit({**gguf_files, "README.md": b"# GGUF\n"})
    split_ggufs = HubRepo()
    split_ggufs.add_commit(split_files)
    draft = HubRepo()  # a smaller model of the same vocabulary: a draft for tiny
    draft.add_commit(HubRepo.files_of(_tiny(root / "draft", seed=9, config=DRAFT_CONFIG)))
    repos = {
        "tiny-org/tiny": tiny,
        "tiny-org/tiny-draft": draft,
        "tiny-org/gated": gated,
        "tiny-org/legacy": legacy,
        "tiny-org/tiny-GGUF": ggufs,
        "tiny-org/split-GGUF": split_ggufs,
    }
    return repos, local, local_v1


@pytest.fixture
def tiny_hub(hub_repos, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubSetup]:
    """The hub running, the client pointed at it, an empty cache of the test's own."""
    repos, local, local_v1 = hub_repos
    cache = tmp_path / "hf-cache"
    with LoopbackHub(repos) as hub:
        point_client_at(monkeypatch, hub.url, cache)
        tiny = repos["tiny-org/tiny"]
        yield HubSetup(hub, local, local_v1, cache, tiny.refs["main"], tiny.refs["v1"])
