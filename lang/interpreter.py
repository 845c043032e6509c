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

A ``StreamExecutor`` composes one part per job, and sends each expression to its
part by the expression's type (``_handlers``):

    StreamWorker   the thread and its queue, sync / end, the kept failure
    StreamStore    text, variables, meta info, and the waits of their readers
    Conversation   role blocks -> the chat template's text and the chat messages
    GenRunner      gen / select -> requests to the backend -> results in the store
    text_stream    the text (or a variable) in pieces as it grows

What programs see (``ProgramState``, ``ProgramStateGroup``, ``RoleBlocks``) is in
``program_state.py``, importable from here as from ``sglang.lang.interpreter``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from radixlm.backends.base import Backend, UnsupportedInputError
from radixlm.conversation import Conversation
from radixlm.gen_runner import GenRunner
from radixlm.ir import (
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
)
from radixlm.ir_walk import defined_names, named_gens_and_selects, walk
from radixlm.program_state import ProgramState, ProgramStateGroup, RoleBlocks
from radixlm.stream_store import StreamStore
from radixlm.stream_worker import StreamWorker
from radixlm.text_stream import iter_text

__all__ = [
    "ProgramState",
    "ProgramStateGroup",
    "RoleBlocks",
    "StreamExecutor",
    "UnsupportedInputError",
]


