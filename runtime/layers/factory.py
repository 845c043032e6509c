"""What a model file asks for when it builds a layer that holds a weight matrix.

A model names the layers it needs (a linear of this width, the vocabulary's
embedding and LM head); ``LayerFactory`` decides how they store their weights
(dtype, device, quantization), so no model file special-cases a quantization and
every family gets every storage.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.utils import skip_init

from radixlm.runtime.layers.linear import Linear, prepare_linears
from radixlm.runtime.layers.quantization import (
    Quantization,
    QuantizedEmbedding,
    QuantizedLinear,
    kernel_dtype,
)

__all__ = ["LayerFactory", "prepare_layers"]


@dataclass(frozen=True)
class LayerFactory:
    """dtype: the activations' dtype (and the weights', unquantized).
    quantization: how linear layers store their weights; None keeps them in dtype."""

    dtype: torch.dtype
    device: torch.device | str
    quantization: Quantization | None = None

    def linear(self, in_features: int, out_features: int, bias: bool) -> Linear | QuantizedLinear:
        """y = x W^T + b with W (out_features, in_features)."""
        if self.quantization is None:
            return Linear(in_features, out_features, bias, self.dtype, self.device)
        weight = self.quantization.weight(
            out_features, in_features, self._kernel_dtype, self.device
        )
        return QuantizedLinear(weight, bias, self.dtype, self.device)

    @property
    def _kernel_dtype(self) -> torch.dtype:
        return kernel_dtype(self.dtype, self.device)

    def vocab_layers(
        self, vocab_size: int, hidden_size: int, tied: bool
    ) -> tuple[nn.Module, Linear | QuantizedLinear]:
        """(token embedding, LM head); ``tied`` makes them one (vocab, hidden) matrix.

        Quantized, both are int8 per channel whatever the method, or int8 groups for
        int8g (``Quantization.vocabulary``; see radixlm.runtime.layers.quantization),
        and a tied pair reads one int8 matrix."""
        if self.quantization is None:
            embedding = skip_init(
                nn.Embedding, vocab_size, hidden_size, dtype=self.dtype, device=self.device
            )
            shared = embedding.weight if tied else None
            head = Linear(
                hidden_size, vocab_size, False, self.dtype, self.device, shared_weight=shared
            )
            return embedding, head
        storage = self.quantization.vocabulary()
        head_weight = storage.weight(vocab_size, hidden_size, self._kernel_dtype, self.device)
        head = QuantizedLinear(head_weight, False, self.dtype, self.device)
        embedding_weight = (
            head_weight
            if tied
            else storage.weight(vocab_size, hidden_size, self._kernel_dtype, self.device)
        )
        return QuantizedEmbedding(embedding_weight, self.dtype), head


def prepare_layers(model: nn.Module) -> None:
    """Readies every weight-holding layer for its kernels once the weights are final:
    lays float weights out (``Linear.prepare``), packs quantized ones."""
    prepare_linears(model)
    for module in model.modules():
        if isinstance(module, QuantizedLinear):
            module.prepare()
