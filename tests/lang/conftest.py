"""DSL programs are written once and run on every backend: ``backend`` is each one
in turn (the in-process ``Runtime`` today; the HTTP endpoint joins with the server)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", params=["runtime"])
def backend(request, engine):
    """A backend on the default model (float32), sharing the session's engine."""
    from radixlm.backends.runtime import Runtime

    if request.param == "runtime":
        runtime = Runtime(engine=engine)
        yield runtime
        runtime.shutdown()  # leaves the shared engine running