class StreamExecutor:
    """One program stream: its text, chat messages and variables, and the worker
    thread that executes its expressions in order.

    Args:
        backend: where the stream's gens and selects go.
        defaults: the ``run()`` sampling arguments every gen starts from.
        stream: whether gens stream into the text as they are generated.
        store, conversation: the state to start from (a fork's copies); fresh if None.
    """

    def __init__(
        self,
        backend: Backend,
        defaults: GenParams,
        stream: bool,
        store: StreamStore | None = None,
        conversation: Conversation | None = None,
    ) -> None:
        self.backend = backend
        self.defaults = defaults
        self.stream = stream
        self.store = store if store is not None else StreamStore()
        self.conversation = (
            conversation if conversation is not None else Conversation(backend.chat_template)
        )
        self.fork_start = len(self.store.text)  # where a branch's own text starts
        self.gens = GenRunner(backend, defaults, stream, self.store, self.conversation)
        self._handlers = self._build_handlers()
        self.worker = StreamWorker(self._execute, self._settle, self.store.finish)

    # SGLang's StreamExecutor attributes, which programs and tools read.
    @property
    def text_(self) -> str:
        return self.store.text

    @property
    def messages_(self) -> list[dict[str, str]]:
        return self.conversation.messages

    @property
    def variables(self) -> dict[str, Any]:
        return self.store.variables

    @property
    def meta_info(self) -> dict[str, Any]:
        return self.store.meta_info

    @property
    def error_(self) -> BaseException | None:
        return self.worker.error

    # ---- the program side ---------------------------------------------------------------

    def submit(self, expr: Expr) -> None:
        """Queues ``expr``; readers of the variables it sets wait until it has run.

        Raises:
            UnsupportedInputError: it holds an image or video and the model is text-only.
            RuntimeError: the stream has ended.
        """
        self._check_inputs(expr)
        self.worker.submit(expr, accepted=lambda: self.store.expect(defined_names(expr)))

    def sync(self) -> None:
        """Waits until every expression submitted so far has run."""
        self.worker.sync()

    def end(self) -> None:
        """No more expressions: the worker finishes what is queued, then stops."""
        self.worker.end()

    def wait_finished(self) -> None:
        """Waits until the worker has stopped (after ``end``)."""
        self.worker.join()

    def get_var(self, name: str) -> Any:
        """Variable ``name`` once set. Raises KeyError: it is not (nor will be)."""
        return self.store.get_var(name, self._failure_note())

    def set_var(self, name: str, value: Any) -> None:
        self.store.set_var(name, value)

    def has_var(self, name: str) -> bool:
        """Whether ``name`` is set or will be by an expression already submitted."""
        return name in self.store

    def get_meta_info(self, name: str) -> Any:
        """The meta info of the gen or select that set ``name``; waits as ``get_var``."""
        return self.store.get_meta_info(name, self._failure_note())

    def fork(self, size: int) -> list[StreamExecutor]:
        """``size`` branches starting from this stream's exact state (text, messages,
        variables, role); with several, the shared prefix is computed once first."""
        self.sync()
        if size > 1 and self.store.text:
            self.backend.cache_prefix(self.backend.tokenize(self.store.text))
        return [
            StreamExecutor(
                self.backend,
                self.defaults,
                self.stream,
                self.store.branch(),
                self.conversation.branch(),
            )
            for _ in range(size)
        ]

    def join_branches(self, branches: list[StreamExecutor], mode: str) -> None:
        """Ends ``branches`` (forked from this stream), taking in what they made.

        mode: ``gather_variable``: each variable the branches made becomes a list
            here, in branch order. ``concate_and_append``: their own texts are
            appended here, in order. A branch's failure becomes this stream's
            unless it has one.

        Raises:
            ValueError: another mode.
        """
        for branch in branches:
            branch.sync()
        if mode == "gather_variable":
            self.sync()
            self.store.gather([b.store for b in branches])
        elif mode == "concate_and_append":
            self.submit(Text("".join(b.store.text[b.fork_start :] for b in branches)))
            self.sync()
        else:
            raise ValueError(
                f"join mode must be 'gather_variable' or 'concate_and_append', got {mode!r}"
            )
        errors = [b.error_ for b in branches if b.error_ is not None]
        if errors and self.worker.error is None:
            self.worker.error = errors[0]
        for branch in branches:
            branch.end()

    def iter_text(self, name: str | None) -> Iterator[str]:
        """The stream's text (or variable ``name``'s) as it grows, until it is final."""
        return iter_text(self.store, name)

    def _failure_note(self) -> str:
        error = self.worker.error
        return f" (the program failed: {error!r})" if error is not None else ""

    def _check_inputs(self, expr: Expr) -> None:
        for node in walk(expr):
            if isinstance(node, Image | Video) and not self.backend.is_multimodal:
                kind = "an image" if isinstance(node, Image) else "a video"
                raise UnsupportedInputError(
                    f"the program appends {kind} ({node.path!r}), but the backend's model "
                    "is text-only"
                )

    # ---- the worker side ----------------------------------------------------------------

    def _build_handlers(self) -> dict[type, Callable[[Any], None]]:
        store, conversation = self.store, self.conversation
        return {
            Text: lambda e: store.append(e.value),
            ExprList: self._execute_list,
            RoleBegin: lambda e: conversation.begin(e.role, store),
            RoleEnd: lambda e: conversation.end(e.role, store),
            Gen: self.gens.gen,
            Select: self.gens.select,
            VarScopeBegin: lambda e: store.open_scope(e.name),
            VarScopeEnd: lambda e: store.close_scope(e.name),
            SeparateReasoning: self._separate_reasoning,
            Image: self._refuse_media,
            Video: self._refuse_media,
        }

    def _execute(self, expr: Expr) -> None:
        handler = self._handlers.get(type(expr))
        if handler is None:
            raise TypeError(f"cannot execute {type(expr).__name__}")
        handler(expr)

    def _settle(self, expr: Expr) -> None:
        self.store.release(defined_names(expr))

    def _execute_list(self, expr: ExprList) -> None:
        for item in expr.items:
            self._execute(item)

    def _separate_reasoning(self, expr: SeparateReasoning) -> None:
        for name in named_gens_and_selects(expr.expr):
            self.store.split_reasoning(name, expr.model_type)

    def _refuse_media(self, expr: Image | Video) -> None:
        raise UnsupportedInputError("the backend's model is text-only")
