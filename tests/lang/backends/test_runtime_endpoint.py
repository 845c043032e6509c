"""RuntimeEndpoint's own behaviour: errors and the API key. (Every DSL program test
runs through it too: the ``backend`` fixture in tests/lang/conftest.py.)"""

from __future__ import annotations

import pytest

import radixlm as sgl
from radixlm.backends.runtime_endpoint import EndpointError, RuntimeEndpoint
from radixlm.runtime.errors import InvalidRequestError
from tests.servers import free_port, running_server


def test_a_server_that_is_not_there_is_an_endpoint_error():
    with pytest.raises(EndpointError, match="get_model_info"):
        RuntimeEndpoint(f"http://127.0.0.1:{free_port()}", timeout=2.0)


@sgl.function
def code(s):
    s += "Code: " + sgl.gen("c", regex="[A-Z", max_tokens=4)


@sgl.function
def greet(s):
    s += "Hi" + sgl.gen("g", max_tokens=2, temperature=0)


def test_a_bad_request_is_an_invalid_request_error_naming_the_field(engine):
    with running_server(engine) as server, RuntimeEndpoint(server.base_url) as endpoint:
        with pytest.raises(InvalidRequestError, match="regex"):
            code.run(backend=endpoint)
        in_process = greet.run(backend=sgl.Runtime(engine=engine))["g"]
        assert greet.run(backend=endpoint)["g"] == in_process  # and it keeps serving


def test_the_api_key_is_sent_as_a_bearer_token(engine):
    with running_server(engine, api_key="sesame") as server:
        with pytest.raises(InvalidRequestError, match="401"):
            RuntimeEndpoint(server.base_url)
        with RuntimeEndpoint(server.base_url, api_key="sesame") as endpoint:
            assert endpoint.tokenize("hello") == engine.tokenizer("hello")["input_ids"]
