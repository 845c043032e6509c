"""radixlm: a structured-generation program runtime.

``import radixlm as sgl`` is meant to run SGLang frontend programs; today the
package exports the offline ``Engine``. Importing ``radixlm`` stays cheap: the
engine (and torch) load on first use of ``radixlm.Engine``.
"""

from typing import TYPE_CHECKING, Any

from radixlm.runtime.errors import (
    InvalidRequestError,
    InvalidSamplingParamsError,
    ModelLoadError,
    ModelNotFoundError,
    RadixLMError,
)

if TYPE_CHECKING:
    from radixlm.runtime.entrypoints.engine import Engine

__all__ = [
    "Engine",
    "RadixLMError",
    "InvalidRequestError",
    "InvalidSamplingParamsError",
    "ModelLoadError",
    "ModelNotFoundError",
]


def __getattr__(name: str) -> Any:
    if name == "Engine":
        from radixlm.runtime.entrypoints.engine import Engine

        return Engine
    raise AttributeError(f"module 'radixlm' has no attribute {name!r}")
