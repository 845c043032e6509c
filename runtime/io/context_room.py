"""The context-fit rule, once: a request's prompt plus the tokens it may generate fit in
the model's context, and in the KV pool (a request must fit there alone).

    num_prompt_tokens + num_new_tokens <= max_total_tokens = min(context_len, kv_capacity)

The engine's request builder applies it to every request (``max_new_tokens`` as asked);
the OpenAI routes apply it before they build one, to answer OpenAI's
``context_length_exceeded`` naming their own field and to turn an omitted ``max_tokens``
into all the room left. Either applies it first to a lower bound on a text's tokens
(``TokenBound``), so that a text far too long is refused untokenized.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixlm.runtime.errors import ContextLengthError

__all__ = ["ContextRoom"]


@dataclass(frozen=True)
class ContextRoom:
    """context_len: the model's context length (or the engine's ``context_length`` cap);
    kv_capacity: the KV pool's slots (None: no pool to fit, only the context)."""

    context_len: int
    kv_capacity: int | None = None

    @property
    def max_total_tokens(self) -> int:
        """The most prompt plus output tokens one request may hold."""
        if self.kv_capacity is None:
            return self.context_len
        return min(self.context_len, self.kv_capacity)

    def num_new_tokens(
        self,
        num_prompt_tokens: int,
        requested: int | None,
        param: str = "max_new_tokens",
        at_least: bool = False,
    ) -> int:
        """The tokens a request may generate after its prompt: ``requested``, or (None)
        all the room left, which must be at least one token.

        Args:
            num_prompt_tokens: the prompt's tokens; with ``at_least``, a lower bound on
                them (the text is not tokenized yet).
            requested: the new tokens asked for (0 scores the prompt only), or None.
            param: the field ``requested`` came in, as the caller spells it.

        Raises:
            ContextLengthError: they do not fit (``field`` is ``param``).
        """
        room = self.max_total_tokens - num_prompt_tokens
        if requested is None and room >= 1:
            return room
        if requested is not None and requested <= room:
            return requested
        prompt = f"at least {num_prompt_tokens}" if at_least else str(num_prompt_tokens)
        asked = "" if requested is None else f" + {requested} new tokens ({param})"
        raise ContextLengthError(f"the prompt has {prompt} tokens{asked}; {self._holder()}", param)

    def _holder(self) -> str:
        """What holds the fewest tokens, the pool (an engine option) or the context."""
        if self.kv_capacity is not None and self.kv_capacity < self.context_len:
            pool = self.kv_capacity
            return f"the KV pool holds {pool} (prompt plus output; raise max_total_tokens)"
        return f"this model's context holds {self.context_len} (prompt plus output)"
