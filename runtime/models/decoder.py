"""Every supported decoder-only family in plain torch: one layer shape with switches
(``ArchConfig``: Llama, Mistral, Qwen2/3, Phi-3/4, Gemma 2/3, and the mixture-of-experts
families through ``radixlm.runtime.models.moe``).

Every tensor is token-flat: (T, ...) over the new tokens of all requests in the
pass, in the order the runner laid them out. Only attention tells requests
apart, through the backend's per-pass metadata, so there is no per-request loop.
Each layer's sliding window and the attention soft-cap are the backend's to apply
(it reads them from the ``ArchConfig`` it was built for).

Parameter names equal the HF checkpoint's except two fused projections, whose
rows stack the HF tensors (the loader fills the slices, or the whole matrix from a
checkpoint that stores it fused, as Phi-3's do)::

    self_attn.qkv_proj.weight = [q_proj (H*D) ; k_proj (Hkv*D) ; v_proj (Hkv*D)]
    mlp.gate_up_proj.weight   = [gate_proj (I) ; up_proj (I)]

The residual stream is updated in place: each block's output is added into it
by the next block's norm (``RMSNorm.add_and_norm``; on CUDA one Triton pass, the
add and the norm together), saving one tensor per block.
Gemma's layer norms each sublayer's output too (``post_attention_layernorm``,
``post_feedforward_layernorm``) before it joins the stream, and its norms compute
``x * (1 + w)``: the loader stores ``1 + w`` (``fold_norm_offsets``), so one RMSNorm
serves every family.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.kernels.cpu.elementwise import ROW_DTYPES, ElementwiseKernels
from radixlm.kernels.norm import AddRmsNorm, add_rms_norm
from radixlm.runtime.attention import (
    AttentionBackend,
    AttentionMetadata,
    RopeTables,
    RotatingBackend,
)
from radixlm.runtime.layers.factory import LayerFactory
from radixlm.runtime.layers.quantization import (
    Quantization,
    QuantizedEmbedding,
    QuantizedLinear,
)
from radixlm.runtime.models.config import ArchConfig
from radixlm.runtime.models.mlp import MLP, elementwise_ready
from radixlm.runtime.models.moe import SparseMoE
from radixlm.runtime.models.rope import RotaryEmbedding, apply_rope

if TYPE_CHECKING:  # the model only calls its group; torch.distributed loads with it
    from radixlm.runtime.distributed.group import TensorParallelGroup

__all__ = [
    "RMSNorm",
    "MLP",
    "Attention",
    "DecoderLayer",
    "DecoderModel",
    "DecoderForCausalLM",
]

Device = torch.device | str


class RMSNorm(nn.Module):
    """x / rms(x) * weight. ``in_float32``: the weight is float32 and the norm is
    computed in float32, rounded once to x's dtype (Gemma's norms: transformers
    computes them so, and ``1 + w`` rounded to bfloat16 would lose w's low bits).

    ``fused_add_norm`` (a model built on CUDA gets ``radixlm.kernels.norm.add_rms_norm``):
    ``add_and_norm`` adds and norms in one Triton pass (float32 inside, one rounding),
    outside a compiled graph; None (on a CPU) keeps the torch ops (or the C++
    ``elementwise``)."""

    def __init__(
        self, dim: int, eps: float, dtype: torch.dtype, device: Device, in_float32: bool = False
    ) -> None:
        super().__init__()
        weight_dtype = torch.float32 if in_float32 else dtype
        self.weight = nn.Parameter(torch.ones(dim, dtype=weight_dtype, device=device))
        self.eps = eps
        self.in_float32 = in_float32 and dtype != torch.float32
        self.elementwise: ElementwiseKernels | None = None  # see use_elementwise_kernels
        on_cuda = torch.device(device).type == "cuda"
        self.fused_add_norm: AddRmsNorm | None = add_rms_norm if on_cuda else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.in_float32:
            return F.rms_norm(x.float(), self.weight.shape, self.weight, self.eps).to(x.dtype)
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)

    def add_and_norm(
        self, x: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Adds x into the residual stream in place (None starts the stream at x).

        Returns (norm(residual), residual), both (T, hidden).
        """
        if elementwise_ready(self.elementwise):
            if residual is None:
                return self.elementwise.add_rms_norm(x, None, self.weight, self.eps), x
            return self.elementwise.add_rms_norm(residual, x, self.weight, self.eps), residual
        fused = self.fused_add_norm
        if fused is not None and not torch.compiler.is_compiling() and x.is_contiguous():
            if residual is None:  # the stream starts at x, which the next add updates
                return fused(x, None, self.weight, self.eps), x
            return fused(residual, x, self.weight, self.eps), residual
        if residual is None:
            return self.forward(x), x
        residual.add_(x)
        return self.forward(residual), residual


