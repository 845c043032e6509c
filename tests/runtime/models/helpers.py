"""Helpers for the model tests: tiny random HF checkpoints and a KV-pool harness.

Tiny HF models are built by transformers (the numerical reference), given
well-scaled random weights, saved with ``save_pretrained`` and loaded by our loader.
"""

from __future__ import annotations

import copy
import os
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers

from radixlm.runtime.attention import (
    AttentionInputs,
    AttentionScoring,
    TorchAttentionBackend,
    TritonAttentionBackend,
)
from radixlm.runtime.mem_cache.kv_pool import KVPool, ReqToTokenTable, SlotAllocator
from radixlm.runtime.models import ArchConfig, DecoderForCausalLM, load_model
from radixlm.runtime.models.decoder import RMSNorm
from tests import numerics as num

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TINY: dict[str, Any] = {
    "vocab_size": 96,
    "hidden_size": 64,
    "intermediate_size": 112,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-5,
}

# kind -> (HF config class, HF model class)
HF_CLASSES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
    "phi3": (transformers.Phi3Config, transformers.Phi3ForCausalLM),
    "gemma2": (transformers.Gemma2Config, transformers.Gemma2ForCausalLM),
    "gemma3": (transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM),
    "qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM),
    "qwen2_moe": (transformers.Qwen2MoeConfig, transformers.Qwen2MoeForCausalLM),
    "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM),
    "olmoe": (transformers.OlmoeConfig, transformers.OlmoeForCausalLM),
}
# Each family's tiny shape beside TINY: its own keys, scaled down from a real config
# (tokens ids inside the tiny vocabulary)
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "phi3": {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2},
    "gemma2": {"head_dim": 16, "query_pre_attn_scalar": 16},
    "gemma3": {"head_dim": 16, "query_pre_attn_scalar": 16},
    "qwen3_moe": {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32},
    "qwen2_moe": {
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 48,
    },
    "mixtral": {"num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 32},
    "olmoe": {
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "intermediate_size": 32,
        "pad_token_id": 0,
        "eos_token_id": 2,
    },
}


def build_hf_model(kind: str, seed: int = 0, **overrides: Any) -> transformers.PreTrainedModel:
    """A tiny HF model of ``kind`` with random weights large enough to matter."""
    config_cls, model_cls = HF_CLASSES[kind]
    torch.manual_seed(seed)
    model = model_cls(config_cls(**{**TINY, **FAMILY_DEFAULTS.get(kind, {}), **overrides})).eval()
    _randomize(model)
    return model


@torch.no_grad()
def _randomize(model: torch.nn.Module) -> None:
    # HF's init (std 0.02, unit norms, zero biases) makes every layer nearly an
    # identity, which would hide bugs in norms, biases and attention.
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.copy_(1 + 0.3 * torch.randn_like(p))
        elif name.endswith("bias"):
            p.normal_(0, 0.3)
        elif "embed_tokens" in name:
            p.normal_(0, 1.0)
        else:  # fan-in scaled; 3-D: transformers' stacked experts (E, out, in)
            p.normal_(0, p.shape[-1] ** -0.5)


def hf_logits(hf_model: transformers.PreTrainedModel, ids: list[int]) -> torch.Tensor:
    """(T, V) logits of a full sequence from transformers: float32, or float64 from a
    float64 model (``exact_twin``)."""
    with torch.inference_mode():
        logits = hf_model(torch.tensor([ids])).logits[0]
    return logits if logits.dtype == torch.float64 else logits.float()


def exact_twin(hf_model: transformers.PreTrainedModel) -> transformers.PreTrainedModel:
    """The same model in float64, whose results stand for the exact ones (float64's
    rounding errors are 2^29 times float32's): the truth ``tests.numerics.
    assert_no_worse_than`` measures float32 errors against.

    transformers computes RMSNorm in float32 whatever the model's dtype; the twin's
    norms compute in float64. RoPE's cos/sin tables stay float32 values (their
    float32 rounding is the model's definition, shared by every implementation)."""
    twin = copy.deepcopy(hf_model).double()
    if getattr(twin.config, "_experts_implementation", None) not in (None, "eager"):
        twin.set_experts_implementation("eager")  # grouped_mm takes no float64
    for module in twin.modules():
        if type(module).__name__.endswith("RMSNorm"):
            module.forward = types.MethodType(_rms_norm_float64, module)
    return twin


