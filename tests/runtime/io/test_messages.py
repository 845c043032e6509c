"""The typed boundary's data pickles (a server process can send it over a pipe) and
renders SGLang's result shape."""

from __future__ import annotations

import pickle

from radixlm.runtime.io.messages import (
    FinishReason,
    GenerateOutput,
    GenerateRequest,
    LogprobSpec,
    StreamChunk,
)
from radixlm.runtime.io.sampling_params import SamplingParams


def _output(**overrides) -> GenerateOutput:
    fields = dict(
        rid="req-7",
        index=1,
        text="Paris.",
        output_ids=(5, 6),
        finish_reason=FinishReason("stop", matched=2),
        prompt_tokens=3,
        cached_tokens=2,
        e2e_latency=0.5,
        ttft=0.1,
        logprob=LogprobSpec(True, 1, 1),
        prompt_ids=(1, 2, 3),
        prompt_logprobs=((1, (-0.5, 2, [(-0.5, 2)])), (2, (-1.5, 3, [(-0.25, 9)]))),
        output_logprobs=((-0.1, 5, [(-0.1, 5)]), (-0.2, 6, [(-0.2, 6)])),
    )
    return GenerateOutput(**{**fields, **overrides})


def test_requests_outputs_and_chunks_survive_a_pickle_round_trip():
    schema = '{"type": "object", "properties": {"a": {"type": "integer"}}}'
    request = GenerateRequest(
        text="Hi",
        sampling_params=SamplingParams(max_new_tokens=8, json_schema=schema, stop=["\n"]),
        return_logprob=True,
        logprob_start_len=0,
        top_logprobs_num=2,
        stream=True,
    )
    chunk = StreamChunk.of_output(_output(), "s.")
    for value in (request, _output(), chunk):
        assert pickle.loads(pickle.dumps(value)) == value
    assert pickle.loads(pickle.dumps(request)).sampling_params.grammar.kind == "json_schema"


def test_output_to_dict_is_sglangs_shape_with_logprobs_by_position():
    result = _output().to_dict()
    assert result["text"] == "Paris." and result["output_ids"] == [5, 6]
    meta = result["meta_info"]
    assert meta["id"] == "req-7" and meta["completion_tokens"] == 2
    assert meta["finish_reason"] == {"type": "stop", "matched": 2}
    assert meta["input_token_logprobs"] == [(-0.5, 2, None), (-1.5, 3, None)]
    assert meta["input_top_logprobs"] == [[(-0.5, 2, None)], [(-0.25, 9, None)]]
    assert meta["output_token_logprobs"] == [(-0.1, 5, None), (-0.2, 6, None)]
    assert "delta" not in result


def test_a_chunk_adds_its_delta_and_is_finished_with_its_output():
    running = StreamChunk.of_output(_output(finish_reason=None), "Par")
    assert not running.finished and running.to_dict()["delta"] == "Par"
    assert running.to_dict()["meta_info"]["finish_reason"] is None
    assert StreamChunk.of_output(_output(), "").finished


def test_a_chunk_of_a_whole_output_adds_its_delta_alone():
    chunk = StreamChunk.of_output(_output(), "s.", new_ids=(6,))
    assert (chunk.rid, chunk.index, chunk.num_output_ids) == ("req-7", chunk.output.index, 2)
    event = chunk.event_dict(incremental=True)
    assert event["text"] == "s." and event["output_ids"] == [6]
    assert event["meta_info"]["completion_tokens"] == 2
    assert event["meta_info"]["output_token_logprobs"] == []
