"""Small passes through C++ decoder-layer kernels (float32 or bfloat16 on CPU).

A decode step of one request, or of a few dozen, is a stream over every weight
for a few rows. Run as the eager model, each layer is ~20 torch ops (norms,
RoPE, SwiGLU, the four projections), each with its own dispatch and OpenMP
fork/join, and MKL's GEMM is slow for so few rows, where a product that reads
each weight once a pass is not (benchmarks/README.md, "CPU paths and kernels").
``SmallBatchForward`` runs a pass of at most ``MAX_ROWS`` (64) tokens through
``radixlm.kernels.cpu.small_batch`` instead:

- a pass of decode rows only, with a backend whose decode rows attend through
  the C++ kernel (the "cpu" backend: ``kernel_attention``): one call for the whole step (every
  layer, its K/V written to the pool as the backend would, and the final norm;
  ``decode_step``); so does a pass verifying speculative proposals, each of its
  tokens a decode row (its verified tokens are then computed exactly as the decode
  passes without speculation would compute them, bfloat16 included); a quantized
  pool gets the new K/V quantized in C++ as ``KVPool.write`` would store them;
  a bfloat16 model's step reads the copies of its matrices ``Linear.prepare``
  keeps for oneDNN (``blocked_layers``), where the build has AVX512-BF16;
- any other such pass (a short prompt's prefill, or with the torch backend):
  two calls per layer around the attention backend::

    qkv = attention_in(layer, residual, hidden, cos, sin)    # norm, QKV, q/k norm, RoPE
    attn = backend.forward(layer, q, k, v, metadata)         # writes K/V, attends
    hidden = mlp(layer, attn, residual)                      # o_proj, norm, SwiGLU MLP

A model whose layers hold quantized weights (int4, int8 per row or in groups:
radixlm.runtime.layers.quantization) runs its whole decode steps here too, each
matrix read as it is stored (``QuantizedMatrix``): one call a step, where the
eager model spends ~2 ms of a default-model step in dispatch around its products;
its other passes keep the model's own path. So does a mixture-of-experts model
whose attention matrices and experts are quantized (Qwen3-MoE, Mixtral; no shared
expert): each layer's router, routes and experts run inside the step
(``MoeLayerWeights``), where the eager model spent ~0.8 ms a layer around its
products on Qwen3-30B-A3B's shape.

It also gives a float LM head the few-row product, up to ``LINEAR_MAX_ROWS`` (16)
rows. It computes what the model's ``forward`` computes, with float32 sums in
another order; with bfloat16 weights its activations stay float32 between the
weights (the eager model
rounds them to bfloat16 after every op), and K/V, q and the attention output
are rounded to the pool's bfloat16. A single stream decodes faster this way than
compiled or eager (benchmarks/README.md, "CPU paths and kernels").
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from radixlm.kernels.cpu.small_batch import (
    MAX_ROWS,
    DecoderLayerWeights,
    DecodeStepWeights,
    MoeLayerWeights,
    QuantizedMatrix,
    SmallBatchKernels,
)
from radixlm.runtime.attention import AttentionBackend, kernel_attention
from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.layers.quantization import (
    FEW_ROWS_MAX,
    Int8GroupWeight,
    QuantizedLinear,
    kernel_matrix,
)
from radixlm.runtime.models.decoder import DecoderForCausalLM, DecoderLayer
from radixlm.runtime.models.moe import SparseMoE

__all__ = ["INT8G_STEP_MAX_ROWS", "SmallBatchForward", "blocked_layers"]

# The most rows of a whole quantized decode step over int8-group layers (a GGUF file's
# 5-, 6- and 8-bit blocks): their VNNI tiles convert and scale every dot product, so
# past this the eager model's dequantize + GEMM decodes faster. The default model's
# Q4_K_M file (mostly Q5_0 here), 64 new tokens, three alternating pairs: batch 16 whole
# step 434.6 / 387.0 / 372.5 out tok/s against the eager model's 421.8 / 342.4 / 350.5,
# batch 32 495.1 / 371.9 / 459.8 against 556.4 / 512.9 / 481.6 (benchmarks/README.md,
# "Quantized prompt passes").
INT8G_STEP_MAX_ROWS = 16


class SmallBatchForward:
    """Runs the passes ``accepts`` takes; see the module doc."""

    def __init__(
        self,
        model: DecoderForCausalLM,
        backend: AttentionBackend,
        kernels: SmallBatchKernels,
        max_rows: int | None = None,
    ) -> None:
        """``max_rows``: the most tokens of a pass run here (None: ``MAX_ROWS``; fewer
        where larger passes measured slower than torch's path: ``cpu_paths``).
        Raises KernelShapeError when the model's weights do not suit the kernels
        (``supports`` says whether they can)."""
        self.model, self.backend, self.kernels = model, backend, kernels
        self.max_rows = MAX_ROWS if max_rows is None else min(max_rows, MAX_ROWS)
        weights = _moe_layer_weights if model.config.moe is not None else _layer_weights
        self.layers = tuple(weights(layer) for layer in model.model.layers)
        # Quantized matrices have the whole step only: their other passes run the model.
        # Past FEW_ROWS_MAX rows the products are compute-bound and the model's
        # dequantize + GEMM is faster (benchmarks/README.md, "Quantized weights"); with
        # int8-group layers past INT8G_STEP_MAX_ROWS.
        self.quantized = model.quantized
        if self.quantized:
            self.max_rows = min(self.max_rows, FEW_ROWS_MAX)
            if _int8_group_layers(model):
                self.max_rows = min(self.max_rows, INT8G_STEP_MAX_ROWS)
        # With a backend whose decode rows attend through the C++ kernel, a pass of
        # decode rows only runs whole in one call, attention included (its pool
        # was checked by the backend). Not over a KIVI pool: the step's kernel reads
        # float or int8/fp8 slots, and a KIVI pass stores through its KiviWrites.
        # A bfloat16 model's step reads oneDNN's blocked copies of its matrices where
        # this build can (``blocked_layers``); its other passes the plain weights.
        self.step: DecodeStepWeights | None = None
        if kernel_attention(backend).decode and not backend.kv_pool.kivi:
            step_layers = blocked_layers(kernels, model) or self.layers
            self.step = DecodeStepWeights.of(kernels, step_layers, model.model.norm.weight)
        if self.step is None or self.step.layers is not self.layers:
            for weights in self.layers:
                kernels.check_layer(weights)
        if not self.quantized:  # a quantized model's head is quantized too: its own kernel
            model.lm_head.use_small_batch(kernels)
        self.passes = 0  # passes run here
        self.whole_steps = 0  # of which decode passes in one call

    @staticmethod
    def supports(model: torch.nn.Module) -> bool:
        """Whether the model is one the kernels can run: Llama layers
        (``ArchConfig.llama_layers``) with float32 or bfloat16 weights, or every
        layer matrix quantized in a storage the kernels read (``_matrix``), on CPU;
        or Llama attention with every MLP a mixture of quantized experts in one
        call (``SparseMoE.use_cpu_experts``: call it first), without a shared expert
        or a router bias, the attention matrices quantized."""
        if not (
            isinstance(model, DecoderForCausalLM)
            and model.config.llama_attention
            and model.dtype in (torch.float32, torch.bfloat16)
            and model.device.type == "cpu"
        ):
            return False
        if model.config.moe is not None:
            return model.quantized and all(_moe_step_layer(layer) for layer in model.model.layers)
        if not model.quantized:
            return True
        return all(
            isinstance(_matrix(linear), QuantizedMatrix)
            for layer in model.model.layers
            for linear in _projections(layer)
        )

    def accepts(self, batch: ForwardBatch) -> bool:
        """Whether this pass has between 1 and ``max_rows`` tokens (for quantized
        weights: and runs as one whole decode step)."""
        if not 0 < batch.input_ids.numel() <= self.max_rows:
            return False
        return not self.quantized or self._whole_step(batch)

    def _whole_step(self, batch: ForwardBatch) -> bool:
        """Whether the pass runs as one ``decode_step``: each token a decode row (the
        batch builder tells the longest extend as a host int: no tensor is read)."""
        return self.step is not None and (
            batch.proposals is not None or batch.attn.longest_extend == 1
        )

    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """The pass's final hidden states (T, hidden), as ``model(...)`` returns them."""
        inner, inputs, dtype = self.model.model, batch.attn, self.model.dtype
        # Activations are float32 whatever the weights (a new tensor: the kernels
        # update the residual stream in place); K/V and attention in the pool's dtype.
        residual = inner.embed_tokens(batch.input_ids).float()  # (T, hidden)
        cos, sin = (t.float() for t in inner.rotary_emb(batch.positions))  # (T, D/2) each
        self.passes += 1
        if self._whole_step(batch):
            # Each token a decode row: the one at position p of table row r attends to
            # r's positions [0, p) in the pool, then itself. The step writes a layer's
            # K/V of every token before any attends, so a verify block's token j sees
            # the block's tokens before it: causal, as the extend it is. And a verified
            # token is computed exactly as the decode pass that would compute it alone.
            self.whole_steps += 1
            pool = self.backend.kv_pool
            return self.kernels.decode_step(
                self.step, residual, cos, sin, pool.k, pool.v, self.backend.req_to_token.table,
                torch.repeat_interleave(inputs.rows, inputs.extend_lens), batch.positions,
                inputs.out_cache_loc, self.backend.scale, pool.k_scale, pool.v_scale,
            ).to(dtype)  # fmt: skip
        metadata = self.backend.prepare(inputs)
        rows, hidden = residual.shape[0], None
        for layer_id, weights in enumerate(self.layers):
            h, hkv = weights.heads, weights.kv_heads
            qkv = self.kernels.attention_in(weights, residual, hidden, cos, sin)
            qkv = qkv.to(dtype).view(rows, h + 2 * hkv, weights.head_dim)
            q, k, v = qkv[:, :h], qkv[:, h : h + hkv], qkv[:, h + hkv :]
            attn = self.backend.forward(layer_id, q, k, v, metadata)  # (T, H, D)
            hidden = self.kernels.mlp(
                weights, attn.reshape(rows, -1).float().contiguous(), residual
            )
        residual += hidden
        norm = inner.norm
        return F.rms_norm(residual, (residual.shape[1],), norm.weight.float(), norm.eps).to(dtype)


def _moe_step_layer(layer: DecoderLayer) -> bool:
    """Whether the step takes this layer: its MLP a mixture of experts the kernels
    run in one call, no shared expert, no router bias, attention matrices quantized."""
    attn, moe = layer.self_attn, layer.mlp
    return (
        isinstance(moe, SparseMoE)
        and moe.cpu_experts is not None
        and moe.shared_expert is None
        and moe.gate.bias is None
        and all(isinstance(_matrix(p), QuantizedMatrix) for p in (attn.qkv_proj, attn.o_proj))
    )


def _moe_layer_weights(layer: DecoderLayer) -> MoeLayerWeights:
    moe = layer.mlp
    router = moe.gate.weight.contiguous()  # (E, hidden), as the kernels read it
    assert moe.cpu_experts is not None  # supports() said so
    return MoeLayerWeights(
        **_attention_half(layer),
        router=router,
        experts=moe.cpu_experts[1],
        top_k=moe.top_k,
        normalize=moe.normalize,
    )


def _attention_half(layer: DecoderLayer) -> dict:
    """The fields every layer's weights share: norms, the attention's matrices and
    its shape."""
    attn = layer.self_attn
    return {
        "input_norm": layer.input_layernorm.weight,
        "qkv": _matrix(attn.qkv_proj),
        "qkv_bias": attn.qkv_proj.bias,
        "q_norm": None if attn.q_norm is None else attn.q_norm.weight,
        "k_norm": None if attn.k_norm is None else attn.k_norm.weight,
        "o": _matrix(attn.o_proj),
        "o_bias": attn.o_proj.bias,
        "post_norm": layer.post_attention_layernorm.weight,
        "eps": layer.input_layernorm.eps,
        "heads": attn.num_heads,
        "kv_heads": attn.num_kv_heads,
        "head_dim": attn.head_dim,
    }


def _int8_group_layers(model: DecoderForCausalLM) -> bool:
    """Whether a decoder layer (its experts included) holds an int8-group weight."""
    return any(
        isinstance(m, QuantizedLinear) and isinstance(m.qweight, Int8GroupWeight)
        for m in model.model.layers.modules()
    )


def _projections(layer: DecoderLayer) -> tuple[torch.nn.Module, ...]:
    attn, mlp = layer.self_attn, layer.mlp
    return attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj


def _matrix(linear: torch.nn.Module) -> torch.Tensor | QuantizedMatrix | None:
    """The layer's weight as the kernels read it: a float weight as it is, a
    quantized one as a ``QuantizedMatrix`` (``kernel_matrix``; None: not readable)."""
    if not isinstance(linear, QuantizedLinear):
        return linear.weight
    return kernel_matrix(linear.qweight)


def blocked_layers(
    kernels: SmallBatchKernels, model: DecoderForCausalLM
) -> tuple[DecoderLayerWeights, ...] | None:
    """A bfloat16 model's layers with their four matrices as ``BlockedMatrix``
    operands over the copies ``Linear.prepare`` made for oneDNN, which the few-row
    product reads faster than the plain weights (benchmarks/README.md, "CPU paths and
    kernels"); None where any matrix has no such copy or this build cannot read one
    (no AVX512-BF16, another layout, a quantized or float32 model)."""
    if model.quantized or model.dtype != torch.bfloat16 or not kernels.bf16_blocked:
        return None
    layers = []
    for layer in model.model.layers:
        blocked = {}
        for name, linear in zip(("qkv", "o", "gate_up", "down"), _projections(layer)):
            packed = getattr(linear, "packed", None)
            matrix = None if packed is None else kernels.blocked_matrix(linear.weight, packed)
            if matrix is None:
                return None
            blocked[name] = matrix
        layers.append(dataclasses.replace(_layer_weights(layer), **blocked))
    return tuple(layers)


def _layer_weights(layer: DecoderLayer) -> DecoderLayerWeights:
    mlp = layer.mlp
    return DecoderLayerWeights(
        **_attention_half(layer),
        gate_up=_matrix(mlp.gate_up_proj),
        gate_up_bias=mlp.gate_up_proj.bias,
        down=_matrix(mlp.down_proj),
        down_bias=mlp.down_proj.bias,
    )
