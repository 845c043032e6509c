"""The sampling table's bounds on the HTTP request models.

    temperature: Annotated[float | None, SamplingBound("temperature", OPENAI)] = None

checks a body's value with ``SamplingField.check`` (``runtime/io/sampling_fields``), the
engine's own check, while pydantic validates the body: a value out of bounds is a 400
naming the field with the engine's message, before any prompt is tokenized, and no
route carries a limit of its own that could drift from the engine's. Pydantic's strict
types do the type half (``"0.5"`` and ``true`` are no temperatures), as the engine does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import GetCoreSchemaHandler
from pydantic_core import PydanticCustomError, core_schema

from radixlm.runtime.errors import InvalidSamplingParamsError
from radixlm.runtime.io.sampling_fields import Surface, sampling_field

__all__ = ["OPENAI", "SamplingBound"]

# The fields chat and completions share (protocol.SamplingExtras) are bounded
# alike on both.
OPENAI: tuple[Surface, ...] = ("chat", "completions")


@dataclass(frozen=True)
class SamplingBound:
    """Pydantic metadata: the value must pass the table's check of field ``name`` on
    ``surfaces`` (None passes: it means the default).

    Raises:
        ValueError: at class definition, ``surfaces`` that bound ``name`` differently
            (one model field cannot hold two bounds) or a field not in the table.
    """

    name: str
    surfaces: tuple[Surface, ...]

    def __post_init__(self) -> None:
        spec = sampling_field(self.name)
        missing = [s for s in self.surfaces if not spec.names_on(s)]
        if missing:
            raise ValueError(f"{self.name} is not exposed on {missing} in the sampling table")
        if len({spec.bound_on(s) for s in self.surfaces}) > 1:
            raise ValueError(f"{self.name} is bounded differently on {self.surfaces}")

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self._check, handler(source))

    def _check(self, value: Any) -> Any:
        if value is None:
            return value
        try:
            sampling_field(self.name).check(value, self.surfaces[0])
        except InvalidSamplingParamsError as e:
            raise PydanticCustomError("sampling_bound", "{reason}", {"reason": e.reason}) from e
        return value
