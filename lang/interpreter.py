"""Runs programs: the stream executor behind each ``ProgramState``.

    program body (caller's thread)          stream executor (its own worker thread)
    ------------------------------          ---------------------------------------
    s += sgl.user("...")   -- submit -->    queue -> execute in order: append text,
    s += sgl.gen("x")      -- submit -->      role blocks (chat template), gen /
    s["x"]                 <-- waits ---      select through the backend, variables
    s.fork(3)              -- sync, copy --> three executors, each its own thread

Each stream runs concurrently with every other (its body keeps going while a gen
runs; forks' and batched programs' gens reach the backend together, which batches
them). A gen's failure is kept (``state.error()``) and the stream's later
expressions are skipped; an exception of the body itself propagates from ``run()``.

Text and variables are strings (SGLang's semantics): a gen with ``dtype=int``
produces integer text, ``int(s["x"])`` works. ``select`` asks the backend to score
its choices (``Backend.score_choices``; token-level backends score each on the
tokenization of prompt + choice as a whole, ``backends/scoring.py``) and calls its
``choices_method`` with SGLang's keywords (``choices.py``).
"""

from __future__ import annotations

import queue
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

from radixlm.backends.base import Backend, UnsupportedInputError
from radixlm.choices import ChoicesDecision, ChoicesSamplingMethod
from radixlm.ir import (
    DTYPE_REGEX,
    DTYPE_STOP,
    Expr,
    ExprList,
    Gen,
    GenParams,
    Image,
    RoleBegin,
    RoleEnd,
    Select,
    SeparateReasoning,
    Text,
    VarScopeBegin,
    VarScopeEnd,
    Video,
    to_expr,
)
from radixlm.runtime.io.messages import GenerateOutput, GenerateRequest
from radixlm.runtime.io.sampling_params import SamplingParams

__all__ = [
    "ProgramState",
    "ProgramStateGroup",
    "RoleBlocks",
    "StreamExecutor",
    "UnsupportedInputError",
]

_THINK = re.compile(r"<think>(.*?)</think>\s*", re.DOTALL)


@dataclass(frozen=True)
class _Span:
    """Where a variable's text sits in the stream's text."""

    start: int
    end: int


@dataclass(frozen=True)
class _Sync:
    """A no-op the worker marks done: ``sync`` waits for everything before it."""


