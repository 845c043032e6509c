"""The radixlm command on the real default model."""

import json

import pytest

from radixlm.runtime.entrypoints.cli import main
from tests.runtime.models.helpers import TINY


def test_pull_is_idempotent_and_says_where(default_model_dir, capsys):
    assert main(["pull"]) == 0
    assert str(default_model_dir) in capsys.readouterr().out


def test_generate_streams_the_greedy_completion(default_model_dir, engine, capsys):
    argv = [
        "generate",
        "The capital of France is",
        "--raw",
        "--max-new-tokens",
        "8",
        "--model-path",
        str(default_model_dir),
        "--dtype",
        "float32",
    ]
    assert main(argv) == 0
    expected = engine.generate("The capital of France is", {"temperature": 0, "max_new_tokens": 8})
    assert capsys.readouterr().out == expected["text"] + "\n"


def test_bad_sampling_flag_is_refused_before_the_model_loads(capsys):
    """As argparse refuses a value: exit 2, naming the flag and the engine's bound."""
    with pytest.raises(SystemExit) as info:
        main(["generate", "hi", "--max-new-tokens", "-3"])
    assert info.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last == "radixlm generate: error: argument --max-new-tokens: expected >= 0, got -3"


@pytest.mark.parametrize("command", ["serve", "run", "perplexity"])
def test_a_bad_kv_cache_dtype_exits_2_naming_the_flag_and_the_choices(command, capsys):
    with pytest.raises(SystemExit) as info:
        main([command, "--kv-cache-dtype", "int4"])
    assert info.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last == (
        f"radixlm {command}: error: argument --kv-cache-dtype: invalid choice: 'int4' "
        "(choose from 'auto', 'int8', 'fp8_e4m3', 'fp8_e5m2', 'kivi4', 'kivi2')"
    )


def test_bad_engine_flag_value_is_one_clear_line(default_model_dir, capsys):
    argv = ["generate", "hi", "--model-path", str(default_model_dir), "--context-length", "-3"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("radixlm: error:") and "context_length" in err


def test_models_lists_the_served_and_the_refused_architectures(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    served, refused = out.split("refused")
    for name in ("Gemma2ForCausalLM", "Phi3ForCausalLM", "Qwen3MoeForCausalLM", "OlmoeForCausalLM"):
        assert name in served
    assert "Gemma3ForConditionalGeneration" in refused and "vision tower" in refused


def test_models_check_describes_one_model(default_model_dir, capsys):
    assert main(["models", "--check", str(default_model_dir)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{default_model_dir}: LlamaForCausalLM, served: 30 layers")


@pytest.mark.parametrize(
    ("kv_cache_dtype", "line"),
    [
        # 30 layers x 3 KV heads x (K and V): 64 values of 4 bytes each, or 64 codes of
        # one byte and a bfloat16 scale; 1 GiB over that, less the padding slot
        ("auto", "KV cache: float32, 46,080 bytes per token, 23,300 tokens in 1 GiB"),
        ("int8", "KV cache: int8, 11,880 bytes per token, 90,381 tokens in 1 GiB"),
        ("fp8_e5m2", "KV cache: fp8_e5m2, 11,880 bytes per token, 90,381 tokens in 1 GiB"),
        # 32 + 32 bytes of codes and 8 float16 parameters a head; the float windows of
        # 128 request rows (32 positions, float32) come off the GiB first
        (
            "kivi4",
            "KV cache: kivi4, 7,200 bytes per token, 122,915 tokens in 1 GiB beside the "
            "float windows of 128 requests (180.0 MiB)",
        ),
    ],
)
def test_models_check_reports_the_kv_pool(default_model_dir, capsys, kv_cache_dtype, line):
    argv = ["models", "--check", str(default_model_dir), "--dtype", "float32"]
    argv += ["--kv-cache-dtype", kv_cache_dtype, "--kv-memory-gb", "1"]
    assert main(argv) == 0
    assert capsys.readouterr().out.splitlines()[-1] == line


def test_models_check_names_what_a_refused_model_lacks(tmp_path, capsys):
    (tmp_path / "config.json").write_text('{"architectures": ["DeepseekV3ForCausalLM"]}')
    assert main(["models", "--check", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "DeepseekV3ForCausalLM" in err and "multi-head latent attention" in err


def test_models_check_names_a_checkpoints_quantization(tmp_path, capsys):
    config = {**TINY, "architectures": ["LlamaForCausalLM"]}
    (tmp_path / "config.json").write_text(
        json.dumps(
            {**config, "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 64}}
        )
    )
    assert main(["models", "--check", str(tmp_path)]) == 0
    assert "served: " in (out := capsys.readouterr().out) and "weights AWQ 4-bit, group 64\n" in out
    refused = {"quant_method": "gptq", "bits": 3}
    (tmp_path / "config.json").write_text(json.dumps({**config, "quantization_config": refused}))
    assert main(["models", "--check", str(tmp_path)]) == 2
    assert "quantization_config.bits = 3 is not served" in capsys.readouterr().err
