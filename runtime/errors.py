"""Errors radixlm raises at its edges.

Every error caused by what a caller passed in is a ``ValueError`` subclass, so
``except ValueError`` catches bad input and nothing else.
"""

from __future__ import annotations

__all__ = [
    "RadixLMError",
    "InvalidRequestError",
    "ConfigError",
    "InvalidSamplingParamsError",
    "ConstraintConflictError",
    "RequestLimitError",
    "ContextLengthError",
    "ModelLoadError",
    "UnsupportedArchitectureError",
    "ModelNotFoundError",
    "EngineStoppedError",
    "RankFailedError",
    "GrammarError",
    "UnsupportedGrammarError",
    "GrammarCompileTimeoutError",
]


class RadixLMError(Exception):
    """Base class of every error radixlm raises on purpose."""


class InvalidRequestError(RadixLMError, ValueError):
    """A request cannot be served as given (empty prompt, too long, ...)."""


class ConfigError(InvalidRequestError):
    """An engine option has a wrong type or value."""


class InvalidSamplingParamsError(InvalidRequestError):
    """A sampling parameter has a wrong type or value.

    Attributes:
        field: the name of the offending parameter.
        reason: what is wrong with it (the message without the field's name).
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"sampling parameter {field!r}: {message}")
        self.field = field
        self.reason = message


class ConstraintConflictError(InvalidSamplingParamsError):
    """A request asks for two output constraints; it takes at most one
    (``constrained.spec.check_one_constraint`` owns the rule).

    Attributes:
        field: the second constraint, named as the caller spelled it.
        first: the one already set, named likewise.
    """

    def __init__(self, first: str, second: str) -> None:
        message = f"{second} cannot be combined with {first}: a request takes one output constraint"
        super().__init__(second, message)
        self.first = first


class RequestLimitError(InvalidRequestError):
    """A request asks for more than the engine's ``LimitsConfig`` allows.

    Attributes:
        field: the request's field at fault (``stop``, ``top_logprobs_num``, ...).
        limit: the option that bounds it (``max_stop_chars``, ...).
    """

    def __init__(self, field: str, limit: str, message: str) -> None:
        super().__init__(f"{field}: {message} (the limit is the option {limit})")
        self.field = field
        self.limit = limit


class ContextLengthError(InvalidRequestError):
    """A request's prompt plus its output does not fit in the model's context or the KV
    pool (``io.context_room.ContextRoom`` owns the rule).

    Attributes:
        field: the field of the output budget, as the caller spelled it
            (``max_new_tokens``, ``max_tokens``, ...).
    """

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


class ModelLoadError(RadixLMError, ValueError):
    """A model directory is missing, incomplete or unreadable."""


class ModelNotFoundError(ModelLoadError):
    """The requested model directory does not exist (e.g. not pulled yet)."""


class UnsupportedArchitectureError(ModelLoadError):
    """config.json names an architecture radixlm does not implement."""


class EngineStoppedError(RadixLMError):
    """The engine was shut down (or its loop died) while a request waited."""


class GrammarError(InvalidSamplingParamsError):
    """A constraint (regex, JSON schema, EBNF grammar, choices) cannot be served:
    invalid, accepting nothing, or too large. ``field`` names the parameter."""


class UnsupportedGrammarError(GrammarError):
    """A constraint uses something the chosen backend does not enforce (e.g. a JSON
    Schema keyword); the message names it and, where one exists, the backend that does."""


class GrammarCompileTimeoutError(GrammarError):
    """Compiling a constraint took longer than the engine's ``grammar_compile_timeout``."""


class RankFailedError(RadixLMError, RuntimeError):
    """A tensor-parallel rank died or a collective between the ranks failed: the
    ranks are out of step, so the engine stops (never a ValueError: no request caused it)."""
