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
