"""The loop publishes only what changed (``Request.publish``); the caller's
``OutputAssembler`` rebuilds the output so far from those deltas."""

from __future__ import annotations

import pytest

from radixlm.runtime.io.messages import FinishReason, LogprobSpec
from radixlm.runtime.io.output_assembler import OutputAssembler
from tests.runtime.scheduling.helpers import request, tokenized

PROMPT = list(range(100, 164))  # 64 prompt tokens: never in a delta


def _step(req, token: int, text: str, logprob: bool = False) -> None:
    req.output_ids.append(token)
    req.text += text
    if logprob:
        req.output_logprobs.append((-0.5, token, [(-0.5, token)]))


def test_each_delta_carries_only_what_changed():
    req = request("r", PROMPT)
    _step(req, 7, "a")
    _step(req, 8, "bc")
    first = req.publish()
    assert (first.text, first.num_kept_ids, first.new_ids) == ("abc", 0, (7, 8))
    _step(req, 9, "d")
    second = req.publish()
    assert (second.text, second.num_kept_ids, second.new_ids) == ("d", 2, (9,))
    assert second.prompt_logprobs == () and second.output_logprobs == ()
    assert not second.finished
    third = req.publish()  # nothing new
    assert (third.text, third.num_kept_ids, third.new_ids) == ("", 3, ())
    # No field of a delta holds the prompt (or anything of its length).
    for value in vars(second).values():
        assert not (isinstance(value, tuple) and len(value) >= len(PROMPT))


def test_the_assembled_output_equals_the_request_after_every_delta():
    spec = LogprobSpec(enabled=True, start_len=60, top_k=1)
    t = tokenized("r", PROMPT, max_new=8, logprob=spec)
    req = request("r", PROMPT, max_new=8, logprob=spec)
    assembler = OutputAssembler([t])
    for pos in range(60, 64):
        req.prompt_logprobs[pos] = (-1.0, PROMPT[pos], [(-1.0, PROMPT[pos])])
        if pos == 61:  # the prompt's logprobs arrive over two updates
            chunk = assembler.apply(req.publish())
    for token in (7, 8, 9):
        _step(req, token, f"<{token}>", logprob=True)
        chunk = assembler.apply(req.publish())
        assert chunk.delta == f"<{token}>"
    # Jump-forward re-tokenises the last sampled token: the next delta replaces it.
    req.drop_last_output_id()
    req.output_ids += [90, 91]
    req.text += "<forced>"
    req.finish_reason = FinishReason("stop")
    req.status = req.status.FINISHED
    chunk = assembler.apply(req.publish())
    out = chunk.output
    assert chunk.finished and chunk.delta == "<forced>"
    assert out.output_ids == (7, 8, 90, 91) == tuple(req.output_ids)
    assert out.text == req.text == "<7><8><9><forced>"
    assert out.prompt_ids == tuple(PROMPT) and out.prompt_tokens == 64
    assert dict(out.prompt_logprobs) == req.prompt_logprobs
    assert list(out.output_logprobs) == req.output_logprobs
    assert out.finish_reason == FinishReason("stop")
    meta = out.to_dict()["meta_info"]
    assert [tok for _, tok, _ in meta["input_token_logprobs"]] == PROMPT[60:]


def test_a_delta_of_another_call_is_refused():
    assembler = OutputAssembler([tokenized("mine", PROMPT)])
    with pytest.raises(KeyError):
        assembler.apply(request("theirs", PROMPT).publish())


def _stream_of_three(assembler_requests=None):
    """A stream whose third delta re-tokenises the second token (jump-forward)."""
    spec = LogprobSpec(enabled=True, start_len=64, top_k=1)
    req = request("r", PROMPT, max_new=8, logprob=spec)
    assembler = OutputAssembler([tokenized("r", PROMPT, max_new=8, logprob=spec)])
    chunks = []
    for token in (7, 8):
        _step(req, token, f"<{token}>", logprob=True)
        chunks.append(assembler.apply(req.publish()))
    req.drop_last_output_id()
    req.output_ids += [80, 81]
    req.text += "<forced>"
    chunks.append(assembler.apply(req.publish()))
    return chunks


def test_a_chunk_carries_what_it_added_and_its_counts():
    first, second, third = _stream_of_three()
    assert (first.new_ids, first.num_output_ids, first.num_output_logprobs) == ((7,), 1, 1)
    assert second.new_ids == (8,) and second.new_output_logprobs == ((-0.5, 8, [(-0.5, 8)]),)
    # The re-tokenised 8 was already sent: a consumer appending new_ids gets 7, 8, 81,
    # while the output so far says 7, 80, 81 (SGLang's incremental ids, as before).
    assert third.new_ids == (81,) and third.new_output_logprobs == ()
    assert third.num_output_ids == 3 and third.num_output_logprobs == 2


def test_an_earlier_chunk_read_late_shows_the_output_as_of_it():
    first, second, third = _stream_of_three()
    assert third.output.output_ids == (7, 80, 81)
    assert second.output.output_ids == (7, 8) and second.output.text == "<7><8>"
    assert first.output.text == "<7>" and len(first.output.output_logprobs) == 1
    assert third.output.text == "<7><8><forced>"


def test_event_dicts_carry_only_the_new_logprobs_and_the_text_so_far_or_new():
    first, second, third = _stream_of_three()
    cumulative = second.event_dict(incremental=False)
    assert cumulative["text"] == "<7><8>" and cumulative["output_ids"] == [7, 8]
    assert cumulative["delta"] == "<8>"
    meta = cumulative["meta_info"]
    assert meta["output_token_logprobs"] == [(-0.5, 8, None)]
    assert meta["output_token_logprobs_length"] == 2 and meta["completion_tokens"] == 2
    assert meta["prompt_tokens"] == 64
    incremental = third.event_dict(incremental=True)
    assert incremental["text"] == "<forced>" and incremental["output_ids"] == [81]
    assert incremental["meta_info"]["output_token_logprobs"] == []
    assert incremental["meta_info"]["completion_tokens"] == 3
