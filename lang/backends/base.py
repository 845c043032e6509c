"""What the interpreter needs from a model: the ``Backend`` protocol.

Every backend speaks the runtime's typed contract (``radixlm.runtime.io``):
``GenerateRequest`` in, ``GenerateOutput`` / ``StreamChunk`` out. The in-process
``Runtime`` is one and the HTTP ``RuntimeEndpoint`` another, so every DSL program
and test runs on each unchanged; ``OpenAI`` (any OpenAI-compatible server) serves
what that API can express and refuses the rest by name.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from radixlm.choices import ChoiceScores
from radixlm.runtime.errors import InvalidRequestError
from radixlm.runtime.io.chat_template import ChatTemplate
from radixlm.runtime.io.messages import GenerateOutput, GenerateRequest, StreamChunk

__all__ = ["Backend", "UnsupportedInputError"]


class UnsupportedInputError(InvalidRequestError):
    """The program asked for something its backend cannot serve: an image on a
    text-only model, or a primitive the backend's API cannot express (the message
    names it)."""


class Backend(Protocol):
    """A model the DSL runs programs on."""

    @property
    def chat_template(self) -> ChatTemplate:
        """The model's role blocks (from its own chat template)."""
        ...

    @property
    def is_multimodal(self) -> bool:
        """Whether programs may append images and videos."""
        ...

    def tokenize(self, text: str) -> list[int]:
        """The token ids the backend feeds the model for ``text`` (a program's text
        so far), BOS included where the model wants one and the text has none."""
        ...

    def decode(self, token_ids: Sequence[int]) -> str:
        """The text of ``token_ids`` (special tokens shown)."""
        ...

    def generate(self, requests: Sequence[GenerateRequest]) -> list[GenerateOutput]:
        """Runs the requests together (one batch for the runtime); every sample's
        final output, in order. Raises the runtime's ``InvalidRequestError`` (a
        ValueError) for a bad request."""
        ...

    def stream(self, request: GenerateRequest) -> Iterator[StreamChunk]:
        """One request's chunks as they come; closing the iterator aborts it."""
        ...

    def score_choices(self, text: str, choices: Sequence[str], unconditional: bool) -> ChoiceScores:
        """``select``'s evidence: each choice's scored tokens after ``text`` (and, when
        ``unconditional``, the same tokens scored with no prompt). Token-level
        backends share ``backends.scoring.score_choices_by_tokens``."""
        ...

    def cache_prefix(self, token_ids: Sequence[int]) -> None:
        """Computes the KV of ``token_ids`` into the prefix cache (no output)."""
        ...

    def flush_cache(self) -> bool:
        """Empties the prefix cache; False when it could not (requests running)."""
        ...

    def get_server_info(self) -> dict[str, Any]:
        """What the backend serves: model, context length, cache statistics, ..."""
        ...

    def shutdown(self) -> None: ...
