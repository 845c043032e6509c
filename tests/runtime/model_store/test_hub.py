"""Models by hub id, fetched by the real ``huggingface_hub`` client from a hub on
127.0.0.1 (tests/runtime/model_store/loopback_hub.py) into a cache of the test's own."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixlm.runtime.errors import ModelLoadError, ModelNotFoundError
from radixlm.runtime.model_store import resolve_model_source
from radixlm.runtime.model_store.hub import (
    HubId,
    gguf_parts,
    parse_hub_id,
    pick_gguf,
    serving_files,
)
from tests.runtime.model_store.hub_fixtures import TOKEN, HubSetup, serving_names


def _snapshot(setup: HubSetup, repo: str, sha: str) -> Path:
    return setup.cache / f"models--{repo.replace('/', '--')}" / "snapshots" / sha


# --- names ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("meta-llama/Llama-3.2-1B-Instruct", HubId("meta-llama/Llama-3.2-1B-Instruct")),
        ("bartowski/Qwen2.5-0.5B-GGUF:Q4_K_M", HubId("bartowski/Qwen2.5-0.5B-GGUF", "Q4_K_M")),
        ("./models/tiny", None),
        ("/abs/tiny", None),
        ("org/name/sub", None),
        ("~/tiny", None),
        ("org/../etc", None),
        ("tiny.gguf", None),
    ],
)
def test_a_hub_id_is_org_slash_name_with_an_optional_quantization(text, expected) -> None:
    assert parse_hub_id(text) == expected


def test_serving_needs_the_safetensors_configs_and_tokenizer_only() -> None:
    names = [
        "config.json", "generation_config.json", "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors", "model.safetensors.index.json",
        "pytorch_model.bin", "tokenizer.json", "tokenizer_config.json", "tokenizer.model",
        "special_tokens_map.json", "chat_template.jinja", "README.md", ".gitattributes",
        "original/consolidated.pth", "onnx/model.onnx", "model.Q4_K_M.gguf",
    ]  # fmt: skip
    assert serving_files(names) == [
        "chat_template.jinja", "config.json", "generation_config.json",
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
        "model.safetensors.index.json", "special_tokens_map.json", "tokenizer.json",
        "tokenizer.model", "tokenizer_config.json",
    ]  # fmt: skip
    # .bin weights only when there are no safetensors
    assert serving_files(["config.json", "pytorch_model.bin", "README.md"]) == [
        "config.json",
        "pytorch_model.bin",
    ]


def test_a_quantization_picks_the_one_file_whose_name_carries_it() -> None:
    names = ["m-Q4_K_M.gguf", "m-Q4_K_S.gguf", "m.Q8_0.gguf", "IQ4_XS/m-IQ4_XS.gguf"]
    assert pick_gguf(HubId("o/m-GGUF", "q4_k_m"), names) == "m-Q4_K_M.gguf"
    assert pick_gguf(HubId("o/m-GGUF", "Q8_0"), names) == "m.Q8_0.gguf"
    assert pick_gguf(HubId("o/m-GGUF", "IQ4_XS"), names) == "IQ4_XS/m-IQ4_XS.gguf"
    assert pick_gguf(HubId("o/m-GGUF"), names, gguf_file="m.Q8_0.gguf") == "m.Q8_0.gguf"
    listing = "IQ4_XS/m-IQ4_XS.gguf, m-Q4_K_M.gguf, m-Q4_K_S.gguf, m.Q8_0.gguf"
    with pytest.raises(ModelNotFoundError) as missing:
        pick_gguf(HubId("o/m-GGUF", "Q4_K"), names)
    assert str(missing.value) == (
        f"o/m-GGUF has no GGUF file of quantization Q4_K; its files: {listing}"
    )
    with pytest.raises(ModelLoadError) as unnamed:
        pick_gguf(HubId("o/m-GGUF"), names)
    assert str(unnamed.value) == (
        "o/m-GGUF holds 4 GGUF files: name one quantization as o/m-GGUF:QUANT "
        f"(e.g. :Q4_K_M) or pass --gguf-file; its files: {listing}"
    )
    with pytest.raises(ModelLoadError) as ambiguous:
        pick_gguf(HubId("o/m-GGUF", "Q8_0"), [*names, "other.Q8_0.gguf"])
    assert str(ambiguous.value) == (
        "o/m-GGUF:Q8_0 is ambiguous: 2 files carry Q8_0 (m.Q8_0.gguf, other.Q8_0.gguf); "
        "pass --gguf-file with one of them"
    )


def test_a_gguf_split_into_files_is_picked_as_one_by_its_first_part() -> None:
    parts = [f"Q8_0/m-Q8_0-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    names = [*parts, "m-Q4_0.gguf", "README.md"]
    assert pick_gguf(HubId("o/m-GGUF", "Q8_0"), names) == parts[0]
    assert pick_gguf(HubId("o/m-GGUF"), names, gguf_file=parts[2]) == parts[0]
    assert pick_gguf(HubId("o/m-GGUF"), parts) == parts[0]  # the only model there
    assert gguf_parts(HubId("o/m-GGUF"), parts[0], names) == parts
    assert gguf_parts(HubId("o/m-GGUF"), "m-Q4_0.gguf", names) == ["m-Q4_0.gguf"]
    with pytest.raises(ModelLoadError) as unnamed:
        pick_gguf(HubId("o/m-GGUF"), names)
    assert str(unnamed.value) == (
        "o/m-GGUF holds 2 GGUF files: name one quantization as o/m-GGUF:QUANT "
        f"(e.g. :Q4_K_M) or pass --gguf-file; its files: {parts[0]}, m-Q4_0.gguf"
    )
    with pytest.raises(ModelNotFoundError) as missing:
        gguf_parts(HubId("o/m-GGUF"), parts[0], [parts[0], parts[2]])
    assert str(missing.value) == (
        f"o/m-GGUF holds {parts[0]}, part of a GGUF split into 3 files, without {parts[1]}"
    )


# --- fetching ---------------------------------------------------------------------------------


def test_a_hub_id_fetches_only_what_serving_needs_once(tiny_hub: HubSetup) -> None:
    source = resolve_model_source("tiny-org/tiny")
    snapshot = _snapshot(tiny_hub, "tiny-org/tiny", tiny_hub.main_sha)
    assert source.path == source.model_dir == snapshot
    assert source.gguf is None and source.name == "tiny-org/tiny"
    assert sorted(tiny_hub.hub.fetched()) == sorted(serving_names(tiny_hub.local))
    for name in serving_names(tiny_hub.local):
        assert (snapshot / name).read_bytes() == (tiny_hub.local / name).read_bytes()
    tiny_hub.hub.clear()
    assert resolve_model_source("tiny-org/tiny") == source
    assert tiny_hub.hub.fetched() == []  # the second start downloads nothing


def test_a_revision_fetches_that_tag_or_commit(tiny_hub: HubSetup) -> None:
    tagged = resolve_model_source("tiny-org/tiny", revision="v1")
    assert tagged.model_dir == _snapshot(tiny_hub, "tiny-org/tiny", tiny_hub.v1_sha)
    weights = "model-00001-of-00003.safetensors"
    assert (tagged.model_dir / weights).read_bytes() == (tiny_hub.local_v1 / weights).read_bytes()
    by_commit = resolve_model_source("tiny-org/tiny", revision=tiny_hub.v1_sha)
    assert by_commit.model_dir == tagged.model_dir
    with pytest.raises(ModelNotFoundError) as missing:
        resolve_model_source("tiny-org/tiny", revision="v9")
    assert str(missing.value) == (
        f"tiny-org/tiny has no revision 'v9' on {tiny_hub.hub.url}: name one of its "
        "branches, tags or commits with --revision"
    )


def test_bin_weights_are_fetched_when_a_repository_has_no_safetensors(tiny_hub) -> None:
    resolve_model_source("tiny-org/legacy")
    assert sorted(tiny_hub.hub.fetched()) == ["config.json", "pytorch_model.bin"]


def test_a_missing_model_is_a_404_that_says_what_to_do(tiny_hub: HubSetup) -> None:
    with pytest.raises(ModelNotFoundError) as missing:
        resolve_model_source("tiny-org/nope")
    assert str(missing.value) == (
        f"tiny-org/nope is not on {tiny_hub.hub.url} (404), nor a local path: check the "
        "name (ORG/NAME), or give a model directory or a .gguf file"
    )


def test_a_gated_model_needs_a_token_with_access(tiny_hub, monkeypatch) -> None:
    url = tiny_hub.hub.url
    with pytest.raises(ModelLoadError) as no_token:
        resolve_model_source("tiny-org/gated")
    assert str(no_token.value) == (
        f"tiny-org/gated: {url} asks for a token (401): the model is gated or private (or "
        "its name is misspelled); set HF_TOKEN to a token of an account with access "
        "(https://huggingface.co/settings/tokens)"
    )
    monkeypatch.setenv("HF_TOKEN", "hf_someone_else")
    with pytest.raises(ModelLoadError) as refused:
        resolve_model_source("tiny-org/gated")
    assert str(refused.value) == (
        f"tiny-org/gated: {url} refuses the token given (403): accept the model's terms at "
        f"{url}/tiny-org/gated with the account of HF_TOKEN, or use a token with read "
        "access to it"
    )
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert resolve_model_source("tiny-org/gated").name == "tiny-org/gated"
    assert all(
        r.headers.get("authorization") == f"Bearer {TOKEN}" for r in tiny_hub.hub.requests[-3:]
    )


def test_offline_serves_from_the_cache_and_says_when_it_is_not_there(tiny_hub, monkeypatch):
    from huggingface_hub import constants

    online = resolve_model_source("tiny-org/tiny")
    tiny_hub.hub.clear()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert resolve_model_source("tiny-org/tiny") == online
    assert tiny_hub.hub.requests == []  # not one request
    with pytest.raises(ModelNotFoundError) as missing:
        resolve_model_source("tiny-org/tiny", revision="v1")
    assert str(missing.value) == (
        f"tiny-org/tiny (revision v1) is not in the hub cache ({tiny_hub.cache}) and "
        "HF_HUB_OFFLINE is set: download it once where the hub can be reached "
        "(`radixlm pull tiny-org/tiny`), or give a local path"
    )


def test_an_unreachable_hub_serves_from_the_cache(tiny_hub, monkeypatch) -> None:
    from huggingface_hub import constants

    online = resolve_model_source("tiny-org/tiny")
    dead = "http://127.0.0.1:9"  # the discard port: nothing listens
    monkeypatch.setattr(constants, "ENDPOINT", dead)
    assert resolve_model_source("tiny-org/tiny") == online
    with pytest.raises(ModelNotFoundError, match=r"^tiny-org/other \(revision main\) is not in"):
        resolve_model_source("tiny-org/other")


def test_a_download_cut_short_resumes_where_it_stopped(tiny_hub, monkeypatch) -> None:
    """The connection drops mid-file: the client asks for the rest (a Range from the
    last whole chunk it wrote: 4 KiB chunks here, 10 MB by default), not the whole file."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 4096)
    weights = "model-00001-of-00003.safetensors"
    data = (tiny_hub.local / weights).read_bytes()
    tiny_hub.hub.cut_after[weights] = len(data) // 2
    source = resolve_model_source("tiny-org/tiny")
    assert (source.model_dir / weights).read_bytes() == data
    gets = [r for r in tiny_hub.hub.requests if r.path.endswith(weights) and r.method == "GET"]
    resumed_at = len(data) // 2 // 4096 * 4096
    assert [r.headers.get("range") for r in gets] == [None, f"bytes={resumed_at}-"]