class StreamExecutor:
    """One program stream: its text, chat messages and variables, and the worker
    thread that executes its expressions in order.

    defaults: the ``run()`` sampling arguments every gen starts from.
    """

    def __init__(self, backend: Backend, defaults: GenParams, stream: bool) -> None:
        self.backend = backend
        self.template = backend.chat_template
        self.defaults = defaults
        self.stream = stream
        self.text_ = ""
        self.messages_: list[dict[str, str]] = []
        self.variables: dict[str, Any] = {}
        self.meta_info: dict[str, Any] = {}
        self.error_: BaseException | None = None
        self.fork_start = 0  # where a branch's own text starts
        self._spans: dict[str, _Span] = {}
        self._role: str | None = None
        self._role_start = 0
        self._pending: dict[str, threading.Event] = {}  # submitted, not yet set
        self._changed = threading.Condition()  # text, a variable, or the end
        self._finished = False
        self._ended = False
        self._lock = threading.Lock()  # orders submits and syncs against the worker's end
        self._queue: queue.Queue[Expr | _Sync | None] = queue.Queue()
        self._worker = threading.Thread(target=self._work, name="radixlm-program", daemon=True)
        self._worker.start()

    # ---- the program side ---------------------------------------------------------------

    def submit(self, expr: Expr) -> None:
        self._check_inputs(expr)
        with self._lock:
            if self._ended:
                raise RuntimeError("this program state has ended: nothing more can be appended")
            for name in _defined_names(expr):
                self._pending[name] = threading.Event()
            self._queue.put(expr)

    def sync(self) -> None:
        """Waits until every expression submitted so far has run."""
        with self._lock:
            if self._finished:
                return
            self._queue.put(_Sync())
        self._queue.join()

    def end(self) -> None:
        """No more expressions: the worker finishes what is queued, then stops."""
        with self._lock:
            if not self._ended:
                self._ended = True
                self._queue.put(None)

    def get_var(self, name: str) -> Any:
        event = self._pending.get(name)
        if event is not None:
            event.wait()
        if name not in self.variables:
            raise KeyError(f"program variable {name!r} is not set" + self._error_note())
        return self.variables[name]

    def set_var(self, name: str, value: Any) -> None:
        self.variables[name] = value
        self._notify()

    def get_meta_info(self, name: str) -> Any:
        self.get_var(name)
        return self.meta_info.get(name)

    def fork(self, size: int) -> list[StreamExecutor]:
        """``size`` branches starting from this stream's exact state (text, messages,
        variables, role); with several, the shared prefix is computed once first."""
        self.sync()
        if size > 1 and self.text_:
            self.backend.cache_prefix(self.backend.tokenize(self.text_))
        branches = []
        for _ in range(size):
            branch = StreamExecutor(self.backend, self.defaults, self.stream)
            branch.text_ = self.text_
            branch.messages_ = list(self.messages_)
            branch.variables = dict(self.variables)
            branch.meta_info = dict(self.meta_info)
            branch._role, branch._role_start = self._role, self._role_start
            branch.fork_start = len(self.text_)
            branches.append(branch)
        return branches

    def wait_finished(self) -> None:
        self._worker.join()

    def iter_text(self, name: str | None) -> Iterator[str]:
        """The stream's text (or variable ``name``'s) as it grows, until it is final."""
        sent = 0
        while True:
            with self._changed:
                self._changed.wait_for(partial(self._ready, name, sent))
                current, final = self._current(name), self._final(name)
            if len(current) > sent:
                yield current[sent:]
                sent = len(current)
            if final and sent >= len(self._current(name)):
                return

    def _current(self, name: str | None) -> str:
        if name is None:
            return self.text_
        value = self.variables.get(name, "")
        return value if isinstance(value, str) else ""

    def _ready(self, name: str | None, sent: int) -> bool:
        """Whether ``iter_text`` has more than ``sent`` characters to send, or is done."""
        return len(self._current(name)) > sent or self._final(name)

    def _final(self, name: str | None) -> bool:
        if self._finished:
            return True
        if name is None:
            return False
        event = self._pending.get(name)
        return event is not None and event.is_set()

    def _error_note(self) -> str:
        return f" (the program failed: {self.error_!r})" if self.error_ is not None else ""

    def _check_inputs(self, expr: Expr) -> None:
        for node in _walk(expr):
            if isinstance(node, Image | Video) and not self.backend.is_multimodal:
                kind = "an image" if isinstance(node, Image) else "a video"
                raise UnsupportedInputError(
                    f"the program appends {kind} ({node.path!r}), but the backend's model "
                    "is text-only"
                )

    # ---- the worker -------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            expr = self._queue.get()
            try:
                if expr is None:
                    return
                if isinstance(expr, Expr) and self.error_ is None:
                    try:
                        self._execute(expr)
                    except Exception as e:  # kept for state.error(); later expressions skip
                        self.error_ = e
                if isinstance(expr, Expr):
                    self._release(expr)
            finally:
                self._queue.task_done()
                if expr is None:
                    self._finish()

    def _finish(self) -> None:
        """After the last expression: wakes every waiter; syncs queued meanwhile are done."""
        with self._lock:
            self._finished = True
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
            self._queue.task_done()
        with self._changed:
            for event in self._pending.values():
                event.set()
            self._changed.notify_all()

    def _release(self, expr: Expr) -> None:
        """Marks the variables ``expr`` defines as set (also after a failure, so that
        readers wake and see the error)."""
        with self._changed:
            for name in _defined_names(expr):
                self._pending[name].set()
            self._changed.notify_all()

    def _notify(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def _execute(self, expr: Expr) -> None:
        handler = _HANDLERS.get(type(expr))
        if handler is None:
            raise TypeError(f"cannot execute {type(expr).__name__}")
        handler(self, expr)

    def _append(self, text: str) -> None:
        with self._changed:
            self.text_ += text
            self._changed.notify_all()

    def _text(self, expr: Text) -> None:
        self._append(expr.value)

    def _list(self, expr: ExprList) -> None:
        for item in expr.items:
            self._execute(item)

    def _role_begin(self, expr: RoleBegin) -> None:
        if self._role is not None:
            raise ValueError(f"a {expr.role} block inside the open {self._role} block")
        prefix, _ = self.template.prefix_and_suffix(expr.role, len(self.messages_))
        self._append(prefix)
        self._role, self._role_start = expr.role, len(self.text_)

    def _role_end(self, expr: RoleEnd) -> None:
        if self._role != expr.role:
            raise ValueError(f"the end of a {expr.role} block, but the open one is {self._role}")
        content = self.text_[self._role_start :]
        _, suffix = self.template.prefix_and_suffix(expr.role, len(self.messages_))
        self._append(suffix)
        self.messages_.append({"role": expr.role, "content": content.lstrip()})
        self._role = None

    def _var_scope_begin(self, expr: VarScopeBegin) -> None:
        self._spans[expr.name] = _Span(len(self.text_), -1)

    def _var_scope_end(self, expr: VarScopeEnd) -> None:
        start = self._spans[expr.name].start
        self._spans[expr.name] = _Span(start, len(self.text_))
        self.set_var(expr.name, self.text_[start:])

    def _gen(self, expr: Gen) -> None:
        params = expr.params.over(self.defaults)
        request = self._request(params, expr.dtype)
        start = len(self.text_)
        if (request.sampling_params.n or 1) > 1:
            outputs = self.backend.generate([request])
            value: Any = [out.text for out in outputs]
            self._append(outputs[0].text)
            meta: Any = [self._meta(out, params) for out in outputs]
        elif self.stream:
            out = self._stream_gen(expr.name, request)
            value, meta = out.text, self._meta(out, params)
        else:
            (out,) = self.backend.generate([request])
            self._append(out.text)
            value, meta = out.text, self._meta(out, params)
        if expr.name is not None:
            self._spans[expr.name] = _Span(start, len(self.text_))
            self.meta_info[expr.name] = meta
            self.set_var(expr.name, value)

    def _stream_gen(self, name: str | None, request: GenerateRequest) -> GenerateOutput:
        """A gen streamed into the text (and its variable) as it comes."""
        start, last = len(self.text_), None
        chunks = self.backend.stream(request)
        try:
            for chunk in chunks:
                last = chunk.output
                self._replace_tail(start, last.text, name)
        finally:
            chunks.close()  # type: ignore[attr-defined]
        assert last is not None
        return last

    def _replace_tail(self, start: int, text: str, name: str | None) -> None:
        with self._changed:
            self.text_ = self.text_[:start] + text
            if name is not None:
                self.variables[name] = text
            self._changed.notify_all()

    def _request(self, params: GenParams, dtype: str | None) -> GenerateRequest:
        stop_ids = tuple(params.stop_token_ids or ())
        if self._role == "assistant":  # the end of the turn ends the gen
            stop_ids += tuple(t for t in self.template.stop_token_ids if t not in stop_ids)
        regex = params.regex if dtype is None else DTYPE_REGEX[dtype]
        stop = tuple(params.stop or ())
        stop += tuple(t for t in DTYPE_STOP.get(dtype or "", ()) if t not in stop)
        sampling = SamplingParams(
            max_new_tokens=params.max_new_tokens,
            min_new_tokens=params.min_new_tokens or 0,
            n=params.n or 1,
            stop=stop,
            stop_regex=tuple(params.stop_regex or ()),  # the engine ends at the first match
            stop_token_ids=stop_ids,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            min_p=params.min_p,
            frequency_penalty=params.frequency_penalty,
            presence_penalty=params.presence_penalty,
            ignore_eos=params.ignore_eos,
            regex=regex,
            json_schema=params.json_schema,
            **_given(params, "skip_special_tokens", "spaces_between_special_tokens"),
        )
        return GenerateRequest(
            input_ids=tuple(self.backend.tokenize(self.text_)),
            sampling_params=sampling,
            return_logprob=bool(params.return_logprob),
            logprob_start_len=params.logprob_start_len,
            top_logprobs_num=params.top_logprobs_num,
        )

    def _meta(self, out: GenerateOutput, params: GenParams) -> dict[str, Any]:
        meta = out.to_dict()["meta_info"]
        if params.return_logprob and params.return_text_in_logprobs:
            for key in ("input_token_logprobs", "output_token_logprobs"):
                meta[key] = [(lp, tok, self.backend.decode([tok])) for lp, tok, _ in meta[key]]
        return meta

    def _select(self, expr: Select) -> None:
        method = expr.choices_method
        scores = self.backend.score_choices(
            self.text_, expr.choices, bool(method.requires_unconditional_logprobs)
        )
        decision = _checked_decision(method(**scores.method_arguments()), expr, method)
        self._append(decision.decision)
        if expr.name is not None:
            self.meta_info[expr.name] = decision.meta_info
            self.set_var(expr.name, decision.decision)

    def _separate_reasoning(self, expr: SeparateReasoning) -> None:
        for node in _walk(expr.expr):
            name = getattr(node, "name", None)
            if isinstance(node, Gen | Select) and name is not None:
                self._split_reasoning(name)

    def _split_reasoning(self, name: str) -> None:
        value = self.variables.get(name)
        if not isinstance(value, str):
            return
        match = _THINK.search(value)
        reasoning = match.group(1) if match else ""
        normal = (value[: match.start()] + value[match.end() :]) if match else value
        span = self._spans[name]
        with self._changed:
            self.text_ = self.text_[: span.start] + normal + self.text_[span.end :]
            self._spans[name] = _Span(span.start, span.start + len(normal))
            self.variables[name] = normal
            self.variables[f"{name}_reasoning_content"] = reasoning
            self._changed.notify_all()

    def _image(self, expr: Image | Video) -> None:
        raise UnsupportedInputError("the backend's model is text-only")


_HANDLERS: dict[type, Callable[[StreamExecutor, Any], None]] = {
    Text: StreamExecutor._text,
    ExprList: StreamExecutor._list,
    RoleBegin: StreamExecutor._role_begin,
    RoleEnd: StreamExecutor._role_end,
    Gen: StreamExecutor._gen,
    Select: StreamExecutor._select,
    VarScopeBegin: StreamExecutor._var_scope_begin,
    VarScopeEnd: StreamExecutor._var_scope_end,
    SeparateReasoning: StreamExecutor._separate_reasoning,
    Image: StreamExecutor._image,
    Video: StreamExecutor._image,
}


def _walk(expr: Expr) -> Iterator[Expr]:
    yield expr
    if isinstance(expr, ExprList):
        for item in expr.items:
            yield from _walk(item)


def _defined_names(expr: Expr) -> list[str]:
    """The variables ``expr`` sets (readers of them wait until it has run)."""
    names = []
    for node in _walk(expr):
        if isinstance(node, Gen | Select) and node.name is not None:
            names.append(node.name)
        elif isinstance(node, VarScopeEnd):
            names.append(node.name)
        elif isinstance(node, SeparateReasoning):
            names += [f"{n}_reasoning_content" for n in _defined_names(node.expr)]
    return names


def _given(params: GenParams, *names: str) -> dict[str, Any]:
    """The fields among ``names`` that are set (the others keep SamplingParams' defaults)."""
    return {n: getattr(params, n) for n in names if getattr(params, n) is not None}


def _checked_decision(
    decision: Any, expr: Select, method: ChoicesSamplingMethod
) -> ChoicesDecision:
    """``decision`` if it picks one of the select's choices (a user-written method may not).

    Raises:
        ValueError: it does not.
    """
    if getattr(decision, "decision", None) not in expr.choices:
        raise ValueError(
            f"select {expr.name!r}: choices_method {type(method).__name__} returned "
            f"{decision!r}; expected a ChoicesDecision whose decision is one of "
            f"{list(expr.choices)}"
        )
    return decision


# ---- what programs see ------------------------------------------------------------------


class RoleBlocks(ABC):
    """``system`` / ``user`` / ``assistant`` (an expression, or a ``with`` block) and
    ``var_scope``, for any state that appends nodes (the program and tracing states)."""

    @abstractmethod
    def _append_node(self, expr: Expr) -> None:
        """Appends one expression to the state."""

    def _role(self, role: str, expr: Any = None) -> Any:
        if expr is not None:
            self._append_node(ExprList((RoleBegin(role), to_expr(expr), RoleEnd(role))))
            return None

        @contextmanager
        def block() -> Iterator[None]:
            self._append_node(RoleBegin(role))
            yield
            self._append_node(RoleEnd(role))

        return block()

    def system(self, expr: Any = None) -> Any:
        return self._role("system", expr)

    def user(self, expr: Any = None) -> Any:
        return self._role("user", expr)

    def assistant(self, expr: Any = None) -> Any:
        return self._role("assistant", expr)

    @contextmanager
    def var_scope(self, name: str) -> Iterator[None]:
        """The text appended inside the block becomes variable ``name``."""
        self._append_node(VarScopeBegin(name))
        yield
        self._append_node(VarScopeEnd(name))


class ProgramState(RoleBlocks):
    """The state a program body writes to (``s += ...``) and reads (``s["x"]``)."""

    def __init__(self, executor: StreamExecutor) -> None:
        self.stream_executor = executor
        self.ret_value: Any = None

    def __iadd__(self, other: Any) -> ProgramState:
        self._append_node(to_expr(other))
        return self

    def _append_node(self, expr: Expr) -> None:
        self.stream_executor.submit(expr)

    def __getitem__(self, name: str) -> Any:
        return self.stream_executor.get_var(name)

    def __setitem__(self, name: str, value: Any) -> None:
        self.stream_executor.set_var(name, value)

    def __contains__(self, name: str) -> bool:
        executor = self.stream_executor
        return name in executor.variables or name in executor._pending

    def get_var(self, name: str) -> Any:
        return self.stream_executor.get_var(name)

    def set_var(self, name: str, value: Any) -> None:
        self.stream_executor.set_var(name, value)

    def get_meta_info(self, name: str) -> Any:
        """The gen's meta info (prompt / completion / cached tokens, finish reason,
        logprobs when asked), or a select's (each choice's token logprobs)."""
        return self.stream_executor.get_meta_info(name)

    def text(self) -> str:
        self.stream_executor.sync()
        return self.stream_executor.text_

    def messages(self) -> list[dict[str, str]]:
        self.stream_executor.sync()
        return list(self.stream_executor.messages_)

    def sync(self) -> None:
        self.stream_executor.sync()

    def error(self) -> BaseException | None:
        """The exception a gen or select of this stream raised, if any."""
        self.stream_executor.sync()
        return self.stream_executor.error_

    def fork(self, size: int = 1) -> ProgramStateGroup:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"fork size must be an int >= 1, got {size!r}")
        branches = [ProgramState(e) for e in self.stream_executor.fork(size)]
        return ProgramStateGroup(branches, self)

    @contextmanager
    def copy(self) -> Iterator[ProgramState]:
        """A branch of this state for the block; joined back (its new variables
        gathered) when the block ends."""
        group = self.fork(1)
        try:
            yield group[0]
        finally:
            group.join()

    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        """The text (or one variable) in pieces as it is generated; the pieces
        concatenate to the final text. Without ``stream=True``, one piece at the end."""
        executor = self.stream_executor
        if not executor.stream:
            yield self.text() if var_name is None else self.get_var(var_name)
            return
        yield from executor.iter_text(var_name)

    async def text_async_iter(self, var_name: str | None = None) -> Any:
        """``text_iter`` for asyncio (the waits run in a worker thread)."""
        import asyncio

        loop = asyncio.get_running_loop()
        pieces = self.text_iter(var_name)
        done = object()
        while (piece := await loop.run_in_executor(None, next, pieces, done)) is not done:
            yield piece

    def __del__(self) -> None:
        # A branch never joined: let its worker thread end (the thread itself keeps
        # the executor alive, so only the state's end can stop it).
        self.stream_executor.end()

    def __repr__(self) -> str:
        return f"ProgramState({self.text()!r})"


