"""Structured extraction: a pydantic model as the schema of a ``gen``.

``sgl.gen("info", json_schema=Person)`` constrains decoding to JSON that the
schema accepts, so ``Person.model_validate_json`` never fails on the output, even
on a 135M model: the model only chooses the values. The string fields carry a
``max_length`` so that the JSON ends within the gen's ``max_tokens``. The passages
are extracted as one batch (``run_batch``).

Run: ``.venv/bin/python examples/json_extraction.py``
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

import radixlm as sgl


class Person(BaseModel):
    name: str = Field(max_length=24)
    age: int = Field(ge=0, le=120)
    occupation: str = Field(max_length=24)
    city: str = Field(max_length=24)


PASSAGES = [
    "Maria Lopez is a 34-year-old nurse who lives in Madrid and works night shifts.",
    "At 61, retired pilot Kenji Watanabe spends his mornings gardening in Osaka.",
    "Tom Becker, 27, writes software for a bank in Berlin.",
    "The violinist Aisha Bello moved to Lagos last year; she turned 45 in May.",
]


@dataclass(frozen=True)
class Extraction:
    """The JSON text the model generated for one passage and the ``Person`` it parses to."""

    passage: str
    text: str
    person: Person


@sgl.function
def extract_person(s, passage: str):
    s += sgl.system("You extract facts from text and answer with JSON only.")
    s += sgl.user(
        "Extract the person's name, age, occupation and city from this text.\n\n" + passage
    )
    s += sgl.assistant(sgl.gen("info", json_schema=Person, max_tokens=96))


def main(num_passages: int | None = None, backend: Any = None) -> list[Extraction]:
    """Extracts a ``Person`` from each of the first ``num_passages`` passages (all by
    default); prints and returns them.

    Raises:
        pydantic.ValidationError: an output the schema rejects (never, by construction).
    """
    passages = PASSAGES[:num_passages]
    states = extract_person.run_batch(
        [{"passage": p} for p in passages], backend=backend, temperature=0
    )
    extractions = []
    for passage, state in zip(passages, states):
        person = Person.model_validate_json(state["info"])
        print(f"{passage}\n  -> {person!r}")
        extractions.append(Extraction(passage, state["info"], person))
    return extractions


if __name__ == "__main__":
    runtime = sgl.Runtime()
    sgl.set_default_backend(runtime)
    try:
        main()
    finally:
        runtime.shutdown()
