"""Every family radixlm serves, as a GGUF llama.cpp's converter would write it
(``gguf_writer``) from a tiny random-weight checkpoint: served from the file (a float
file computes what the checkpoint does; a quantized one what its own dequantized values
do), and converted back into a Hugging Face directory whose config reads as the
checkpoint's (to radixlm and to transformers) and whose weights are the checkpoint's."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file

from radixlm.runtime.errors import ModelLoadError, ModelNotFoundError, UnsupportedArchitectureError
from radixlm.runtime.layers.linear import Linear
from radixlm.runtime.layers.quantization import QuantizedEmbedding, QuantizedLinear
from radixlm.runtime.model_store.gguf_arch import GGUF_ARCHITECTURES, open_gguf
from radixlm.runtime.model_store.gguf_convert import convert_gguf_to_hf, write_hf_metadata
from radixlm.runtime.models import ArchConfig, DecoderForCausalLM
from radixlm.runtime.models.config import RopeScaling
from radixlm.runtime.models.gguf_loader import load_gguf_model
from tests.runtime.model_store.gguf_writer import write_gguf
from tests.runtime.models.helpers import KVHarness, build_hf_model, save_hf

Q = gguf.GGMLQuantizationType
PROMPT = [5, 17, 3, 60, 2, 44, 9, 81, 12, 33, 70, 8]


def _llama3(original: int) -> dict[str, Any]:
    return {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": original}  # fmt: skip


def _longrope() -> dict[str, Any]:
    factors = [1 + i / 4 for i in range(8)]  # head_dim 16; float32 values, as GGUF keeps them
    return {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": factors,
            "long_factor": [2 * f for f in factors]}  # fmt: skip


# id -> (kind, HF config overrides); windows of 8 reach into PROMPT
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("llama", {}),
    # two frequencies between llama3's cuts (fitted), and Llama 3.1's own (one between)
    "llama-llama3-rope": ("llama", {"rope_parameters": _llama3(200)}),
    "llama-llama31-rope": ("llama", {"rope_parameters": _llama3(8192)}),
    "mistral": ("mistral", {}),
    "mixtral": ("mixtral", {}),
    "qwen2-tied": ("qwen2", {"tie_word_embeddings": True}),
    "qwen2-yarn": (
        "qwen2",
        {
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 32,
            }
        },
    ),  # fmt: skip
    "qwen3": ("qwen3", {"head_dim": 16}),
    "phi3-partial-rotary": ("phi3", {"partial_rotary_factor": 0.5, "sliding_window": 8}),
    "phi3-longrope": (
        "phi3",
        {"rope_parameters": _longrope(), "original_max_position_embeddings": 64},
    ),
    "gemma2": ("gemma2", {"sliding_window": 8}),
    # llama.cpp's pattern: 5 sliding layers, 1 global
    "gemma3": ("gemma3", {"num_hidden_layers": 6, "sliding_window": 8}),
    "qwen3-moe": ("qwen3_moe", {"norm_topk_prob": True}),  # llama.cpp always renormalises
    "qwen2-moe": ("qwen2_moe", {}),
    "olmoe": ("olmoe", {}),
}


@dataclass(frozen=True)
class Family:
    name: str
    checkpoint: Path  # the HF directory
    gguf: Path  # its F32 GGUF
    root: Path


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Family:
    kind, overrides = FAMILIES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    checkpoint = save_hf(build_hf_model(kind, **overrides), root / "hf")
    return Family(request.param, checkpoint, write_gguf(checkpoint, root / "f32.gguf"), root)


def _served(path: Path, meta_dir: Path) -> tuple[DecoderForCausalLM, KVHarness, str]:
    """(the model served from a GGUF, its harness, what its layers store)."""
    write_hf_metadata(open_gguf(path), meta_dir)
    harness = KVHarness(ArchConfig.from_model_dir(meta_dir))
    model, storage = load_gguf_model(path, harness.backend, torch.float32, "cpu", harness.config)
    return model, harness, storage


def _loaded(model_dir: Path) -> tuple[DecoderForCausalLM, KVHarness]:
    harness = KVHarness(ArchConfig.from_model_dir(model_dir))
    return harness.load(model_dir), harness


def _logits(model: DecoderForCausalLM, harness: KVHarness) -> torch.Tensor:
    return harness.run(model, [("p", PROMPT)])[0]


def _assert_close(got: torch.Tensor, want: torch.Tensor, share: float) -> None:
    """Off by at most ``share`` of the logits' range (a misread tensor is off by it all)."""
    error, spread = (got - want).abs().max().item(), (want.max() - want.min()).item()
    assert error <= share * spread, f"error {error:.3g} over a range of {spread:.3g}"


