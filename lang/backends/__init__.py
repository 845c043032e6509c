"""The models a DSL program runs on, behind one ``Backend`` protocol: ``Runtime``
(radixlm's engine in this process) and ``RuntimeEndpoint`` (a radixlm server over
HTTP)."""

from radixlm.backends.base import Backend
from radixlm.backends.runtime import Runtime
from radixlm.backends.runtime_endpoint import EndpointError, RuntimeEndpoint

__all__ = ["Backend", "EndpointError", "Runtime", "RuntimeEndpoint"]
