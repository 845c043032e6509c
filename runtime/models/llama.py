"""Llama-family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2/2.5, Qwen3) in plain torch.

Every tensor is token-flat: (T, ...) over the new tokens of all requests in the
pass, in the order the runner laid them out. Only attention tells requests
apart, through the backend's per-pass metadata, so there is no per-request loop.

Parameter names equal the HF checkpoint's except two fused projections, whose
rows stack the HF tensors (the loader fills the slices)::

    self_attn.qkv_proj.weight = [q_proj (H*D) ; k_proj (Hkv*D) ; v_proj (Hkv*D)]
    mlp.gate_up_proj.weight   = [gate_proj (I) ; up_proj (I)]

The residual stream is updated in place: each block's output is added into it
by the next block's norm (``RMSNorm.add_and_norm``), saving one tensor per block.
"""

from __future__ import annotations

from typing import TypeGuard

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.kernels.cpu.elementwise import ElementwiseKernels
from radixlm.runtime.attention import AttentionBackend, AttentionMetadata
from radixlm.runtime.layers.factory import LayerFactory
from radixlm.runtime.layers.quantization import Quantization
from radixlm.runtime.models.config import ArchConfig
from radixlm.runtime.models.rope import RotaryEmbedding, apply_rope

__all__ = ["RMSNorm", "MLP", "Attention", "DecoderLayer", "LlamaModel", "LlamaForCausalLM"]