def _assert_same_weights(served: DecoderForCausalLM, twin: DecoderForCausalLM) -> None:
    """Every matrix of ``served`` (quantized or float) holds ``twin``'s float32 values."""
    twins = dict(twin.named_modules())
    for name, module in served.named_modules():
        if isinstance(module, QuantizedLinear | QuantizedEmbedding):
            got = module.qweight.dequantize(torch.float32)
        elif isinstance(module, Linear | torch.nn.Embedding):
            got = module.weight.float()
        else:
            continue
        assert torch.equal(got, twins[name].weight), name


def test_a_float_file_computes_what_its_checkpoint_does(family: Family) -> None:
    served, harness, storage = _served(family.gguf, family.root / "f32-meta")
    _assert_close(_logits(served, harness), _logits(*_loaded(family.checkpoint)), 1e-5)
    assert storage.startswith("GGUF: float x")


def test_a_q8_0_file_holds_its_own_values(family: Family) -> None:
    """Against the file's own values converted to float32: Q8_0 codes are held exactly
    (int8 groups, float32 scales), matrices whose rows are no whole blocks are F16 as the
    converter leaves them. What is left is the quantized kernels' bfloat16 activations on
    a CPU (kernel_dtype)."""
    path = write_gguf(family.checkpoint, family.root / "q8.gguf", Q.Q8_0)
    served, harness, storage = _served(path, family.root / "q8-meta")
    convert_gguf_to_hf(path, family.root / "q8-hf")
    twin, twin_harness = _loaded(family.root / "q8-hf")
    _assert_same_weights(served, twin)
    _assert_close(_logits(served, harness), _logits(twin, twin_harness), 0.01)
    assert "int8g" in storage


def test_the_converted_directory_is_the_checkpoint(family: Family) -> None:
    """Its config reads back as the checkpoint's, but for what llama.cpp's files do not
    keep; its weights are the checkpoint's, bit for bit (Gemma's norms: 1 + w, rounded to
    float32 in the file, is what the model computes with)."""
    out = _converted(family)
    config = ArchConfig.from_model_dir(out)
    assert config == _kept(ArchConfig.from_model_dir(family.checkpoint))
    ours, theirs = (
        load_file(out / "model.safetensors"),
        load_file(family.checkpoint / "model.safetensors"),
    )
    assert sorted(ours) == sorted(theirs)
    for name, values in theirs.items():
        if config.gemma_norms and name.endswith("norm.weight"):
            assert np.array_equal(ours[name] + 1, values + 1), name
        else:
            assert np.array_equal(ours[name], values), name


def test_transformers_reads_the_converted_directory_as_the_checkpoint(family: Family) -> None:
    """The converted config.json is one transformers builds the same model from."""
    ours, theirs = (
        transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        for path in (_converted(family), family.checkpoint)
    )
    with torch.inference_mode():
        got, want = (model(torch.tensor([PROMPT])).logits[0] for model in (ours, theirs))
    _assert_close(got, want, 1e-6)


def _converted(family: Family) -> Path:
    """The F32 file converted back to a Hugging Face directory (once)."""
    out = family.root / "f32-hf"
    if not (out / "config.json").is_file():
        convert_gguf_to_hf(family.gguf, out)
    return out


