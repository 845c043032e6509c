"""What programs see: the state a body appends to and reads (``ProgramState``), the
branches of a ``fork`` (``ProgramStateGroup``), and the role blocks shared with the
tracer's state (``RoleBlocks``).

A ``ProgramState`` holds no state of its own: every call goes to its stream
executor (``interpreter.py``), which runs the expressions on its worker thread.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from radixlm.ir import Expr, ExprList, RoleBegin, RoleEnd, VarScopeBegin, VarScopeEnd, to_expr
from radixlm.text_stream import iter_pieces_async

if TYPE_CHECKING:
    from radixlm.interpreter import StreamExecutor

__all__ = ["ProgramState", "ProgramStateGroup", "RoleBlocks"]


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
        return self.stream_executor.has_var(name)

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

    async def text_async_iter(self, var_name: str | None = None) -> AsyncIterator[str]:
        """``text_iter`` for asyncio (the waits run in a worker thread)."""
        async for piece in iter_pieces_async(self.text_iter(var_name)):
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
        branches' own texts are appended to the parent's, in order.

        Raises:
            ValueError: another mode.
        """
        self.parent.stream_executor.join_branches(
            [state.stream_executor for state in self.states], mode
        )