class Attention(nn.Module):
    """Fused QKV -> [q/k RMSNorm over the projections] -> [clip] -> [per-head q/k RMSNorm]
    -> RoPE -> backend attention -> o_proj [-> the ranks' partial sums added].

    RoPE runs in torch ops (or the C++ ``elementwise`` kernel), except with a backend
    that ``fuses_rope`` (Triton): outside a compiled graph that backend gets q and k
    unrotated and rotates them in the launch that writes K/V to the pool. Every rope
    variant is a cos/sin table by then (scaling, attention factors, local bases),
    partial rotary is the kernel's too, and every model rotates neox style (GGUF's
    interleaved q/k rows are reordered at load), so the rule is the backend's
    capability and compilation alone.

    Under tensor parallelism ``config`` is this rank's (its heads: see
    radixlm.runtime.distributed.sharding) and o_proj's output is this rank's partial sum
    until ``tp`` adds them."""

    def __init__(
        self,
        config: ArchConfig,
        layer_id: int,
        backend: AttentionBackend,
        layers: LayerFactory,
        tp: TensorParallelGroup | None = None,
    ) -> None:
        super().__init__()
        self.layer_id, self.backend, self.tp = layer_id, backend, tp
        self.num_heads, self.num_kv_heads = config.num_heads, config.num_kv_heads
        self.head_dim = d = config.head_dim
        self.rotary_dims = config.rotary_dims
        self.clip = config.clip_qkv
        qkv_rows = (self.num_heads + 2 * self.num_kv_heads) * d
        self.qkv_proj = layers.linear(config.hidden_size, qkv_rows, config.attention_bias)
        o_in = self.num_heads * d
        self.o_proj = layers.linear(o_in, config.hidden_size, config.o_proj_bias)
        eps, dtype, device = config.rms_norm_eps, layers.dtype, layers.device
        self.qk_norm = config.qk_norm
        q_dim, k_dim = (d, d) if config.qk_norm == "head" else (o_in, self.num_kv_heads * d)
        f32 = config.gemma_norms
        self.q_norm = RMSNorm(q_dim, eps, dtype, device, f32) if config.qk_norm else None
        self.k_norm = RMSNorm(k_dim, eps, dtype, device, f32) if config.qk_norm else None
        self.elementwise: ElementwiseKernels | None = None  # see use_elementwise_kernels
        # A backend that rotates q and k as it stores K/V (Triton's) gets them unrotated
        # (None: a model built for its shapes alone, on the meta device)
        fuses = backend is not None and backend.fuses_rope
        self.rotating = cast(RotatingBackend, backend) if fuses else None

    def forward(
        self,
        x: torch.Tensor,
        rope: RopeTables,
        attn_metadata: AttentionMetadata,
        output_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Every token's K/V goes to the pool; returns (T, hidden), or the
        ``output_rows`` rows only (o_proj runs for those alone)."""
        num_tokens, h, hkv, d = x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self.qkv_proj(x)  # (T, (H+2Hkv) D)
        if self.qk_norm == "full":
            self._norm_projections(qkv)
        if self.clip is not None:  # after the norms, as OLMoE does
            qkv = qkv.clamp_(-self.clip, self.clip)
        qkv = qkv.view(num_tokens, h + 2 * hkv, d)  # (T, H+2Hkv, D)
        cos, sin = rope
        head_norms = self.qk_norm == "head"
        v = qkv[:, h + hkv :]  # (T, Hkv, D)
        if elementwise_ready(self.elementwise) and self.rotary_dims == d:
            norms = None
            if head_norms and self.q_norm is not None and self.k_norm is not None:
                norms = (self.q_norm.weight, self.k_norm.weight, self.q_norm.eps)
            self.elementwise.rope(qkv, h, hkv, cos, sin, norms)  # in place
            q, k = qkv[:, :h], qkv[:, h : h + hkv]
        else:
            qk = qkv[:, : h + hkv]  # (T, H+Hkv, D): q and k heads rotate together
            if head_norms:
                qk = self._norm_heads(qk)
            if self.rotating is not None and not torch.compiler.is_compiling():
                # the backend rotates q and k in the launch that stores K/V
                q, k = qk[:, :h], qk[:, h:]  # (T, H, D), (T, Hkv, D)
                out = self.rotating.forward_rotating(
                    self.layer_id, q, k, v, rope, attn_metadata
                )  # (T, H, D)
                return self._project(out.reshape(num_tokens, h * d), output_rows)
            q, k = self._rotate(qk, cos, sin).split([h, hkv], dim=1)  # (T, H, D), (T, Hkv, D)
        out = self.backend.forward(self.layer_id, q, k, v, attn_metadata)  # (T, H, D)
        return self._project(out.reshape(num_tokens, h * d), output_rows)

    def _project(self, out: torch.Tensor, output_rows: torch.Tensor | None) -> torch.Tensor:
        """Attention's (T, H * D) output -> o_proj over ``output_rows`` (all: None), the
        ranks' partial sums added."""
        if output_rows is not None:
            out = out[output_rows]  # (N, H * D)
        out = self.o_proj(out)  # (T or N, hidden)
        return out if self.tp is None else self.tp.all_reduce(out)

    def _rotate(self, qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """RoPE over each head's leading ``rotary_dims`` dims; the rest pass through."""
        r = self.rotary_dims
        if r == self.head_dim:
            return apply_rope(qk, cos, sin)
        return torch.cat((apply_rope(qk[..., :r], cos, sin), qk[..., r:]), dim=-1)

    def _norm_heads(self, qk: torch.Tensor) -> torch.Tensor:
        """Per-head RMSNorm (q and k weights differ) in one pass over q and k."""
        assert self.q_norm is not None and self.k_norm is not None
        h, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        weight = torch.cat((self.q_norm.weight.expand(h, d), self.k_norm.weight.expand(hkv, d)))
        if self.q_norm.in_float32:
            return (F.rms_norm(qk.float(), (d,), None, self.q_norm.eps) * weight).to(qk.dtype)
        return F.rms_norm(qk, (d,), None, self.q_norm.eps) * weight  # (T, H+Hkv, D)

    def _norm_projections(self, qkv: torch.Tensor) -> None:
        """RMSNorm over the whole q and the whole k projection (OLMoE), in place."""
        assert self.q_norm is not None and self.k_norm is not None
        q_dim, k_dim = self.q_norm.weight.shape[0], self.k_norm.weight.shape[0]
        q, k = qkv[:, :q_dim], qkv[:, q_dim : q_dim + k_dim]
        if self.tp is not None:  # the norm spans every rank's heads
            self._norm_sharded_projections(q, k)
            return
        q.copy_(self.q_norm(q))
        k.copy_(self.k_norm(k))

    def _norm_sharded_projections(self, q: torch.Tensor, k: torch.Tensor) -> None:
        """``_norm_projections`` over this rank's heads of projections every rank holds
        a part of: the sums of squares are added over the ranks (a KV head replicated
        on several ranks counted once), in float32."""
        assert self.tp is not None and self.q_norm is not None and self.k_norm is not None
        arch, plan = self.tp.plan.arch, self.tp.plan
        sums = torch.stack((q.float().square().sum(-1), k.float().square().sum(-1)), dim=1)
        sums[:, 1] *= plan.holds_kv_sum  # (T, 2)
        self.tp.all_reduce(sums)
        widths = torch.tensor(
            [arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim],
            dtype=torch.float32,
            device=sums.device,
        )
        scales = torch.rsqrt(sums / widths + self.q_norm.eps)  # (T, 2)
        for part, norm, scale in ((q, self.q_norm, scales[:, :1]), (k, self.k_norm, scales[:, 1:])):
            part.copy_(part.float() * scale * norm.weight.float())


class DecoderLayer(nn.Module):
    def __init__(
        self,
        config: ArchConfig,
        layer_id: int,
        backend: AttentionBackend,
        layers: LayerFactory,
        tp: TensorParallelGroup | None = None,
    ) -> None:
        super().__init__()
        eps, dtype, device = config.rms_norm_eps, layers.dtype, layers.device
        hidden, f32 = config.hidden_size, config.gemma_norms
        self.sliding = config.window_of(layer_id) is not None
        self.tp = tp
        self.input_layernorm = RMSNorm(hidden, eps, dtype, device, f32)
        self.self_attn = Attention(config, layer_id, backend, layers, tp)
        # Llama: the norm before the MLP; Gemma: the norm of attention's output
        self.post_attention_layernorm = RMSNorm(hidden, eps, dtype, device, f32)
        self.gemma_norms = config.gemma_norms
        if config.gemma_norms:
            self.pre_feedforward_layernorm = RMSNorm(hidden, eps, dtype, device, f32)
            self.post_feedforward_layernorm = RMSNorm(hidden, eps, dtype, device, f32)
        self.mlp: MLP | SparseMoE
        if config.is_sparse(layer_id):
            self.mlp = SparseMoE(config, layers)
        else:
            self.mlp = MLP(
                hidden, config.intermediate_size, config.mlp_bias, config.hidden_act, layers
            )

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        rope: RopeTables,
        attn_metadata: AttentionMetadata,
        output_rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden: the previous block's output, not yet in ``residual`` (T, hidden).

        Returns (this layer's MLP output, residual stream), both (T, hidden), or
        both (N, hidden) for the ``output_rows`` alone: every token's K/V is
        still written, but o_proj and the MLP run for those rows only.
        """
        x, residual = self.input_layernorm.add_and_norm(hidden, residual)
        x = self.self_attn(x, rope, attn_metadata, output_rows)
        if output_rows is not None:
            residual = residual[output_rows]
        if not self.gemma_norms:
            x, residual = self.post_attention_layernorm.add_and_norm(x, residual)
            return self._mlp(x), residual
        x, residual = self.pre_feedforward_layernorm.add_and_norm(
            self.post_attention_layernorm(x), residual
        )
        return self.post_feedforward_layernorm(self._mlp(x)), residual

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        """The MLP (or experts) of x, the ranks' partial sums added."""
        out = self.mlp(x)
        return out if self.tp is None else self.tp.all_reduce(out)


class DecoderModel(nn.Module):
    """Embedding, decoder layers and final norm; returns final hidden states."""

    def __init__(
        self,
        config: ArchConfig,
        backend: AttentionBackend,
        layers: LayerFactory,
        embed_tokens: nn.Module,
        tp: TensorParallelGroup | None = None,
    ) -> None:
        super().__init__()
        self.embed_tokens = embed_tokens  # (V, hidden) lookup; the LM head's when tied
        self.tp = tp
        self.layers = nn.ModuleList(
            DecoderLayer(config, i, backend, layers, tp) for i in range(config.num_layers)
        )
        dtype, device = layers.dtype, layers.device
        self.norm = RMSNorm(
            config.hidden_size, config.rms_norm_eps, dtype, device, config.gemma_norms
        )
        self.rotary_emb = RotaryEmbedding.from_config(config, dtype, device)
        # Gemma 3's sliding layers rotate with their own base
        self.local_rotary_emb = (
            RotaryEmbedding.from_config(config, dtype, device, local=True)
            if config.local_rope_theta is not None
            else None
        )
        # Gemma scales embeddings by sqrt(hidden), rounded to the activations' dtype
        self.embed_scale = math.sqrt(config.hidden_size) if config.gemma_norms else None

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(T,) token ids -> (T, hidden) input of the first layer."""
        if self.tp is not None:  # this rank holds a slice of the vocabulary
            hidden = self.tp.embed(self.embed_tokens, input_ids)
        else:
            hidden = self.embed_tokens(input_ids)
        if self.embed_scale is not None:
            hidden = hidden * torch.tensor(self.embed_scale, dtype=hidden.dtype)
        return hidden

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn_metadata: AttentionMetadata,
        output_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        hidden = self.embed(input_ids)  # (T, hidden)
        rope = self.rotary_emb(positions)  # shared by every layer (of its kind)
        local = rope if self.local_rotary_emb is None else self.local_rotary_emb(positions)
        residual = None
        *layers, last = self.layers
        for layer in layers:
            layer_rope = local if layer.sliding else rope
            hidden, residual = layer(hidden, residual, layer_rope, attn_metadata)
        # Only the rows the caller projects leave the last layer (llama.cpp does the
        # same): a 1,000-token prompt skips 999 rows of its last o_proj and MLP.
        last_rope = local if last.sliding else rope
        hidden, residual = last(hidden, residual, last_rope, attn_metadata, output_rows)
        return self.norm.add_and_norm(hidden, residual)[0]  # (T or N, hidden)


class DecoderForCausalLM(nn.Module):
    """A decoder-only causal LM whose attention runs through ``attn_backend``.

    Built with uninitialised weights; fill them with ``radixlm.runtime.models.load_model``
    (or ``load_weights``). Parameters never require grad. Call under
    ``torch.inference_mode()``.

    With ``config.tie_word_embeddings`` the ``lm_head`` shares the embedding
    matrix (one parameter, ``model.embed_tokens.weight``; one int8 matrix when
    quantized). ``quantization`` stores the linear layers' weights quantized
    (radixlm.runtime.layers.quantization); ``dtype`` is then the activations'.

    ``tp``: this model is one rank's shard of a tensor-parallel model, ``config`` that
    rank's (``ShardPlan.local_arch``): every row-parallel block's output is added over
    the ranks, and the vocabulary's slices are joined (radixlm.runtime.distributed).
    """

    def __init__(
        self,
        config: ArchConfig,
        attn_backend: AttentionBackend,
        dtype: torch.dtype = torch.float32,
        device: Device = "cpu",
        quantization: Quantization | None = None,
        tp: TensorParallelGroup | None = None,
    ) -> None:
        super().__init__()
        self.config, self.dtype, self.quantization = config, dtype, quantization
        self.device = torch.device(device)
        self.tp = tp
        layers = LayerFactory(dtype, device, quantization)
        embed_tokens, lm_head = layers.vocab_layers(
            config.vocab_size, config.hidden_size, config.tie_word_embeddings
        )
        # The model first: a tied matrix is named model.embed_tokens.weight, as in HF files
        self.model = DecoderModel(config, attn_backend, layers, embed_tokens, tp)
        self.lm_head = lm_head
        self.requires_grad_(False)

    @property
    def quantized(self) -> bool:
        """Whether any layer holds its weight quantized (built so, or rebuilt by a
        quantized file's loader: radixlm.runtime.models.layer_storage)."""
        return any(isinstance(m, QuantizedLinear | QuantizedEmbedding) for m in self.modules())

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
        """hidden: (N, hidden) -> (N, V) float32 logits (soft-capped where the model
        caps them: c * tanh(logits / c))."""
        logits = self.lm_head(hidden).float()
        if self.tp is not None:  # this rank's vocabulary slice -> the whole vocabulary
            logits = self.tp.gather_vocab(logits)
        cap = self.config.final_logit_softcap
        if cap is not None:
            logits = torch.tanh(logits / cap).mul_(cap)
        return logits

    def fold_norm_offsets(self) -> None:
        """Stores ``1 + w`` in every norm of a Gemma model (whose norms compute
        ``x * (1 + w)`` from the checkpoint's ``w``); the loader calls it once."""
        if not self.config.gemma_norms:
            return
        for module in self.modules():
            if isinstance(module, RMSNorm):
                module.weight.data += 1.0  # float32 weights: exact for |w| < 2^23 ulp

    def use_elementwise_kernels(self, kernels: ElementwiseKernels) -> None:
        """Runs the eager passes' RMSNorms, RoPE (with per-head q/k norms) and SwiGLU
        activation through radixlm's C++ single-pass kernels (float32 or bfloat16 on
        CPU; a compiled graph keeps the torch ops). Float32 results equal the torch
        ops' up to float32 summation order; bfloat16 ones are computed in float32 and
        rounded once, where torch rounds after each op."""
        if self.dtype not in ROW_DTYPES or self.device.type != "cpu":
            raise ValueError("the elementwise kernels run float32 and bfloat16 models on CPU")
        for module in self.modules():
            if isinstance(module, RMSNorm | Attention | MLP):
                module.elementwise = kernels
