"""The models a DSL program runs on, behind one ``Backend`` protocol: ``Runtime``
(radixlm's engine in this process) and ``RuntimeEndpoint`` (a radixlm server over
HTTP).

Each backend loads on first use, so that the protocol (which every program's
interpreter imports) needs neither the engine nor ``httpx``.
"""

from importlib import import_module
from typing import Any

from radixlm.backends.base import Backend

__all__ = ["Backend", "EndpointError", "Runtime", "RuntimeEndpoint"]

_LAZY = {
    "Runtime": "radixlm.backends.runtime",
    "RuntimeEndpoint": "radixlm.backends.runtime_endpoint",
    "EndpointError": "radixlm.backends.runtime_endpoint",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(module), name)
