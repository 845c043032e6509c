"""Building the model an ``EngineConfig`` names: its files and config, the device and
dtype it runs in, and the model (this rank's shard, under tensor parallelism) with
its weights, from a model directory or a GGUF file.

What every rank builds around the model (KV pool, attention backend, CPU kernels) is
the executor's ``build_model_shard`` (radixlm.runtime.executor.model_shard).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from radixlm.runtime.attention import AttentionBackend
from radixlm.runtime.config import ConfigError, EngineConfig
from radixlm.runtime.device import resolve_device
from radixlm.runtime.layers.linear import native_bf16
from radixlm.runtime.layers.quantization import Quantization, QuantizationError
from radixlm.runtime.model_store import ModelSource, resolve_model_source
from radixlm.runtime.models.checkpoint_formats import read_checkpoint_quantization
from radixlm.runtime.models.config import ArchConfig
from radixlm.runtime.models.decoder import DecoderForCausalLM
from radixlm.runtime.models.loader import load_model, parse_dtype
from radixlm.runtime.models.quantized_loader import load_quantized_model

if TYPE_CHECKING:
    from radixlm.runtime.distributed.group import TensorParallelGroup

__all__ = [
    "build_model",
    "quantized_checkpoint",
    "context_length",
    "resident_bytes",
    "resolve_dtype",
    "resolve_model",
    "weight_bytes",
]

logger = logging.getLogger(__name__)


def resolve_model(config: EngineConfig) -> tuple[ModelSource, ArchConfig, str]:
    """The model's files, its config and the device it runs on."""
    model = config.model
    source = resolve_model_source(
        model.model_path, model.from_gguf(), revision=model.revision, gguf_file=model.gguf_file
    )
    return source, ArchConfig.from_model_dir(source.model_dir), _device(config)


def _device(config: EngineConfig) -> str:
    try:
        return resolve_device(config.device)
    except ValueError as e:
        raise ConfigError(str(e)) from e


def quantized_checkpoint(source: ModelSource) -> bool:
    """Whether the model's files hold quantized weights (a GGUF file, or a checkpoint
    whose config names a quantization)."""
    return source.gguf is not None or read_checkpoint_quantization(source.model_dir) is not None


def resolve_dtype(name: str, device: str, quantized: bool = False) -> torch.dtype:
    """ "auto" -> bfloat16 on GPUs, for quantized weights (the activations' dtype of
    torch's quantized CPU kernels) and on CPUs that compute bf16 natively
    (AVX512-BF16 or AMX: ``native_bf16``); float32 on other CPUs.

    The rule is measured: on an AMD AVX512-BF16 CPU bfloat16 ran every workload of
    ``bench_peers.py`` faster than float32 (benchmarks/README.md, "Against vLLM's CPU
    build, llama.cpp and transformers" and "CPU paths and kernels"), and on an AVX2-only
    CPU bf16 has no kernels but emulation. The choice is logged.
    """
    if name != "auto":
        dtype = parse_dtype(name)
        if quantized and device == "cpu" and dtype == torch.float16:
            raise ConfigError("quantized weights on a CPU take float32 or bfloat16, not float16")
        return dtype
    if device == "cuda" or quantized:
        return torch.bfloat16
    if native_bf16():
        logger.info("dtype auto: bfloat16 (this CPU computes bf16 natively: AVX512-BF16 or AMX)")
        return torch.bfloat16
    logger.info("dtype auto: float32 (this CPU has no native bf16: no AVX512-BF16, no AMX)")
    return torch.float32


def context_length(config: EngineConfig, arch: ArchConfig) -> int:
    """``context_length`` as asked (ConfigError past the model's maximum), else the model's."""
    wanted = config.model.context_length
    if wanted is None:
        return arch.max_context_len
    if wanted > arch.max_context_len:
        raise ConfigError(
            f"context_length {wanted} exceeds the model's maximum {arch.max_context_len}"
        )
    return wanted


def build_model(
    source: ModelSource,
    backend: AttentionBackend,
    dtype: torch.dtype,
    device: str,
    arch: ArchConfig,
    quantization: Quantization | None,
    tp: TensorParallelGroup | None = None,
    expected_method: str | None = None,
) -> tuple[DecoderForCausalLM, str]:
    """The model (``tp``: this rank's shard) with its weights, and what they are stored
    as (``Placement.weights``): a GGUF file's or a quantized checkpoint's own storage
    (radixlm.runtime.models.quantized_loader), else ``quantization`` (None: ``dtype``).
    ``expected_method``: the checkpoint quantization the user named (ConfigError when
    the checkpoint is not so). A quantization a layer cannot take, or one asked of an
    already quantized checkpoint, is a ConfigError."""
    if source.gguf is not None:
        # lazy: imports gguf, which an engine on a model directory never needs
        from radixlm.runtime.models.gguf_loader import load_gguf_model

        return load_gguf_model(source.gguf, backend, dtype, device, arch, tp)
    checkpoint = read_checkpoint_quantization(source.model_dir)
    if expected_method is not None and (checkpoint is None or checkpoint.method != expected_method):
        found = checkpoint.describe() if checkpoint else "a float checkpoint"
        raise ConfigError(
            f"quantization {expected_method!r} asks for such a checkpoint; found {found}"
        )
    if checkpoint is not None:
        if quantization is not None:
            raise ConfigError(
                f"the checkpoint is already quantized ({checkpoint.describe()}); "
                f"drop quantization {quantization.describe()!r}"
            )
        return load_quantized_model(source.model_dir, checkpoint, backend, dtype, device, arch, tp)
    try:
        model = load_model(source.model_dir, backend, dtype, device, arch, quantization, tp)
    except QuantizationError as e:
        raise ConfigError(f"quantization {quantization.describe()}: {e}") from e  # type: ignore[union-attr]
    return model, quantization.describe() if quantization else str(dtype).removeprefix("torch.")


def resident_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters and buffers (a shared tensor counted once)."""
    tensors = {id(t): t for t in (*model.parameters(), *model.buffers())}
    return sum(t.nbytes for t in tensors.values())


def weight_bytes(
    arch: ArchConfig, dtype: torch.dtype, quantization: Quantization | None = None
) -> int:
    """The model's parameters and buffers in ``dtype``, counted on the meta device
    (an untied config whose checkpoint has no ``lm_head`` counts one too many; int4
    codes count a byte each, as they take while a GPU loads them)."""
    model = DecoderForCausalLM(arch, None, dtype, "meta", quantization)  # type: ignore[arg-type]
    return resident_bytes(model)
