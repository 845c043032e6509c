"""A tiny random-weight reasoning model: the default model's tokenizer with ``<think>``
and ``</think>`` added as tokens, and a chat template that opens the section (or, with
``enable_thinking=False``, closes it in the prompt), as Qwen3's thinking templates do."""

from __future__ import annotations

from pathlib import Path

import torch

from radixlm.runtime.models import write_random_model

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{% endif %}"
)
CONFIG = {
    "hidden_size": 64,
    "intermediate_size": 112,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-5,
    # Untied: a tied random model mostly repeats its last input token ("\n"); this one
    # thinks in arbitrary tokens, which no JSON schema would allow.
    "tie_word_embeddings": False,
}
# Engines on it: small, float32, no C++ builds (the model is too small to need them).
ENGINE_OPTIONS = {
    "max_total_tokens": 4096,
    "cpu_layer_kernels": False,
    "attention_backend": "torch",
    "device": "cpu",
    "dtype": "float32",
}


SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}


def chat_prompt(tokenizer, thinking: bool = True) -> str:
    messages = [{"role": "user", "content": "Is it?"}]
    kwargs = {} if thinking else {"enable_thinking": False}
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **kwargs
    )


def reasoning_tokenizer(default_model_dir: Path, template: str = TEMPLATE):
    """The default model's tokenizer with the two markers as (non-special) tokens."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(default_model_dir), local_files_only=True)
    tokenizer.add_tokens(["<think>", "</think>"])
    tokenizer.chat_template = template
    return tokenizer


def write_reasoning_model(directory: Path, default_model_dir: Path, seed: int = 0) -> Path:
    tokenizer = reasoning_tokenizer(default_model_dir)
    config = {**CONFIG, "vocab_size": len(tokenizer)}
    write_random_model(directory, config, torch.float32, seed=seed)
    for stale in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (directory / stale).unlink(missing_ok=True)
    tokenizer.save_pretrained(str(directory))
    return directory
