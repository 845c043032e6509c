"""The default-model store: pull, GGUF -> HF conversion, and model-dir resolution.

The conversion is checked against transformers' own GGUF loader (an independent dequantizer
and tokenizer builder), on the real pulled model. In CI the set-up pulls it first.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch

from radixlm.runtime.errors import ModelLoadError, ModelNotFoundError
from radixlm.runtime.model_store import (
    cache_root,
    convert_gguf_to_hf,
    default_gguf_path,
    default_model_dir,
    pull_default_model,
    resolve_model_dir,
)

# Set before transformers is first imported (lazily, in the fixtures): never reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

_NUM_NEW_TOKENS = 24
_CHAT = [{"role": "user", "content": "What is the capital of France?"}]
_TEXTS = [
    "Hello, world!",
    "12345",
    "def add(a, b):\n    return a + b  # sum\n",
    "   leading spaces",
    "line one\n\nline three\r\n",
    "你好，世界",
    "🙂👍🏽",
    "<|im_start|>user\nhi<|im_end|>\n",
]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return pull_default_model(progress=False)


@pytest.fixture(scope="module")
def gguf_file(model_dir: Path) -> Path:
    return default_gguf_path()


@pytest.fixture(scope="module")
def our_model(model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def gguf_model(gguf_file: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32
    ).eval()


@pytest.fixture(scope="module")
def our_tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def gguf_tokenizer(gguf_file: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)


def _greedy(model: Any, input_ids: torch.Tensor) -> list[int]:
    # eos/pad given explicitly: the two loaders derive different generation configs. EOS is held
    # back (min_new_tokens) so a short chat answer still compares all the tokens asked for.
    output = model.generate(
        input_ids,
        do_sample=False,
        min_new_tokens=_NUM_NEW_TOKENS,
        max_new_tokens=_NUM_NEW_TOKENS,
        eos_token_id=2,
        pad_token_id=2,
    )
    return output[0, input_ids.shape[1] :].tolist()


# --- conversion against transformers' GGUF loader ------------------------------------------------


@pytest.mark.e2e
def test_weights_equal_transformers_dequantization(our_model: Any, gguf_model: Any) -> None:
    ours, theirs = our_model.state_dict(), gguf_model.state_dict()
    assert sorted(ours) == sorted(theirs)
    for name, weight in ours.items():
        assert torch.equal(weight, theirs[name]), name


@pytest.mark.e2e
def test_greedy_generation_matches_gguf_model(
    our_model: Any, gguf_model: Any, our_tokenizer: Any
) -> None:
    chat = our_tokenizer.apply_chat_template(_CHAT, tokenize=False, add_generation_prompt=True)
    prompts = ["The capital of France is", "def fibonacci(n):\n", chat]
    for prompt in prompts:
        input_ids = our_tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            ours = _greedy(our_model, input_ids)
            theirs = _greedy(gguf_model, input_ids)
        assert len(ours) == _NUM_NEW_TOKENS
        assert ours == theirs, prompt


@pytest.mark.e2e
def test_tokenizer_encodes_like_gguf_tokenizer(our_tokenizer: Any, gguf_tokenizer: Any) -> None:
    for text in _TEXTS:
        assert our_tokenizer.encode(text) == gguf_tokenizer.encode(text), text
    assert our_tokenizer.encode("<|im_start|>") == [1]
    assert our_tokenizer.decode(our_tokenizer.encode(_TEXTS[6])) == _TEXTS[6]


@pytest.mark.e2e
def test_digits_are_split_one_by_one_like_llama_cpp(our_tokenizer: Any) -> None:
    # llama.cpp's "smollm" pre-tokenizer isolates each digit before the GPT-2 split, so the two
    # spaces stay one token. (transformers' GGUF tokenizer lacks that step: it gives Ġ, Ġ, 1, 2.)
    tokens = our_tokenizer.convert_ids_to_tokens(our_tokenizer.encode("  12"))
    assert tokens == ["ĠĠ", "1", "2"]


@pytest.mark.e2e
def test_chat_template_renders_like_gguf(our_tokenizer: Any, gguf_tokenizer: Any) -> None:
    messages = [{"role": "system", "content": "Be brief."}, *_CHAT]
    for conversation in (_CHAT, messages):
        ours = our_tokenizer.apply_chat_template(
            conversation, tokenize=False, add_generation_prompt=True
        )
        theirs = gguf_tokenizer.apply_chat_template(
            conversation, tokenize=False, add_generation_prompt=True
        )
        assert ours == theirs
    assert ours.endswith("<|im_start|>assistant\n")


# --- pulling -----------------------------------------------------------------------------------


@pytest.mark.e2e
def test_second_pull_touches_nothing(model_dir: Path) -> None:
    before = {path.name: path.stat().st_mtime_ns for path in model_dir.iterdir()}
    start = time.perf_counter()
    again = pull_default_model(progress=False)
    elapsed = time.perf_counter() - start
    assert again == model_dir == default_model_dir()
    assert {path.name: path.stat().st_mtime_ns for path in model_dir.iterdir()} == before
    assert elapsed < 0.5


def test_cache_root_follows_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXLM_CACHE_DIR", str(tmp_path))
    assert cache_root() == tmp_path
    assert default_model_dir() == tmp_path / "models" / "SmolLM2-135M-Instruct"


def test_failed_conversion_leaves_no_model_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A GGUF already in the cache is converted without downloading; this one is rejected.
    monkeypatch.setenv("RADIXLM_CACHE_DIR", str(tmp_path))
    default_gguf_path().parent.mkdir(parents=True)
    _write_tiny_gguf(default_gguf_path(), arch="gpt2")
    with pytest.raises(ModelLoadError, match="gpt2"):
        pull_default_model(progress=False)
    assert list((tmp_path / "models").iterdir()) == []


# --- resolving and rejecting -------------------------------------------------------------------


def test_resolve_missing_dir_names_path(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(ModelNotFoundError, match=re.escape(str(missing))) as info:
        resolve_model_dir(missing)
    assert isinstance(info.value, ValueError)


def test_resolve_dir_without_config_names_path(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelLoadError, match="config.json") as info:
        resolve_model_dir(str(tmp_path))
    assert str(tmp_path) in str(info.value)
    assert isinstance(info.value, ValueError)


def test_resolve_default_when_not_pulled_says_how(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RADIXLM_CACHE_DIR", str(tmp_path))
    with pytest.raises(ModelNotFoundError, match="radixlm pull"):
        resolve_model_dir(None)


def test_resolve_accepts_a_model_dir(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model_dir(tmp_path) == tmp_path


def _write_tiny_gguf(path: Path, arch: str) -> None:
    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_non_llama_gguf_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    _write_tiny_gguf(path, arch="gpt2")
    with pytest.raises(ModelLoadError, match="gpt2"):
        convert_gguf_to_hf(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()
