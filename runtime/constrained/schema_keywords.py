"""Where a JSON schema keeps its subschemas, and how a property name becomes a JSON
pointer token: the shape every walk over a schema shares (``schema_check`` reading a
schema for a backend, ``spec_limits`` bounding its size before any compile).

Plain data, no jsonschema: ``spec_limits`` runs on every request, with or without the
optional grammar packages installed.
"""

from __future__ import annotations

__all__ = [
    "ONE_SCHEMA_KEYWORDS", "SCHEMA_DICT_KEYWORDS", "SCHEMA_LIST_KEYWORDS", "pointer_token",
]  # fmt: skip

# Keywords whose value is one subschema / a list of them / a dict of them.
ONE_SCHEMA_KEYWORDS = (
    "items", "additionalProperties", "propertyNames", "not", "contains", "if", "then", "else",
    "unevaluatedItems", "unevaluatedProperties", "additionalItems",
)  # fmt: skip
SCHEMA_LIST_KEYWORDS = ("prefixItems", "anyOf", "oneOf", "allOf")
SCHEMA_DICT_KEYWORDS = (
    "properties",
    "$defs",
    "definitions",
    "patternProperties",
    "dependentSchemas",
)


def pointer_token(name: str) -> str:
    """A property name as a JSON pointer token (RFC 6901)."""
    return name.replace("~", "~0").replace("/", "~1")