Device = torch.device | str


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, dtype: torch.dtype, device: Device) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype, device=device))
        self.eps = eps
        self.elementwise: ElementwiseKernels | None = None  # see use_elementwise_kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)

    def add_and_norm(
        self, x: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Adds x into the residual stream in place (None starts the stream at x).

        Returns (norm(residual), residual), both (T, hidden).
        """
        if _fused(self.elementwise):
            if residual is None:
                return self.elementwise.add_rms_norm(x, None, self.weight, self.eps), x
            return self.elementwise.add_rms_norm(residual, x, self.weight, self.eps), residual
        if residual is None:
            return self.forward(x), x
        residual.add_(x)
        return self.forward(residual), residual


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), gate and up in one matmul."""

    def __init__(self, config: ArchConfig, layers: LayerFactory) -> None:
        super().__init__()
        hidden, inter = config.hidden_size, config.intermediate_size
        self.gate_up_proj = layers.linear(hidden, 2 * inter, config.mlp_bias)
        self.down_proj = layers.linear(inter, hidden, config.mlp_bias)
        self.elementwise: ElementwiseKernels | None = None  # see use_elementwise_kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _fused(self.elementwise):
            return self.down_proj(self.elementwise.silu_mul(self.gate_up_proj(x)))
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # (T, I) each, views
        return self.down_proj(F.silu(gate, inplace=True).mul_(up))  # (T, hidden)


class Attention(nn.Module):
    """Fused QKV -> [per-head q/k RMSNorm] -> RoPE -> backend attention -> o_proj."""

    def __init__(
        self,
        config: ArchConfig,
        layer_id: int,
        backend: AttentionBackend,
        layers: LayerFactory,
    ) -> None:
        super().__init__()
        self.layer_id, self.backend = layer_id, backend
        self.num_heads, self.num_kv_heads = config.num_heads, config.num_kv_heads
        self.head_dim = d = config.head_dim
        qkv_rows = (self.num_heads + 2 * self.num_kv_heads) * d
        self.qkv_proj = layers.linear(config.hidden_size, qkv_rows, config.attention_bias)
        o_in = self.num_heads * d
        self.o_proj = layers.linear(o_in, config.hidden_size, config.o_proj_bias)
        eps, dtype, device = config.rms_norm_eps, layers.dtype, layers.device
        self.q_norm = RMSNorm(d, eps, dtype, device) if config.qk_norm else None
        self.k_norm = RMSNorm(d, eps, dtype, device) if config.qk_norm else None
        self.elementwise: ElementwiseKernels | None = None  # see use_elementwise_kernels

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attn_metadata: AttentionMetadata,
        output_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Every token's K/V goes to the pool; returns (T, hidden), or the
        ``output_rows`` rows only (o_proj runs for those alone)."""
        num_tokens, h, hkv = x.shape[0], self.num_heads, self.num_kv_heads
        qkv = self.qkv_proj(x).view(num_tokens, h + 2 * hkv, self.head_dim)  # (T, H+2Hkv, D)
        if _fused(self.elementwise):
            norms = None
            if self.q_norm is not None and self.k_norm is not None:
                norms = (self.q_norm.weight, self.k_norm.weight, self.q_norm.eps)
            self.elementwise.rope(qkv, h, hkv, cos, sin, norms)  # in place
            q, k = qkv[:, :h], qkv[:, h : h + hkv]
        else:
            qk = qkv[:, : h + hkv]  # (T, H+Hkv, D): q and k heads rotate together
            if self.q_norm is not None:
                qk = self._norm_heads(qk)
            q, k = apply_rope(qk, cos, sin).split([h, hkv], dim=1)  # (T, H, D), (T, Hkv, D)
        v = qkv[:, h + hkv :]  # (T, Hkv, D)
        out = self.backend.forward(self.layer_id, q, k, v, attn_metadata)  # (T, H, D)
        out = out.reshape(num_tokens, h * self.head_dim)
        if output_rows is not None:
            out = out[output_rows]  # (N, H * D)
        return self.o_proj(out)  # (T or N, hidden)

    def _norm_heads(self, qk: torch.Tensor) -> torch.Tensor:
        """Qwen3's per-head RMSNorm (q and k weights differ) in one pass over q and k."""
        assert self.q_norm is not None and self.k_norm is not None
        h, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        weight = torch.cat((self.q_norm.weight.expand(h, d), self.k_norm.weight.expand(hkv, d)))
        return F.rms_norm(qk, (d,), None, self.q_norm.eps) * weight  # (T, H+Hkv, D)


class DecoderLayer(nn.Module):
    def __init__(
        self,
        config: ArchConfig,
        layer_id: int,
        backend: AttentionBackend,
        layers: LayerFactory,
    ) -> None:
        super().__init__()
        eps, dtype, device = config.rms_norm_eps, layers.dtype, layers.device
        self.input_layernorm = RMSNorm(config.hidden_size, eps, dtype, device)
        self.self_attn = Attention(config, layer_id, backend, layers)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps, dtype, device)
        self.mlp = MLP(config, layers)

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attn_metadata: AttentionMetadata,
        output_rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden: the previous block's output, not yet in ``residual`` (T, hidden).

        Returns (this layer's MLP output, residual stream), both (T, hidden), or
        both (N, hidden) for the ``output_rows`` alone: every token's K/V is
        still written, but o_proj and the MLP run for those rows only.
        """
        x, residual = self.input_layernorm.add_and_norm(hidden, residual)
        x = self.self_attn(x, cos, sin, attn_metadata, output_rows)
        if output_rows is not None:
            residual = residual[output_rows]
        x, residual = self.post_attention_layernorm.add_and_norm(x, residual)
        return self.mlp(x), residual


class LlamaModel(nn.Module):
    """Embedding, decoder layers and final norm; returns final hidden states."""

    def __init__(
        self,
        config: ArchConfig,
        backend: AttentionBackend,
        layers: LayerFactory,
        embed_tokens: nn.Module,
    ) -> None:
        super().__init__()
        self.embed_tokens = embed_tokens  # (V, hidden) lookup; the LM head's when tied
        self.layers = nn.ModuleList(
            DecoderLayer(config, i, backend, layers) for i in range(config.num_layers)
        )
        dtype, device = layers.dtype, layers.device
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, device)
        self.rotary_emb = RotaryEmbedding.from_config(config, dtype, device)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn_metadata: AttentionMetadata,
        output_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)  # (T, hidden)
        cos, sin = self.rotary_emb(positions)  # (T, D/2) each, shared by every layer
        residual = None
        *layers, last = self.layers
        for layer in layers:
            hidden, residual = layer(hidden, residual, cos, sin, attn_metadata)
        # Only the rows the caller projects leave the last layer (llama.cpp does the
        # same): a 1,000-token prompt skips 999 rows of its last o_proj and MLP.
        hidden, residual = last(hidden, residual, cos, sin, attn_metadata, output_rows)
        return self.norm.add_and_norm(hidden, residual)[0]  # (T or N, hidden)


class LlamaForCausalLM(nn.Module):
    """A Llama-family causal LM whose attention runs through ``attn_backend``.

    Built with uninitialised weights; fill them with ``radixlm.runtime.models.load_model``
    (or ``load_weights``). Parameters never require grad. Call under
    ``torch.inference_mode()``.

    With ``config.tie_word_embeddings`` the ``lm_head`` shares the embedding
    matrix (one parameter, ``model.embed_tokens.weight``; one int8 matrix when
    quantized). ``quantization`` stores the linear layers' weights quantized
    (radixlm.runtime.layers.quantization); ``dtype`` is then the activations'.
    """

    def __init__(
        self,
        config: ArchConfig,
        attn_backend: AttentionBackend,
        dtype: torch.dtype = torch.float32,
        device: Device = "cpu",
        quantization: Quantization | None = None,
    ) -> None:
        super().__init__()
        self.config, self.dtype, self.quantization = config, dtype, quantization
        self.device = torch.device(device)
        layers = LayerFactory(dtype, device, quantization)
        embed_tokens, lm_head = layers.vocab_layers(
            config.vocab_size, config.hidden_size, config.tie_word_embeddings
        )
        # The model first: a tied matrix is named model.embed_tokens.weight, as in HF files
        self.model = LlamaModel(config, attn_backend, layers, embed_tokens)
        self.lm_head = lm_head
        self.requires_grad_(False)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn_metadata: AttentionMetadata,
        output_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Runs one pass over the new tokens of every request.

        Args:
            input_ids: (T,) int64 token ids, laid out as the backend metadata says.
            positions: (T,) int64 position of each token in its sequence.
            attn_metadata: the attention backend's ``prepare`` result for this pass.
            output_rows: (N,) int64 rows of the pass to return (repeats allowed);
                None for all. Every token's K/V is written to the pool either way.

        Returns:
            (T, hidden) final hidden states, or (N, hidden) for ``output_rows``;
            project them with ``compute_logits``.
        """
        return self.model(input_ids, positions, attn_metadata, output_rows)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: (N, hidden) -> (N, V) float32 logits."""
        return self.lm_head(hidden).float()

    def use_elementwise_kernels(self, kernels: ElementwiseKernels) -> None:
        """Runs the eager passes' RMSNorms, RoPE (with q/k norms) and SwiGLU
        activation through radixlm's C++ single-pass kernels (float32 on CPU; a
        compiled graph keeps the torch ops). The results equal the torch ops' up
        to float32 summation order."""
        if self.dtype != torch.float32 or self.device.type != "cpu":
            raise ValueError("the elementwise kernels run float32 models on CPU")
        for module in self.modules():
            if isinstance(module, RMSNorm | Attention | MLP):
                module.elementwise = kernels


def _fused(kernels: ElementwiseKernels | None) -> TypeGuard[ElementwiseKernels]:
    """Whether to run an elementwise step through ``kernels`` (not while compiling)."""
    return kernels is not None and not torch.compiler.is_compiling()
