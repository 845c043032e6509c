"""The thread that runs one program stream's expressions, in the order submitted.

The body submits and goes on (a gen runs while the body builds the next
expression); ``sync`` waits for everything submitted before it; ``end`` lets the
worker drain the queue and stop. The first failure is kept (``error``) and the
expressions after it are skipped, though still *settled*, so that readers of the
variables they would have set wake up and see the failure.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

from radixlm.ir import Expr

__all__ = ["StreamWorker"]


@dataclass(frozen=True)
class _Sync:
    """A no-op the worker marks done: ``sync`` waits for everything before it."""


class StreamWorker:
    """A worker thread and its queue of expressions.

    Args:
        execute: runs one expression (on the worker thread); what it raises becomes
            ``error`` and skips the later expressions.
        settle: called after each expression, run, failed or skipped.
        finish: called once, after the last expression, when the worker stops.
    """

    def __init__(
        self,
        execute: Callable[[Expr], None],
        settle: Callable[[Expr], None],
        finish: Callable[[], None],
    ) -> None:
        self.error: BaseException | None = None
        self._execute, self._settle, self._on_finish = execute, settle, finish
        self._ended = False
        self._finished = False
        self._lock = threading.Lock()  # orders submits and syncs against the worker's end
        self._queue: queue.Queue[Expr | _Sync | None] = queue.Queue()
        self._thread = threading.Thread(target=self._work, name="radixlm-program", daemon=True)
        self._thread.start()

    def submit(self, expr: Expr, accepted: Callable[[], None] = lambda: None) -> None:
        """Queues ``expr``; ``accepted`` runs just before, once it is sure to be queued.

        Raises:
            RuntimeError: the stream has ended.
        """
        with self._lock:
            if self._ended:
                raise RuntimeError("this program state has ended: nothing more can be appended")
            accepted()
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

    def join(self) -> None:
        """Waits until the worker has stopped (after ``end``)."""
        self._thread.join()

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if isinstance(item, Expr):
                    self._run(item)
            finally:
                self._queue.task_done()
            if item is None:
                self._finish()
                return

    def _run(self, expr: Expr) -> None:
        if self.error is None:
            try:
                self._execute(expr)
            except Exception as e:  # kept for state.error(); later expressions skip
                self.error = e
        self._settle(expr)

    def _finish(self) -> None:
        """After the last expression: syncs queued meanwhile are done, waiters wake."""
        with self._lock:
            self._finished = True
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
            self._queue.task_done()
        self._on_finish()
