"""Giving each linear layer of a built model the storage its checkpoint tensors want.

A quantized file (GGUF, AWQ, GPTQ, compressed-tensors, FP8) decides layer by layer
how a weight is held best: the model is built with one storage for every layer and
each layer whose file tensors another storage holds better is rebuilt with it before
the weights are loaded. A fused layer (q/k/v, gate/up) looks at all its parts.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

from radixlm.runtime.layers.factory import LayerFactory
from radixlm.runtime.layers.linear import Linear
from radixlm.runtime.layers.quantization import Quantization, QuantizedLinear
from radixlm.runtime.models.decoder import DecoderForCausalLM
from radixlm.runtime.models.loader import FUSED_PARTS
from radixlm.runtime.models.moe import SparseMoE

__all__ = ["layer_shape", "part_names", "restore_layers", "weight_layers"]

StorageRule = Callable[[str, tuple[int, int]], Quantization | None]
"""(a layer's module name, its (out, in) features) -> the storage it takes (None: float)."""


def weight_layers(
    model: DecoderForCausalLM, with_head: bool = False
) -> list[tuple[str, Linear | QuantizedLinear]]:
    """The linear layers the layer factory built but the MoE routers (always float),
    and the LM head only when ``with_head`` (else it is the vocabulary's)."""
    routers = {
        f"{name}.{gate}"
        for name, module in model.named_modules()
        if isinstance(module, SparseMoE)
        for gate in ("gate", "shared_expert_gate")
    }
    return [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, Linear | QuantizedLinear)
        and (with_head or name != "lm_head")
        and name not in routers
    ]


def layer_shape(linear: Linear | QuantizedLinear) -> tuple[int, int]:
    """(out, in) features."""
    if isinstance(linear, Linear):
        out_features, in_features = linear.weight.shape
        return out_features, in_features
    return linear.out_features, linear.in_features


def part_names(module_name: str) -> list[str]:
    """The checkpoint module names a (possibly fused) linear layer is filled from: the
    layer itself (Phi-3's fused files) and its parts."""
    path, _, leaf = module_name.rpartition(".")
    parts = [hf for hf, (fused, _) in FUSED_PARTS.items() if fused == leaf]
    prefix = f"{path}." if path else ""
    return [f"{prefix}{part}" for part in [leaf, *parts]]


def restore_layers(
    model: DecoderForCausalLM,
    layers: list[tuple[str, Linear | QuantizedLinear]],
    built_with: Quantization | None,
    storage: StorageRule,
) -> collections.Counter[str]:
    """Rebuilds each of ``layers`` whose ``storage`` differs from what the model was
    built with; returns how many layers take each storage ("float" for None)."""
    kinds: collections.Counter[str] = collections.Counter()
    for name, linear in layers:
        out_features, in_features = layer_shape(linear)
        chosen = storage(name, (out_features, in_features))
        kinds[chosen.method if chosen else "float"] += 1
        if chosen == built_with:
            continue
        rebuilt = LayerFactory(model.dtype, model.device, chosen).linear(
            in_features, out_features, linear.bias is not None
        )
        parent, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent), leaf, rebuilt)
    return kinds
