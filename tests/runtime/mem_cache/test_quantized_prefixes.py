"""The radix cache shares quantized prefixes as it shares float ones: an engine on a
random-weight model with an int8 (or fp8) KV pool hits the cache exactly where one
with a float pool does, and a warm run's greedy outputs equal the cold run's. A KIVI
pool's cache shares whole key groups of 32 tokens: its hits are the float pool's cut
to whole groups, and warm runs still equal cold ones, served one by one or together."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from radixlm.runtime.entrypoints.engine import Engine
from radixlm.runtime.models import write_random_model
from tests.conftest import assert_no_leaks

CONFIG: dict[str, Any] = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
}
GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
SHARED = " ".join(f"w{(7 * i) % 120 + 3}" for i in range(30))
# one shared prefix, then a branch each; the last repeats the first
PROMPTS = [SHARED + " w5 w9", SHARED + " w11", SHARED + " w5 w40 w41", SHARED + " w5 w9"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_model(tmp_path_factory.mktemp("tiny"), CONFIG, torch.float32)


def _runs(
    model_dir: Path, kv_cache_dtype: str, prompts: list[str] = PROMPTS, **options: Any
) -> tuple[list[dict], list[dict]]:
    """The prompts one after another, twice (cold, then warm) in one engine."""
    with Engine(
        model_path=str(model_dir),
        dtype="float32",
        max_total_tokens=1024,
        kv_cache_dtype=kv_cache_dtype,
        **options,
    ) as engine:
        assert engine.get_stats().placement.kv_format == (
            "float32" if kv_cache_dtype == "auto" else kv_cache_dtype
        )
        cold = [engine.generate(p, GREEDY) for p in prompts]
        warm = [engine.generate(p, GREEDY) for p in prompts]
        assert_no_leaks(engine)
    return cold, warm


def _cached(outputs: list[dict]) -> list[int]:
    return [o["meta_info"]["cached_tokens"] for o in outputs]


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "fp8_e4m3"])
def test_a_quantized_pool_hits_the_cache_as_a_float_one(model_dir: Path, kv_cache_dtype: str):
    float_cold, float_warm = _runs(model_dir, "auto")
    cold, warm = _runs(model_dir, kv_cache_dtype)
    assert _cached(cold) == _cached(float_cold) and _cached(warm) == _cached(float_warm)
    assert _cached(cold)[0] == 0 and min(_cached(cold)[1:]) >= 30  # the shared prefix
    assert [o["output_ids"] for o in warm] == [o["output_ids"] for o in cold]
    assert cold[3]["output_ids"] == cold[0]["output_ids"]  # served from the cache


@pytest.fixture(scope="module")
def kivi_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Heads of 32 (KIVI's key groups spread their 64 parameters over 32 slots)."""
    config = {**CONFIG, "hidden_size": 128}
    return write_random_model(tmp_path_factory.mktemp("tiny-kivi"), config, torch.float32)


# a shared prefix of two groups and a half
LONG_SHARED = " ".join(f"w{(11 * i) % 120 + 3}" for i in range(80))
LONG_PROMPTS = [
    LONG_SHARED + " w5 w9",
    LONG_SHARED + " w11",
    LONG_SHARED + " w5 w40",
    LONG_SHARED + " w5 w9",
]


@pytest.mark.parametrize("kv_cache_dtype", ["kivi4", "kivi2"])
def test_a_kivi_pool_shares_whole_groups(kivi_model_dir: Path, kv_cache_dtype: str):
    _, float_warm = _runs(kivi_model_dir, "auto", LONG_PROMPTS)
    cold, warm = _runs(kivi_model_dir, kv_cache_dtype, LONG_PROMPTS, chunked_prefill_size=24)
    group = 32
    assert _cached(cold)[0] == 0 and min(_cached(cold)[1:]) == 2 * group  # the shared groups
    assert _cached(warm) == [n // group * group for n in _cached(float_warm)]
    assert [o["output_ids"] for o in warm] == [o["output_ids"] for o in cold]
    assert cold[3]["output_ids"] == cold[0]["output_ids"]
    # served together: the same tokens as one by one
    with Engine(
        model_path=str(kivi_model_dir),
        dtype="float32",
        max_total_tokens=1024,
        kv_cache_dtype=kv_cache_dtype,
    ) as engine:
        together = engine.generate(LONG_PROMPTS, GREEDY)
        assert_no_leaks(engine)
    assert [o["output_ids"] for o in together] == [o["output_ids"] for o in cold]
