"""The native API's JSON: a GenerateOutput survives to_dict -> output_from_dict given
its request, and generate_body carries what the server's /generate reads."""

from __future__ import annotations

import json

import pytest

from radixlm.runtime.errors import InvalidRequestError
from radixlm.runtime.io.messages import FinishReason, GenerateOutput, GenerateRequest
from radixlm.runtime.io.sampling_params import SamplingParams
from radixlm.runtime.io.wire import generate_body, logprob_spec, output_from_dict


def _request(**kwargs) -> GenerateRequest:
    params = SamplingParams(temperature=0, max_new_tokens=3)
    return GenerateRequest(input_ids=(5, 6, 7, 8), sampling_params=params, **kwargs)


def _output(request: GenerateRequest, with_logprobs: bool) -> GenerateOutput:
    spec = logprob_spec(request)
    return GenerateOutput(
        rid="r-1",
        index=0,
        text=" a b",
        output_ids=(11, 12),
        finish_reason=FinishReason("stop", matched=2),
        prompt_tokens=4,
        cached_tokens=1,
        e2e_latency=0.25,
        ttft=0.125,
        logprob=spec,
        prompt_ids=request.input_ids or (),
        prompt_logprobs=(
            (2, (-0.5, 7, [(-0.5, 7), (-1.5, 9)])),
            (3, (-2.0, 8, [(-1.0, 4), (-2.0, 8)])),
        )
        if with_logprobs
        else (),
        output_logprobs=(
            (-0.25, 11, [(-0.25, 11), (-3.0, 1)]),
            (-0.75, 12, [(-0.75, 12), (-0.8, 3)]),
        )
        if with_logprobs
        else (),
    )


@pytest.mark.parametrize("with_logprobs", [False, True])
def test_an_output_survives_the_json_round_trip(with_logprobs: bool) -> None:
    options = {"return_logprob": True, "logprob_start_len": 1, "top_logprobs_num": 2}
    request = _request(**options) if with_logprobs else _request()
    out = _output(request, with_logprobs)
    wire = json.loads(json.dumps(out.to_dict()))  # what travels: lists, not tuples
    assert output_from_dict(wire, request) == out


def test_the_body_carries_ids_params_and_logprob_options() -> None:
    a, b = _request(return_logprob=True), _request(return_logprob=True)
    body = generate_body([a, b], stream=False)
    assert body["input_ids"] == [[5, 6, 7, 8], [5, 6, 7, 8]]
    assert [SamplingParams.from_dict(p) for p in body["sampling_params"]] == [
        a.sampling_params,
        b.sampling_params,
    ]
    assert (body["return_logprob"], body["stream"]) == (True, False)
    single = generate_body([a], stream=True)
    assert single["input_ids"] == [5, 6, 7, 8] and single["stream"] is True


def test_bodies_refuse_what_they_cannot_carry() -> None:
    with pytest.raises(InvalidRequestError, match="input_ids"):
        generate_body([GenerateRequest(text="hi")])
    with pytest.raises(InvalidRequestError, match="logprob options"):
        generate_body([_request(), _request(return_logprob=True)])
    with pytest.raises(InvalidRequestError, match="not a /generate result"):
        output_from_dict({"text": "x"}, _request())
