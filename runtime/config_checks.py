"""The value checks the component configs share; each raises ``ConfigError`` naming
the option, what it must be and what it got."""

from __future__ import annotations

from radixlm.runtime.errors import ConfigError

__all__ = ["check_positive", "is_number"]


def is_number(value: object, above: float) -> bool:
    """Whether ``value`` is an int or float (not a bool) greater than ``above``."""
    return isinstance(value, int | float) and not isinstance(value, bool) and value > above


def check_positive(name: str, value: object, optional: bool = False, minimum: int = 1) -> None:
    """Raises ConfigError unless ``value`` is an int >= ``minimum`` (or None, if ``optional``)."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
