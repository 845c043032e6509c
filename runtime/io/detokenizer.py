"""Incremental, UTF-8 safe detokenization with stop strings.

Token ids -> text, one step at a time, in O(1) work per token: only a small
window of recent tokens is decoded (the prefix-offset / read-offset technique
of vLLM and TGI)::

    window:  [ already streamed context | tokens not yet turned into text ]
             ^ prefix offset (index 0)  ^ read offset (self._read)

    new text = decode(window)[len(decode(window[:read])):]

Byte-level BPE splits multi-byte characters (CJK, emoji) across tokens; a
window whose decode ends in U+FFFD is waiting for the rest of a character, so
nothing is streamed until it completes. When text is streamed the window
slides: the old read offset becomes the new prefix offset.

A request that reads some special tokens as text (a tool call's ``[TOOL_CALLS]``:
``SamplingParams.special_tokens_as_text``) names the ids to leave out instead
(``skipped_ids``: every other special token): those are dropped before decoding and the
rest is decoded with its special tokens, so the kept ones reach the tool-call parser.

Stop strings are matched by an automaton (``stop_strings.StopStrings``) fed each
new piece of text once. Any suffix that could still grow into a stop string is
held back, so streamed text never contains part of a stop string, and a match
can never begin inside streamed text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from radixlm.runtime.io.stop_regex import StopRegexes, StopRegexTimeout
from radixlm.runtime.io.stop_strings import ROOT, StopStrings

__all__ = ["DetokenizeResult", "IncrementalDetokenizer"]

# Prompt tokens decoded in front of the output: tokenizers that render a
# leading space by context (SentencePiece) then stream the first word right.
_PROMPT_CONTEXT_TOKENS = 5
_REPLACEMENT_CHAR = "\ufffd"


@dataclass(frozen=True)
class DetokenizeResult:
    """What one ``feed`` produced.

    Attributes:
        text: the new text since the previous feed (possibly empty).
        stopped: a stop string or regex matched (or ``error``); nothing after it
            will ever be returned.
        matched_stop: the stop string (or ``stop_regex`` pattern) that matched, or None.
        error: why the request must end as an abort (a ``stop_regex`` search ran past
            its time limit), or None.
    """

    text: str
    stopped: bool = False
    matched_stop: str | None = None
    error: str | None = None


class IncrementalDetokenizer:
    """Turns one request's output tokens into streamed text.

    Invariant: the concatenation of every ``feed(...).text`` plus ``finish()``
    equals ``.text``; with no stop string matched that equals
    ``tokenizer.decode(output_ids, skip_special_tokens=...)`` for byte-level
    BPE tokenizers.

    Args:
        tokenizer: a ``transformers`` tokenizer (``decode`` is all that is used).
        prompt_ids: the prompt; its last few tokens are decoded as context only.
        skip_special_tokens: leave special tokens out of the text.
        spaces_between_special_tokens: passed to ``decode``; fast tokenizers ignore it.
        stop: stop strings (non-empty), searched in the output text only; a built
            ``StopStrings`` is shared as is (a request's samples share one).
        stop_regex: patterns ending generation at their first match (``StopRegexes``
            shared as is), likewise.
        no_stop_trim: keep the matched stop string at the end of the text.
        skipped_ids: when given, the ids left out of the text, every other token kept
            (special ones as their content): overrides ``skip_special_tokens``.
    """

    def __init__(
        self,
        tokenizer: Any,
        prompt_ids: Sequence[int] | None,
        skip_special_tokens: bool,
        spaces_between_special_tokens: bool,
        stop: StopStrings | Sequence[str] = (),
        no_stop_trim: bool = False,
        stop_regex: StopRegexes | Sequence[str] = (),
        skipped_ids: frozenset[int] | None = None,
    ) -> None:
        self._tokenizer = tokenizer
        self._skipped = skipped_ids
        self._decode_kwargs = {
            "skip_special_tokens": skip_special_tokens and skipped_ids is None,
            "spaces_between_special_tokens": spaces_between_special_tokens,
        }
        self._window: list[int] = list(prompt_ids or ())[-_PROMPT_CONTEXT_TOKENS:]
        self._read = len(self._window)
        self._stop = stop if isinstance(stop, StopStrings) else StopStrings(stop)
        self._stop_state = ROOT
        self._regexes = (
            stop_regex if isinstance(stop_regex, StopRegexes) else StopRegexes(stop_regex)
        )
        self._no_stop_trim = no_stop_trim
        self._error: str | None = None
        self._streamed: list[str] = []
        self._pending = ""  # decoded but held back: it could begin a stop string
        self._matched_stop: str | None = None
        self._stopped = False

    @property
    def text(self) -> str:
        """All text streamed so far (held-back text excluded)."""
        return "".join(self._streamed)

    @property
    def stopped(self) -> bool:
        """Whether a stop string has matched."""
        return self._stopped

    @property
    def matched_stop(self) -> str | None:
        """The stop string that matched, if any."""
        return self._matched_stop

    def feed(self, token_ids: Sequence[int]) -> DetokenizeResult:
        """Add newly generated tokens; returns the text they complete.

        After a stop string matched, further feeds return empty text.
        """
        if self._stopped:
            return DetokenizeResult("", True, self._matched_stop, self._error)
        self._window.extend(token_ids)
        delta = self._consume(self._decode_new(flush=False))
        return DetokenizeResult(delta, self._stopped, self._matched_stop, self._error)

    def finish(self) -> str:
        """Flush everything held back at the end of generation; call it once, last.

        An incomplete UTF-8 sequence at the very end comes out as decode renders
        it (U+FFFD); a partial stop string (or regex match) that never completed is
        released, and so is the text a stop regex timed out on here.
        """
        if self._stopped:
            return ""
        delta = self._consume(self._decode_new(flush=True))
        if not self._stopped or self._error is not None:
            delta += self._emit(self._pending)
            self._pending = ""
        return delta

    def _decode_new(self, flush: bool) -> str:
        """Text completed by the tokens past the read offset; slides the window."""
        if self._read == len(self._window):
            return ""
        prefix = self._decode(self._window[: self._read])
        full = self._decode(self._window)
        if not flush and (len(full) <= len(prefix) or full.endswith(_REPLACEMENT_CHAR)):
            return ""  # nothing visible yet, or a character still incomplete
        self._window = self._window[self._read :]
        self._read = len(self._window)
        return full[len(prefix) :]

    def _decode(self, ids: list[int]) -> str:
        if self._skipped is not None:
            ids = [i for i in ids if i not in self._skipped]
        return self._tokenizer.decode(ids, **self._decode_kwargs)

    def _consume(self, new_text: str) -> str:
        """Run the stop automaton and the stop regexes over the new text; returns what
        may be streamed. The first stop to complete wins (a string's or a regex's)."""
        text = self._pending + new_text
        if not self._stop and not self._regexes:
            self._pending = ""
            return self._emit(text)
        hold = len(text)
        first: tuple[int, int, str] | None = None  # (end, start, what matched) in text
        if self._stop:
            self._stop_state, match = self._stop.scan(self._stop_state, new_text)
            if match is not None:
                end = len(text) - len(new_text) + match.end
                first = (end, end - len(match.stop), match.stop)
            hold = len(text) - self._stop.held(self._stop_state)
        if self._regexes:
            try:
                scan = self._regexes.scan(text)
            except StopRegexTimeout as e:  # the request ends as an abort (finish: released)
                self._stopped, self._error, self._pending = True, str(e), text
                return ""
            if scan.match is not None and (first is None or scan.match[1] < first[0]):
                start, end, pattern = scan.match
                first = (end, start, pattern)
            hold = min(hold, scan.hold_from)
        if first is not None:
            end, start, matched = first
            self._stopped, self._matched_stop, self._pending = True, matched, ""
            return self._emit(text[: end if self._no_stop_trim else start])
        self._pending = text[hold:]
        return self._emit(text[:hold])

    def _emit(self, text: str) -> str:
        if text:
            self._streamed.append(text)
        return text
