"""How many generations the server holds, and the 503 past ``max_queued_requests``.

Used only from the server's event loop thread, so a plain counter is enough.
A request takes a ``Ticket`` for its samples before it reaches the engine and
gives it back when its response is complete (a stream: when its last event is
sent or its client is gone).
"""

from __future__ import annotations

from radixlm.runtime.entrypoints.http.server.errors import INVALID, OVERLOADED, APIError

__all__ = ["Admission", "Ticket"]

# What a refused client is told to wait before trying again, in seconds.
RETRY_AFTER_S = 1


class Ticket:
    """``num`` admitted generations; ``release`` is idempotent."""

    def __init__(self, admission: Admission, num: int) -> None:
        self._admission = admission
        self.num = num
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._admission.in_use -= self.num


class Admission:
    """limit: the most generations held at once (``ServerConfig.max_queued_requests``);
    max_n: the most samples per prompt the engine serves (``SchedulerConfig.max_n``)."""

    def __init__(self, limit: int, max_n: int) -> None:
        self.limit = limit
        self.max_n = max_n
        self.in_use = 0

    def acquire(self, num: int, n: int = 1) -> Ticket:
        """Admits ``num`` generations (prompts x ``n``).

        Raises APIError: 400 when the request could never be admitted, whatever is in
        flight (``num`` alone past the limit, or ``n`` past ``max_n``: retrying cannot
        help); 503 with ``Retry-After`` only when ``num`` more would pass the limit now.
        """
        if num > self.limit:
            raise APIError(
                INVALID,
                f"this request needs {num} generations (prompts x n); the server admits at "
                f"most {self.limit} at once (max_queued_requests)",
                code="request_limit_exceeded",
            )
        if n > self.max_n:
            raise APIError(
                INVALID,
                f"n {n} exceeds this server's max_n {self.max_n} (the most samples one "
                "prompt may ask for)",
                "n",
                code="request_limit_exceeded",
            )
        if self.in_use + num > self.limit:
            raise APIError(
                OVERLOADED,
                f"the server holds {self.in_use} generations and admits at most {self.limit}; "
                f"this request needs {num} more: retry later",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        self.in_use += num
        return Ticket(self, num)
