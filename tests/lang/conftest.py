"""DSL programs are written once and run on every backend: ``backend`` is each one
in turn, both on the session's engine: the in-process ``Runtime``, and
``RuntimeEndpoint`` talking HTTP to a radixlm server on 127.0.0.1 around it."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module", params=["runtime", "endpoint"])
def backend(request, engine):
    """A backend on the default model (float32), sharing the session's engine; per
    module, so that no module leaves a server running."""
    if request.param == "runtime":
        from radixlm.backends.runtime import Runtime

        runtime = Runtime(engine=engine)
        yield runtime
        runtime.shutdown()  # leaves the shared engine running
        return
    from radixlm.backends.runtime_endpoint import RuntimeEndpoint
    from tests.servers import running_server

    with running_server(engine) as server, RuntimeEndpoint(server.base_url) as endpoint:
        yield endpoint