def _rms_norm_float64(norm: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    variance = hidden.pow(2).mean(-1, keepdim=True)
    if type(norm).__name__.startswith("Gemma"):  # x * (1 + w), its epsilon named eps
        return (1 + norm.weight) * (hidden * torch.rsqrt(variance + norm.eps))
    return norm.weight * (hidden * torch.rsqrt(variance + norm.variance_epsilon))


def assert_like_transformers(
    ours: list[torch.Tensor],
    hf_model: transformers.PreTrainedModel,
    twin: transformers.PreTrainedModel,
    sequences: list[list[int]],
) -> None:
    """``ours[i]``: float32 logits of the last len(ours[i]) tokens of ``sequences[i]``.
    Their error against ``twin`` (the exact result), all rows together, is at most
    SAME_COMPUTATION times transformers' float32 model's."""
    got, ref, truth = [], [], []
    for logits, ids in zip(ours, sequences, strict=True):
        n = logits.shape[0]
        got.append(logits)
        ref.append(hf_logits(hf_model, ids)[-n:])
        truth.append(hf_logits(twin, ids)[-n:])
    num.assert_no_worse_than(
        torch.cat(got), torch.cat(ref), torch.cat(truth), num.SAME_COMPUTATION, "logits"
    )


@dataclass
class KVHarness:
    """KV pool + req_to_token table + slot allocator + backend ("torch", or "triton":
    Triton's interpreter on CPU), wired by hand.

    ``run`` plays the model runner: each chunk appends tokens to a request
    (created on first sight), all chunks in ONE forward pass.
    """

    config: ArchConfig
    dtype: torch.dtype = torch.float32
    num_slots: int = 1024
    max_requests: int = 8
    backend_name: str = "torch"
    _cached: dict[str, tuple[int, int]] = field(default_factory=dict)  # key -> (row, num tokens)

    def __post_init__(self) -> None:
        c = self.config
        self.pool = KVPool(c.num_layers, self.num_slots, c.num_kv_heads, c.head_dim, self.dtype)
        self.table = ReqToTokenTable(self.max_requests, c.max_context_len)
        self.allocator = SlotAllocator(self.num_slots)
        scoring = AttentionScoring.of(c)  # the model's windows and soft-cap
        backend = {"torch": TorchAttentionBackend, "triton": TritonAttentionBackend}
        self.backend = backend[self.backend_name](
            self.pool, self.table, c.attention_scale, scoring=scoring
        )

    def load(self, model_dir: Path) -> DecoderForCausalLM:
        return load_model(model_dir, self.backend, self.dtype, config=self.config)

    def run(
        self, model: DecoderForCausalLM, chunks: list[tuple[str, list[int]]]
    ) -> list[torch.Tensor]:
        """One pass; returns each chunk's (num tokens, V) float32 logits."""
        ids, positions, inputs = self.lay_out(chunks)
        with torch.inference_mode():
            metadata = self.backend.prepare(inputs)
            hidden = model(ids, positions, metadata)
            return list(model.compute_logits(hidden).split(inputs.extend_lens.tolist()))

    def run_rows(
        self, model: DecoderForCausalLM, chunks: list[tuple[str, list[int]]], rows: list[int]
    ) -> torch.Tensor:
        """One pass returning only the flat rows ``rows``: (len(rows), V) float32 logits."""
        ids, positions, inputs = self.lay_out(chunks)
        with torch.inference_mode():
            metadata = self.backend.prepare(inputs)
            hidden = model(ids, positions, metadata, torch.tensor(rows, dtype=torch.int64))
            return model.compute_logits(hidden)

    def lay_out(
        self, chunks: list[tuple[str, list[int]]]
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionInputs]:
        """Allocates slots for one pass's chunks; returns (input_ids, positions, inputs)."""
        rows, prefix_lens, ids, positions, slots = [], [], [], [], []
        for key, tokens in chunks:
            row, num_cached = self._cached.get(key) or (self.table.allocate_row(), 0)
            new_slots = self.allocator.allocate(len(tokens))
            assert row is not None and new_slots is not None
            self.table.write(row, num_cached, new_slots)
            self._cached[key] = (row, num_cached + len(tokens))
            rows.append(row)
            prefix_lens.append(num_cached)
            ids += tokens
            positions += range(num_cached, num_cached + len(tokens))
            slots.append(new_slots)
        extend_lens = [len(tokens) for _, tokens in chunks]
        inputs = AttentionInputs(
            rows=torch.tensor(rows),
            prefix_lens=torch.tensor(prefix_lens),
            extend_lens=torch.tensor(extend_lens),
            out_cache_loc=torch.cat(slots),
        )
        return torch.tensor(ids), torch.tensor(positions), inputs


def fuse_norms(model: DecoderForCausalLM) -> None:
    """Every RMSNorm's add-and-norm through the Triton kernel, as a model on CUDA runs
    it (here on CPU tensors, through Triton's interpreter)."""
    from radixlm.kernels.triton.norm import add_rms_norm_triton

    for module in model.modules():
        if isinstance(module, RMSNorm):
            module.fused_add_norm = add_rms_norm_triton


def save_hf(hf_model: transformers.PreTrainedModel, path: Path, **kwargs: Any) -> Path:
    """Saves a HF model as a safetensors checkpoint directory at ``path``."""
    hf_model.save_pretrained(path, **kwargs)
    return path


def load_saved(
    hf_model: transformers.PreTrainedModel, path: Path, dtype: torch.dtype = torch.float32
) -> tuple[DecoderForCausalLM, KVHarness]:
    """(our model, harness) for ``hf_model`` saved at ``path``."""
    save_hf(hf_model, path)
    harness = KVHarness(ArchConfig.from_model_dir(path), dtype)
    return harness.load(path), harness
