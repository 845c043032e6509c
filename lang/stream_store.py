"""A program stream's text, variables and meta info, and the waits on them.

Two threads meet here: the stream's worker writes (appends text, sets variables as
gens finish) and the program body reads (``s["x"]``, ``text_iter``). A variable an
expression will set is *expected* when the expression is submitted; a reader of it
waits until the worker *releases* it (after the expression ran, or failed), so a
read never sees a value from before its own ``s += gen("x")``::

    body:    submit(gen "x") -> expect("x")        s["x"] -> waits on x's event
    worker:                     run gen -> set "x" -> release("x") -> wakes the reader

Every write notifies ``_changed``, which the text iterators wait on.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from radixlm.runtime.reasoning import reasoning_format, split_reasoning

__all__ = ["Span", "StreamStore", "split_reasoning_text"]


@dataclass(frozen=True)
class Span:
    """Where a variable's text sits in the stream's text (``end`` -1: still open)."""

    start: int
    end: int


class StreamStore:
    """The stream's text and variables (strings, as SGLang; lists after ``n > 1``
    or a join), each variable's meta info, and the events readers wait on.

    Only the worker thread writes text; ``set_var`` may also come from the body.
    """

    def __init__(self) -> None:
        self.text = ""
        self.variables: dict[str, Any] = {}
        self.meta_info: dict[str, Any] = {}
        self.finished = False  # the worker has stopped: nothing will change any more
        self._spans: dict[str, Span] = {}
        self._pending: dict[str, threading.Event] = {}  # expected, not yet released
        self._changed = threading.Condition()  # text, a variable, or the end

    def branch(self) -> StreamStore:
        """A new store holding a copy of this one's text, variables and meta info."""
        other = StreamStore()
        other.text = self.text
        other.variables = dict(self.variables)
        other.meta_info = dict(self.meta_info)
        other._spans = dict(self._spans)
        return other

    # ---- the reader side ------------------------------------------------------------------

    def get_var(self, name: str, failure_note: str = "") -> Any:
        """Variable ``name``, once the expression setting it (if submitted) has run.

        Raises:
            KeyError: it is not set (``failure_note`` says why, when the program failed).
        """
        event = self._pending.get(name)
        if event is not None:
            event.wait()
        if name not in self.variables:
            raise KeyError(f"program variable {name!r} is not set" + failure_note)
        return self.variables[name]

    def get_meta_info(self, name: str, failure_note: str = "") -> Any:
        """The meta info of the gen or select that set ``name`` (None for other
        variables); waits and raises as ``get_var``."""
        self.get_var(name, failure_note)
        return self.meta_info.get(name)

    def __contains__(self, name: str) -> bool:
        """Whether ``name`` is set or will be by an expression already submitted."""
        return name in self.variables or name in self._pending

    def current(self, name: str | None) -> str:
        """The text so far (``name`` None), or variable ``name``'s ("" unless a string)."""
        if name is None:
            return self.text
        value = self.variables.get(name, "")
        return value if isinstance(value, str) else ""

    def is_final(self, name: str | None) -> bool:
        """Whether ``current(name)`` will not change any more."""
        if self.finished:
            return True
        if name is None:
            return False
        event = self._pending.get(name)
        return event is not None and event.is_set()

    def wait_for_text(self, name: str | None, num_seen_chars: int) -> tuple[str, bool]:
        """Blocks until ``current(name)`` is longer than ``num_seen_chars`` or final;
        returns it and whether it is final, read together."""
        with self._changed:
            self._changed.wait_for(
                lambda: len(self.current(name)) > num_seen_chars or self.is_final(name)
            )
            return self.current(name), self.is_final(name)

    # ---- the writer side ------------------------------------------------------------------

    def expect(self, names: Iterable[str]) -> None:
        """Readers of ``names`` will wait until ``release`` (or ``finish``)."""
        for name in names:
            self._pending[name] = threading.Event()

    def release(self, names: Iterable[str]) -> None:
        """Wakes the readers of ``names`` (also after a failure, so that they see it)."""
        with self._changed:
            for name in names:
                self._pending[name].set()
            self._changed.notify_all()

    def finish(self) -> None:
        """The worker stopped: every reader wakes, every iterator ends."""
        with self._changed:
            self.finished = True
            for event in self._pending.values():
                event.set()
            self._changed.notify_all()

    def append(self, text: str) -> None:
        with self._changed:
            self.text += text
            self._changed.notify_all()

    def replace_tail(self, start: int, text: str, name: str | None) -> None:
        """The text from ``start`` on becomes ``text`` (a streamed gen's latest), and
        so does variable ``name`` if given."""
        with self._changed:
            self.text = self.text[:start] + text
            if name is not None:
                self.variables[name] = text
            self._changed.notify_all()

    def set_var(self, name: str, value: Any) -> None:
        with self._changed:
            self.variables[name] = value
            self._changed.notify_all()

    def set_result(self, name: str, start: int, value: Any, meta_info: Any) -> None:
        """A gen's or select's result: variable ``name`` is ``value``, its text the
        stream's text from ``start`` to now."""
        self._spans[name] = Span(start, len(self.text))
        self.meta_info[name] = meta_info
        self.set_var(name, value)

    def open_scope(self, name: str) -> None:
        """The text appended from now until ``close_scope`` becomes variable ``name``."""
        self._spans[name] = Span(len(self.text), -1)

    def close_scope(self, name: str) -> None:
        start = self._spans[name].start
        self._spans[name] = Span(start, len(self.text))
        self.set_var(name, self.text[start:])

    def split_reasoning(self, name: str, model_type: str | None = None) -> None:
        """Moves the reasoning block (``<think>...</think>``: ``model_type``'s markers)
        out of variable ``name`` (and the stream's text) into ``<name>_reasoning_content``;
        no-op unless ``name`` holds a string."""
        value = self.variables.get(name)
        if not isinstance(value, str):
            return
        normal, reasoning = split_reasoning_text(value, model_type)
        span = self._spans[name]
        with self._changed:
            self.text = self.text[: span.start] + normal + self.text[span.end :]
            self._spans[name] = Span(span.start, span.start + len(normal))
            self.variables[name] = normal
            self.variables[f"{name}_reasoning_content"] = reasoning
            self._changed.notify_all()

    def gather(self, branches: list[StreamStore]) -> None:
        """A join's ``gather_variable``: each variable the branches made (absent here)
        becomes a list here, in branch order, and so does its meta info."""
        known = set(self.variables)
        gathered: dict[str, list[Any]] = {}
        for branch in branches:
            for name, value in branch.variables.items():
                if name not in known:
                    gathered.setdefault(name, []).append(value)
                    self.meta_info.setdefault(name, []).append(branch.meta_info.get(name))
        for name, values in gathered.items():
            self.set_var(name, values)


def split_reasoning_text(value: str, model_type: str | None = None) -> tuple[str, str]:
    """``value`` without its first reasoning block (and the whitespace after it), and
    that block's content, stripped ("" when there is none). ``model_type`` names the
    runtime's reasoning format (None: the generic ``<think>``); the block may sit
    anywhere, and with a family whose template opens it (``deepseek-r1``) everything
    before the end marker is the reasoning.

    Raises:
        UnknownReasoningParserError: an unknown ``model_type``.
    """
    fmt = reasoning_format(model_type or "think")
    parts = split_reasoning(value, fmt, anywhere=True)
    return parts.content, parts.reasoning