def _kept(config: ArchConfig) -> ArchConfig:
    """What a GGUF keeps of a config: llama.cpp converts Mistral to its llama
    architecture, which has no sliding window; a default RoPE has no original length
    (which Phi-3's config names)."""
    if config.rope_scaling.rope_type == "default":
        config = dataclasses.replace(config, rope_scaling=RopeScaling())
    if config.architecture == "MistralForCausalLM":
        return dataclasses.replace(config, architecture="LlamaForCausalLM", layer_windows=())
    return config


@pytest.mark.parametrize("kind", ["llama", "qwen3_moe"])
def test_a_q4_0_file_keeps_its_codes(kind: str, tmp_path: Path) -> None:
    """int4 layers (experts too) hold the file's codes; their scales are bf16 and so are
    the activations (2% of the logits' range, as test_gguf_loader allows)."""
    overrides = {"intermediate_size": 128, "moe_intermediate_size": 64}  # rows of whole blocks
    checkpoint = save_hf(build_hf_model(kind, **overrides), tmp_path / "hf")
    path = write_gguf(checkpoint, tmp_path / "q4.gguf", Q.Q4_0)
    served, harness, storage = _served(path, tmp_path / "meta")
    convert_gguf_to_hf(path, tmp_path / "q4-hf")
    _assert_close(_logits(served, harness), _logits(*_loaded(tmp_path / "q4-hf")), 0.02)
    assert "int4" in storage


def test_an_unsupported_architecture_is_refused_by_name(tmp_path: Path) -> None:
    writer = gguf.GGUFWriter(tmp_path / "gpt2.gguf", "gpt2")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedArchitectureError, match="'gpt2'") as info:
        open_gguf(tmp_path / "gpt2.gguf")
    assert all(arch in str(info.value) for arch in GGUF_ARCHITECTURES)


def test_a_split_gguf_serves_as_the_whole_file(tmp_path: Path) -> None:
    """A GGUF split into files (``-00001-of-0000N.gguf``, as llama.cpp writes it) opens
    from its first part: every part's tensors, served as the whole file serves them."""
    checkpoint = save_hf(build_hf_model("llama"), tmp_path / "hf")
    whole = write_gguf(checkpoint, tmp_path / "whole.gguf", Q.Q8_0)
    (tmp_path / "split").mkdir()
    first = write_gguf(checkpoint, tmp_path / "split" / "m-Q8_0.gguf", Q.Q8_0, split_max_tensors=5)
    parts = sorted(first.parent.iterdir())
    assert first == parts[0] and first.name == f"m-Q8_0-00001-of-{len(parts):05d}.gguf"
    assert len(parts) > 2
    split, one = open_gguf(first), open_gguf(whole)
    assert len(split.readers) == len(parts) and list(split.tensors) == list(one.tensors)
    for name, tensor in one.tensors.items():
        assert np.array_equal(split.tensors[name].data, tensor.data), name
    served, harness, _ = _served(first, tmp_path / "split-meta")
    twin, twin_harness, _ = _served(whole, tmp_path / "whole-meta")
    assert torch.equal(_logits(served, harness), _logits(twin, twin_harness))


def test_a_split_gguf_names_its_first_part_and_a_missing_one(tmp_path: Path) -> None:
    checkpoint = save_hf(build_hf_model("llama"), tmp_path / "hf")
    first = write_gguf(checkpoint, tmp_path / "m.gguf", Q.F32, split_max_tensors=8)
    parts = sorted(tmp_path.glob("m-*.gguf"))
    count = len(parts)
    with pytest.raises(ModelLoadError) as later:
        open_gguf(parts[1])
    assert str(later.value) == (
        f"{parts[1]} is part 2 of a GGUF split into {count} files: give its first part, {first}"
    )
    parts[-1].rename(tmp_path / "renamed.gguf")
    with pytest.raises(ModelNotFoundError) as missing:
        open_gguf(first)
    assert str(missing.value) == (
        f"{first} is the first of a GGUF split into {count} files; missing beside it: "
        f"{parts[-1].name}"
    )
    with pytest.raises(ModelLoadError, match=f"part 1 of a GGUF split into {count} files, named"):
        open_gguf(first.rename(tmp_path / "first.gguf"))
