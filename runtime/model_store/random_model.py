"""Random-weight Llama checkpoints of any shape, for tests and benchmarks that need a
model's size, not its knowledge (``benchmarks/gpu_check.py``'s 1B model): no download.

The weights are scaled so that activations stay O(1) through every layer
(embeddings N(0, 1), each projection N(0, 1/fan_in), unit norms), and the
tokenizer is word-level: token i is the word ``w<i>`` (0-2: unk, bos, eos).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from radixlm.runtime.model_store.transformers_compat import import_hub_kernels

__all__ = ["write_random_model"]


def write_random_model(
    directory: Path,
    config: dict[str, Any],
    dtype: torch.dtype = torch.bfloat16,
    device: str = "cpu",
    seed: int = 0,
) -> Path:
    """Writes config.json, model.safetensors and a tokenizer to ``directory``.

    config: Hugging Face ``LlamaConfig`` fields (vocab_size, hidden_size,
        intermediate_size, num_hidden_layers, num_attention_heads,
        num_key_value_heads, head_dim, ...); the checkpoint ties its embeddings
        unless ``tie_word_embeddings`` is False.
    device: where the random numbers are drawn (a GPU draws a 1B model in a blink).
    """
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    full = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **config}
    full.setdefault("tie_word_embeddings", True)
    full.update(torch_dtype=str(dtype).removeprefix("torch."), bos_token_id=1, eos_token_id=2)
    (directory / "config.json").write_text(json.dumps(full, indent=1))
    gen = torch.Generator(device=device).manual_seed(seed)
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    d = config.get("head_dim", hidden // heads)

    def weight(rows: int, cols: int, std: float | None = None) -> torch.Tensor:
        t = torch.randn(rows, cols, generator=gen, device=device)
        return (t * (std if std is not None else cols**-0.5)).to(dtype).cpu()

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=dtype)

    tensors = {
        "model.embed_tokens.weight": weight(config["vocab_size"], hidden, 1.0),
        "model.norm.weight": ones(hidden),
    }
    if not config.get("tie_word_embeddings", True):
        tensors["lm_head.weight"] = weight(config["vocab_size"], hidden)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors |= {
            p + "self_attn.q_proj.weight": weight(heads * d, hidden),
            p + "self_attn.k_proj.weight": weight(kv_heads * d, hidden),
            p + "self_attn.v_proj.weight": weight(kv_heads * d, hidden),
            p + "self_attn.o_proj.weight": weight(hidden, heads * d),
            p + "mlp.gate_proj.weight": weight(inter, hidden),
            p + "mlp.up_proj.weight": weight(inter, hidden),
            p + "mlp.down_proj.weight": weight(hidden, inter),
            p + "input_layernorm.weight": ones(hidden),
            p + "post_attention_layernorm.weight": ones(hidden),
        }
    save_file(tensors, str(directory / "model.safetensors"))
    _write_tokenizer(directory, config["vocab_size"])
    return directory


def _write_tokenizer(directory: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    import_hub_kernels()
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab |= {f"w{i}": i for i in range(3, vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # words joined by spaces
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    fast.save_pretrained(str(directory))
