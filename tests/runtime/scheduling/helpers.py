"""Test doubles for the scheduler's tests: no tokenizer, no model."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import torch

from radixlm.runtime.io.detokenizer import DetokenizeResult
from radixlm.runtime.io.messages import LogprobSpec, TokenizedRequest
from radixlm.runtime.io.sampling_params import SamplingParams
from radixlm.runtime.scheduling.request import Request

EOS = 2


class FakeDetokenizer:
    """What the scheduler uses of an ``IncrementalDetokenizer``: each id becomes
    ``<id>``; the text of ``held`` (if set) is held back until ``finish``; the id
    ``stop_id`` (if set) acts as the stop string "STOP" (trimmed, like the real one)."""

    def __init__(self, held: int | None = None, stop_id: int | None = None) -> None:
        self._held, self._stop_id = held, stop_id
        self._pending = ""
        self._stopped = False

    def feed(self, token_ids: Sequence[int]) -> DetokenizeResult:
        if self._stopped:
            return DetokenizeResult("", True, "STOP")
        delta = ""
        for t in token_ids:
            if t == self._stop_id:
                self._stopped = True
                return DetokenizeResult(delta, True, "STOP")
            if t == self._held:
                self._pending += f"<{t}>"
            else:
                delta += self._pending + f"<{t}>"
                self._pending = ""
        return DetokenizeResult(delta)

    def finish(self) -> str:
        pending, self._pending = self._pending, ""
        return pending


def tokenized(
    rid: str,
    prompt: Sequence[int],
    max_new: int = 2,
    min_new: int = 0,
    logprob: LogprobSpec | None = None,
    detokenizer: FakeDetokenizer | None = None,
    no_stop_trim: bool = False,
) -> TokenizedRequest:
    params = SamplingParams(
        temperature=0, max_new_tokens=max_new, min_new_tokens=min_new, no_stop_trim=no_stop_trim
    )
    detok: Any = detokenizer or FakeDetokenizer()  # duck-types IncrementalDetokenizer
    return TokenizedRequest(
        rid, 0, tuple(prompt), params, frozenset({EOS}), detok, logprob or LogprobSpec()
    )


def request(rid: str, prompt: Sequence[int], **kwargs) -> Request:
    """A queued-looking ``Request`` (never admitted), for the parts' own tests."""
    return Request.from_tokenized(tokenized(rid, prompt, **kwargs))


class CountingGrammar:
    """Fills its bitmask row with its id (after ``gate`` opens, when it has one)."""

    def __init__(self, ident: int, gate: threading.Event | None = None) -> None:
        self.ident, self.gate = ident, gate

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        if self.gate is not None:
            assert self.gate.wait(timeout=10)
        if self.ident < 0:
            raise RuntimeError("the grammar engine failed")
        bitmask[row] = self.ident


class Vocab:
    bitmask_width = 2