def test_a_gguf_repository_serves_the_quantization_asked_for(tiny_hub: HubSetup) -> None:
    source = resolve_model_source("tiny-org/tiny-GGUF:Q8_0")
    snapshot = _snapshot(tiny_hub, "tiny-org/tiny-GGUF", _sha(tiny_hub, "tiny-org/tiny-GGUF"))
    assert source.gguf == source.path == snapshot / "tiny-Q8_0.gguf"
    assert source.name == "tiny-org/tiny-GGUF:Q8_0"
    assert (source.model_dir / "config.json").is_file()  # read from the GGUF
    assert tiny_hub.hub.fetched() == ["tiny-Q8_0.gguf"]
    by_name = resolve_model_source("tiny-org/tiny-GGUF", gguf_file="tiny-Q4_0.gguf")
    assert by_name.gguf == snapshot / "tiny-Q4_0.gguf"
    with pytest.raises(ModelNotFoundError) as missing:
        resolve_model_source("tiny-org/tiny-GGUF:Q5_K_M")
    assert str(missing.value) == (
        "tiny-org/tiny-GGUF has no GGUF file of quantization Q5_K_M; its files: "
        "tiny-F32.gguf, tiny-Q4_0.gguf, tiny-Q8_0.gguf"
    )


def test_a_gguf_split_into_files_is_fetched_whole(tiny_hub: HubSetup, monkeypatch) -> None:
    from huggingface_hub import constants

    source = resolve_model_source("tiny-org/split-GGUF:Q8_0")
    snapshot = _snapshot(tiny_hub, "tiny-org/split-GGUF", _sha(tiny_hub, "tiny-org/split-GGUF"))
    parts = [f"Q8_0/tiny-Q8_0-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert source.gguf == source.path == snapshot / parts[0]
    assert (source.model_dir / "config.json").is_file()  # read from the first part
    assert tiny_hub.hub.fetched() == parts
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert resolve_model_source("tiny-org/split-GGUF:Q8_0") == source


def _sha(setup: HubSetup, repo: str) -> str:
    return setup.hub.repos[repo].refs["main"]
