"""The mixture-of-experts MLP (Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE).

Each token's router logits pick its experts::

    probs = softmax(gate(x))  (float32)        weights, ids = top_k(probs)
    weights /= weights.sum()  where the family normalises (``MoEConfig.normalize_top_k``)
    out = sum_j weights[j] * expert[ids[j]](x)  (+ sigmoid(shared_gate(x)) * shared(x))

exactly as transformers routes (the same ops in the same dtypes, so the same
experts, ties included: ``torch.topk`` over the same probabilities). The router
stays in the activations' dtype whatever the model's quantization (it is tiny,
and a changed logit changes which experts run).

Experts are computed grouped by expert: the (token, choice) pairs are sorted by
expert once per layer, and each expert that got tokens runs its gated MLP once on
all of them (a matmul of as many rows, through whatever kernel its storage uses:
float, int8, int4; the experts are ordinary linear layers of the ``LayerFactory``).
An expert no token chose is never touched. On a CPU, quantized experts (int4, int8;
SwiGLU, no bias) run a pass of up to ``FEW_ROWS_MAX`` tokens in one C++ call
instead (``use_cpu_experts``: every chosen expert's products, SwiGLU and the
weighted sum in one parallel region, where the loop pays a dispatch per expert per
layer). On a GPU, float experts are stacked into
two (E, rows, cols) tensors once loaded (``stack_experts``; each expert's weight then
a view of its slice) and ``radixlm.kernels.triton.moe`` runs them all in grouped
kernels, with no host sync.

Checkpoint names follow transformers' per-expert layout
(``mlp.experts.<e>.{gate,up,down}_proj``; Mixtral's ``block_sparse_moe.experts.<e>.w1/w3/w2``
are renamed by the loader); gate and up are fused into ``gate_up_proj`` like the
dense MLP's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.kernels.cpu.decode_attention import KernelShapeError
from radixlm.kernels.cpu.small_batch import ExpertTable, SmallBatchKernels
from radixlm.runtime.layers.factory import LayerFactory
from radixlm.runtime.layers.linear import Linear
from radixlm.runtime.layers.quantization import FEW_ROWS_MAX, QuantizedLinear, kernel_matrix
from radixlm.runtime.models.config import ArchConfig
from radixlm.runtime.models.mlp import MLP

__all__ = ["Routing", "SparseMoE", "route"]


@dataclass(frozen=True)
class Routing:
    """Each token's experts: weights (T, k) float32, ids (T, k) int64."""

    weights: torch.Tensor
    ids: torch.Tensor


def route(router_logits: torch.Tensor, top_k: int, normalize: bool) -> Routing:
    """Softmax over the experts in float32, the ``top_k`` largest, renormalised to
    sum to 1 when ``normalize`` (transformers' routers, step for step)."""
    probs = F.softmax(router_logits, dim=-1, dtype=torch.float32)  # (T, E)
    weights, ids = torch.topk(probs, top_k, dim=-1)  # (T, k) each
    if normalize:
        weights /= weights.sum(dim=-1, keepdim=True)
    return Routing(weights, ids)


