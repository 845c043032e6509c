"""Engines with quantized weights on the real default model: they serve every kind of
request, say what their weights are, and refuse options that cannot work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from radixlm import Engine
from radixlm.runtime.config import ConfigError
from radixlm.runtime.errors import ModelLoadError, ModelNotFoundError
from radixlm.runtime.models import write_random_model
from tests.runtime.models import quantized_checkpoints as qc
from tests.runtime.models.helpers import TINY

PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["city", "population"],
}


@pytest.mark.parametrize(
    ("method", "dtype", "weights", "max_mb"),
    [
        ("int8", "auto", "int8", 140),
        ("int4", "auto", "int4 (group 32)", 100),
        # float32 between the products
        ("int4", "float32", "int4 (group 32)", 100),
        # the GGUF the default model was pulled as (Q4_1; a Q8_0 embedding), as it is
        ("gguf", "auto", "GGUF: int4 x120, int8g x1", 100),
    ],
)
def test_a_quantized_engine_serves_plain_and_constrained_requests(
    default_model_dir, check_no_leaks, method, dtype, weights, max_mb
):
    with Engine(
        model_path=str(default_model_dir),
        quantization=method,
        dtype=dtype,
        max_total_tokens=4096,
    ) as engine:
        stats = engine.get_stats()
        assert stats.placement.weights == weights
        # decode steps of up to 32 rows run whole in C++ over the quantized matrices
        assert stats.cpu_paths.few_row_layers == "kernel"
        assert stats.cpu_paths.elementwise == "kernel"
        greedy = {"temperature": 0, "max_new_tokens": 16}
        assert "Paris" in engine.generate(PROMPT, greedy)["text"]
        # a batch, longer than the packed kernels' rows: prefill dequantizes
        batch = engine.generate([PROMPT, "The capital of France is"] * 20, greedy)
        assert all("Paris" in out["text"] for out in batch[::2])
        constrained = engine.generate(
            PROMPT, {**greedy, "max_new_tokens": 48, "json_schema": json.dumps(SCHEMA)}
        )
        assert set(json.loads(constrained["text"])) == {"city", "population"}
        check_no_leaks(engine)
        assert stats.placement.weight_bytes < max_mb * 1e6  # bf16: 270 MB


@pytest.mark.parametrize(
    ("options", "match"),
    [
        (
            {"quantization": "int4", "quantization_group_size": 128},
            "group size 128 does not divide .* 576",
        ),
        ({"quantization": "int8", "dtype": "float16"}, "take float32 or bfloat16"),
        ({"quantization": "int3"}, "quantization must be one of"),
        ({"quantization": "int4", "quantization_group_size": 48}, "group size must be one of"),
        ({"model_path": "model.gguf", "quantization": "int8"}, "keep the file's own"),
    ],
)
def test_options_that_cannot_work_are_refused_with_the_reason(default_model_dir, options, match):
    with pytest.raises(ConfigError, match=match):
        Engine(**{"model_path": str(default_model_dir), "max_total_tokens": 256, **options})


def test_gguf_serving_needs_a_gguf(tmp_path):
    model_dir = tmp_path / "model"
    write_random_model(model_dir, TINY)
    with pytest.raises(ModelLoadError, match="is no GGUF"):
        Engine(model_path=str(model_dir), quantization="gguf", max_total_tokens=256)
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        Engine(model_path=str(tmp_path / "absent.gguf"), max_total_tokens=256)


@pytest.fixture(scope="module")
def quantized_checkpoints(default_model_dir, tmp_path_factory) -> dict[str, Path]:
    """The default model as the quantized checkpoints people download: AWQ (GEMM,
    groups of 64), GPTQ with act-order (4-bit, groups of 64) and llm-compressor's
    int8 W8A8 (compressed-tensors), each in its library's layout."""
    root = tmp_path_factory.mktemp("quantized")
    int8 = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"}
    tokens = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}
    return {
        "awq": qc.write_awq(default_model_dir, root / "awq", 64, reference=False).path,
        "gptq": qc.write_gptq(
            default_model_dir, root / "gptq", 4, 64, desc_act=True, reference=False
        ).path,
        "w8a8": qc.write_compressed_tensors(
            default_model_dir, root / "w8a8", "int-quantized", int8, tokens, reference=False
        ).path,
    }


@pytest.mark.parametrize(
    ("kind", "weights"),
    [
        ("awq", "AWQ 4-bit, group 64: float x1, int4 x120"),
        ("gptq", "GPTQ 4-bit, group 64, act-order: float x1, int4 x120"),
        ("w8a8", "compressed-tensors int-quantized: float x1, int8g x120"),
    ],
)
def test_a_quantized_checkpoint_serves_with_every_feature(
    quantized_checkpoints, check_no_leaks, kind, weights
):
    """At the file's precision, with the radix cache, a JSON schema and n-gram
    speculation (its greedy tokens those of plain decoding)."""
    path = str(quantized_checkpoints[kind])
    greedy = {"temperature": 0, "max_new_tokens": 24}
    with Engine(model_path=path, max_total_tokens=4096) as engine:
        assert engine.get_stats().placement.weights == weights
        plain = engine.generate(PROMPT, greedy)
        assert "Paris" in plain["text"]
        again = engine.generate(PROMPT, greedy)
        assert again["text"] == plain["text"]
        assert again["meta_info"]["cached_tokens"] >= len(engine.tokenizer.encode(PROMPT)) - 1
        constrained = engine.generate(
            PROMPT, {**greedy, "max_new_tokens": 48, "json_schema": json.dumps(SCHEMA)}
        )
        assert set(json.loads(constrained["text"])) == {"city", "population"}
        check_no_leaks(engine)
    if kind != "awq":  # speculation reads the weights as any pass does: once is enough
        return
    options = {"speculative": "ngram", "speculative_adaptive": False}
    with Engine(model_path=path, max_total_tokens=4096, **options) as engine:
        assert engine.generate(PROMPT, greedy)["output_ids"] == plain["output_ids"]
        assert engine.get_stats().speculative.verify_rows > 0


def test_naming_a_checkpoints_method_checks_it(quantized_checkpoints, default_model_dir):
    with Engine(
        model_path=str(quantized_checkpoints["awq"]), quantization="awq_marlin",
        max_total_tokens=256,
    ) as engine:  # fmt: skip
        assert engine.get_stats().placement.weights.startswith("AWQ")
    with pytest.raises(
        ConfigError, match="quantization 'gptq' asks for such a checkpoint; found AWQ"
    ):
        Engine(
            model_path=str(quantized_checkpoints["awq"]), quantization="gptq", max_total_tokens=256
        )
    with pytest.raises(ConfigError, match="already quantized"):
        Engine(
            model_path=str(quantized_checkpoints["awq"]), quantization="int8", max_total_tokens=256
        )
    with pytest.raises(ConfigError, match="found a float checkpoint"):
        Engine(model_path=str(default_model_dir), quantization="fp8", max_total_tokens=256)
