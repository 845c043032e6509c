"""Model building blocks shared by every architecture: the linear layers (float ones
with the CPU few-row product and oneDNN-packed weights; int8 / int4 quantized ones)
and the factory a model file asks for them."""

from radixlm.runtime.layers.factory import LayerFactory, prepare_layers
from radixlm.runtime.layers.linear import Linear
from radixlm.runtime.layers.quantization import (
    Quantization,
    QuantizationError,
    QuantizedEmbedding,
    QuantizedLinear,
)

__all__ = [
    "LayerFactory",
    "Linear",
    "Quantization",
    "QuantizationError",
    "QuantizedEmbedding",
    "QuantizedLinear",
    "prepare_layers",
]