class SparseMoE(nn.Module):
    """Router, experts and (Qwen2-MoE) the gated shared expert; see the module doc."""

    def __init__(self, config: ArchConfig, layers: LayerFactory) -> None:
        super().__init__()
        moe = config.moe
        assert moe is not None
        hidden, dtype, device = config.hidden_size, layers.dtype, layers.device
        self.top_k, self.normalize = moe.top_k, moe.normalize_top_k
        self.gate = Linear(hidden, moe.num_experts, False, dtype, device)
        self.experts = nn.ModuleList(
            MLP(hidden, moe.intermediate_size, False, config.hidden_act, layers)
            for _ in range(moe.num_experts)
        )
        self.shared_expert: MLP | None = None
        self.shared_expert_gate: Linear | None = None
        if moe.shared_expert_size is not None:
            self.shared_expert = MLP(
                hidden, moe.shared_expert_size, False, config.hidden_act, layers
            )
            self.shared_expert_gate = Linear(hidden, 1, False, dtype, device)
        self.activation = config.hidden_act
        self.stacked: tuple[torch.Tensor, torch.Tensor] | None = None  # see stack_experts
        self.cpu_experts: tuple[SmallBatchKernels, ExpertTable] | None = None  # use_cpu_experts
        self.experts_run = 0  # expert MLP calls of the loop so far (each on all its tokens)
        self.kernel_passes = 0  # passes whose experts ran in one C++ call

    def stack_experts(self) -> bool:
        """Stacks float experts' weights into (E, 2I, hidden) and (E, hidden, I) tensors
        for the Triton grouped kernel, each expert's weight becoming a view of its
        slice (no second copy). Returns False, changing nothing, for experts that
        are quantized or have a bias."""
        linears = [(e.gate_up_proj, e.down_proj) for e in self.experts]
        if not all(isinstance(m, Linear) and m.bias is None for pair in linears for m in pair):
            return False
        gate_up = torch.stack([g.weight.data.contiguous() for g, _ in linears])
        down = torch.stack([d.weight.data.contiguous() for _, d in linears])
        for e, (g, d) in enumerate(linears):
            g.weight.data, d.weight.data = gate_up[e], down[e]
        self.stacked = (gate_up, down)
        return True

    def use_cpu_experts(self, kernels: SmallBatchKernels) -> bool:
        """Runs the experts of passes of up to ``FEW_ROWS_MAX`` tokens in one C++ call
        (``SmallBatchKernels.moe``) where every expert is quantized in a storage the
        kernels read, has no bias and the activation is SwiGLU. Returns whether they
        do."""
        if self.activation != "silu":
            return False
        pairs = []
        for expert in self.experts:
            up, down = expert.gate_up_proj, expert.down_proj
            if not (isinstance(up, QuantizedLinear) and isinstance(down, QuantizedLinear)):
                return False
            matrices = kernel_matrix(up.qweight), kernel_matrix(down.qweight)
            if up.bias is not None or down.bias is not None or any(m is None for m in matrices):
                return False
            pairs.append(matrices)
        try:
            self.cpu_experts = (kernels, kernels.expert_table(pairs))
        except KernelShapeError:
            return False
        return True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (T, hidden) -> (T, hidden)."""
        routing = route(self.gate(x), self.top_k, self.normalize)
        if self.cpu_experts is not None and x.device.type == "cpu" and x.shape[0] <= FEW_ROWS_MAX:
            kernels, table = self.cpu_experts
            weights = routing.weights.contiguous()
            out = kernels.moe(x.float().contiguous(), table, routing.ids, weights).to(x.dtype)
            self.kernel_passes += 1
        elif self.stacked is not None:
            from radixlm.kernels.triton.moe import grouped_experts_triton  # lazy: triton, GPU

            out = grouped_experts_triton(
                x, *self.stacked, routing.weights, routing.ids, self.activation
            )
        else:
            out = self._experts(x, routing)
        if self.shared_expert is not None and self.shared_expert_gate is not None:
            shared = self.shared_expert(x) * torch.sigmoid(self.shared_expert_gate(x))
            out = out + shared
        return out

    def _experts(self, x: torch.Tensor, routing: Routing) -> torch.Tensor:
        """sum_j weights[t, j] * expert[ids[t, j]](x[t]), grouped by expert; float32
        sums, returned in x's dtype."""
        k = routing.ids.shape[1]
        choices = routing.ids.flatten()  # (T k,) the expert of each (token, choice)
        order = torch.argsort(choices, stable=True)  # choices grouped by expert
        counts = torch.bincount(choices, minlength=len(self.experts)).tolist()
        tokens = order // k  # the token of each choice, in expert order
        weighted = torch.empty((order.numel(), x.shape[1]), dtype=torch.float32, device=x.device)
        weights = routing.weights.flatten()[order, None]  # (T k, 1)
        start = 0
        for expert, count in enumerate(counts):
            if count == 0:
                continue  # an expert no token chose costs nothing
            rows = slice(start, start + count)
            start += count
            y = self.experts[expert](x[tokens[rows]])  # (count, hidden)
            torch.mul(y, weights[rows], out=weighted[rows])
            self.experts_run += 1
        # one scatter of every contribution (per expert, it cost more than the product)
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        return out.index_add_(0, tokens, weighted).to(x.dtype)