class ProgramStateGroup:
    """The branches of a ``fork``; ``+=`` appends to each (one expression for all,
    a callable of the branch index, or a list with one per branch)."""

    def __init__(self, states: list[ProgramState], parent: ProgramState) -> None:
        self.states = states
        self.parent = parent

    def __getitem__(self, i: int) -> ProgramState:
        return self.states[i]

    def __len__(self) -> int:
        return len(self.states)

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.states)

    def __iadd__(self, other: Any) -> ProgramStateGroup:
        if callable(other) and not isinstance(other, Expr):
            for i, state in enumerate(self.states):
                state += other(i)
        elif isinstance(other, list | tuple):
            if len(other) != len(self.states):
                raise ValueError(f"{len(other)} expressions for {len(self.states)} branches")
            for state, expr in zip(self.states, other):
                state += expr
        else:
            for state in self.states:
                state += other
        return self

    def join(self, mode: str = "gather_variable") -> None:
        """Ends the branches. ``gather_variable``: each variable the branches made
        becomes a list in the parent, in branch order. ``concate_and_append``: the
        branches' own texts are appended to the parent's, in order."""
        for state in self.states:
            state.stream_executor.sync()
        parent = self.parent.stream_executor
        if mode == "gather_variable":
            parent.sync()
            known = set(parent.variables)
            gathered: dict[str, list[Any]] = {}
            for state in self.states:
                for name, value in state.stream_executor.variables.items():
                    if name not in known:
                        gathered.setdefault(name, []).append(value)
                        parent.meta_info.setdefault(name, []).append(
                            state.stream_executor.meta_info.get(name)
                        )
            for name, values in gathered.items():
                parent.set_var(name, values)
        elif mode == "concate_and_append":
            texts = [s.stream_executor.text_[s.stream_executor.fork_start :] for s in self.states]
            self.parent += "".join(texts)
            parent.sync()
        else:
            raise ValueError(
                f"join mode must be 'gather_variable' or 'concate_and_append', got {mode!r}"
            )
        errors = [s.stream_executor.error_ for s in self.states if s.stream_executor.error_]
        if errors and parent.error_ is None:
            parent.error_ = errors[0]
        for state in self.states:
            state.stream_executor.end()
