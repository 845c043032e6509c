"""Random-weight checkpoints of any served family and shape, for tests and benchmarks
that need a model's size, not its knowledge (``benchmarks/gpu_check.py``'s 1B model,
``benchmarks/bench_moe.py``'s Qwen3-30B-A3B shape): no download.

The tensors are the ones the family's Hugging Face checkpoints hold, under their
names (read off radixlm's own model built on the meta device, its fused q/k/v and
gate/up split back into the checkpoint's parts; Mixtral's experts under its own
names). The weights are scaled so that activations stay O(1) through every layer
(embeddings N(0, 1), each projection and router N(0, 1/fan_in), unit norms: 1, or 0
where the family's norms compute ``x * (1 + w)``), and the tokenizer is word-level:
token i is the word ``w<i>`` (0-2: unk, bos, eos).

Layers are written one shard each (``model.safetensors.index.json``), drawn and
saved one at a time, so a checkpoint far larger than memory can be written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from radixlm.runtime.model_store.transformers_compat import import_hub_kernels
from radixlm.runtime.models.config import ArchConfig
from radixlm.runtime.models.decoder import DecoderForCausalLM
from radixlm.runtime.models.loader import FUSED_PARTS, checkpoint_name

__all__ = ["write_random_model"]

# config.json's model_type of each architecture
_MODEL_TYPES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Phi3ForCausalLM": "phi3",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3_text",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "MixtralForCausalLM": "mixtral",
    "OlmoeForCausalLM": "olmoe",
}

# families whose checkpoints hold q/k/v and gate/up as the fused matrices
_STORED_FUSED = ("Phi3ForCausalLM",)


def write_random_model(
    directory: Path,
    config: dict[str, Any],
    dtype: torch.dtype = torch.bfloat16,
    device: str = "cpu",
    seed: int = 0,
) -> Path:
    """Writes config.json, the safetensors shards and a tokenizer to ``directory``.

    config: Hugging Face config fields of the family named by ``architectures``
        (default ``["LlamaForCausalLM"]``): vocab_size, hidden_size,
        intermediate_size, num_hidden_layers, num_attention_heads,
        num_key_value_heads, head_dim, and the family's own (num_experts, ...); the
        checkpoint ties its embeddings unless ``tie_word_embeddings`` is False.
    device: where the random numbers are drawn (a GPU draws a 1B model in a blink).

    Raises:
        UnsupportedArchitectureError / ModelLoadError: a family or config radixlm
            does not serve.
    """
    from safetensors.torch import save_file  # lazy: only a writer of checkpoints needs it

    directory.mkdir(parents=True, exist_ok=True)
    architecture = (config.get("architectures") or ["LlamaForCausalLM"])[0]
    full = {"architectures": [architecture], "model_type": _MODEL_TYPES.get(architecture), **config}
    full.setdefault("tie_word_embeddings", True)
    # explicit where transformers' config classes default otherwise
    full.setdefault("head_dim", config["hidden_size"] // config["num_attention_heads"])
    full.setdefault("pad_token_id", 0)
    full.update(torch_dtype=str(dtype).removeprefix("torch."), bos_token_id=1, eos_token_id=2)
    arch = ArchConfig.from_dict(full)
    (directory / "config.json").write_text(json.dumps(full, indent=1))
    gen = torch.Generator(device=device).manual_seed(seed)
    shapes = _checkpoint_shapes(arch)
    norm_value = 0.0 if arch.gemma_norms else 1.0

    def tensor(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if name.endswith(".bias"):
            return torch.zeros(shape, dtype=dtype)
        if len(shape) == 1:  # norms
            return torch.full(shape, norm_value, dtype=dtype)
        std = 1.0 if name == "model.embed_tokens.weight" else shape[1] ** -0.5
        t = torch.randn(shape, generator=gen, device=device)
        return (t * std).to(dtype).cpu()

    shards: dict[str, dict[str, tuple[int, ...]]] = {}
    for name, shape in shapes.items():
        layer = name.split(".")[2] if name.startswith("model.layers.") else "rest"
        shards.setdefault(layer, {})[name] = shape
    weight_map: dict[str, str] = {}
    for index, names in enumerate(shards.values()):
        file = f"model-{index + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: tensor(n, s) for n, s in names.items()}, str(directory / file))
        weight_map |= dict.fromkeys(names, file)
    index_json = {"metadata": {}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index_json, indent=1))
    _write_tokenizer(directory, config["vocab_size"])
    return directory


def _checkpoint_shapes(arch: ArchConfig) -> dict[str, tuple[int, ...]]:
    """Every checkpoint tensor's name and shape, from radixlm's model on the meta device."""
    with torch.device("meta"):
        model = DecoderForCausalLM(arch, None, torch.float32, "meta")  # type: ignore[arg-type]
    parts_of: dict[str, list[str]] = {}
    for part, (fused, _) in FUSED_PARTS.items():
        parts_of.setdefault(fused, []).append(part)
    q_rows = arch.num_heads * arch.head_dim
    kv_rows = arch.num_kv_heads * arch.head_dim
    shapes: dict[str, tuple[int, ...]] = {}
    for name, param in model.named_parameters():
        path, _, leaf = name.rpartition(".")
        parent, _, module = path.rpartition(".")
        rows, *rest = param.shape
        if module in parts_of and arch.architecture not in _STORED_FUSED:
            sizes = (q_rows, kv_rows, kv_rows) if module == "qkv_proj" else (rows // 2,) * 2
            for part, size in zip(parts_of[module], sizes, strict=True):
                hf = checkpoint_name(arch.architecture, f"{parent}.{part}.{leaf}")
                shapes[hf] = (size, *rest)
        else:
            shapes[checkpoint_name(arch.architecture, name)] = tuple(param.shape)
    if arch.tie_word_embeddings:
        shapes.pop("lm_head.weight", None)
    return shapes


def _write_tokenizer(directory: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # lazy: heavy

    import_hub_kernels()
    from transformers import PreTrainedTokenizerFast  # lazy: after import_hub_kernels()

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab |= {f"w{i}": i for i in range(3, vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # words joined by spaces
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    fast.save_pretrained(str(directory))
