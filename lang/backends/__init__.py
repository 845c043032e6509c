"""The models a DSL program runs on, behind one ``Backend`` protocol: ``Runtime``
(radixlm's engine in this process)."""

from radixlm.backends.base import Backend
from radixlm.backends.runtime import Runtime

__all__ = ["Backend", "Runtime"]
