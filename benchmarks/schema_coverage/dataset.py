"""JSONSchemaBench as files: ``DATA/<Dataset>/<name>.json``, one JSON schema each.

The sample is drawn per dataset from that dataset's sorted file names with a
generator seeded by ``"<seed>:<dataset>"``, so it depends on the seed and the names
alone (not on the order the file system lists them, nor on which other datasets
are present).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["SchemaFile", "compact_schema", "list_schema_files", "sample_schemas", "schema_prompt"]


@dataclass(frozen=True)
class SchemaFile:
    """One schema of the benchmark: its dataset (folder) and file name."""

    dataset: str
    name: str

    def path(self, data_dir: Path) -> Path:
        return data_dir / self.dataset / self.name

    def load(self, data_dir: Path) -> dict[str, Any]:
        return json.loads(self.path(data_dir).read_text(encoding="utf-8"))


def list_schema_files(data_dir: Path, datasets: list[str] | None = None) -> dict[str, list[str]]:
    """Each dataset's ``*.json`` file names, sorted; ``datasets`` limits the folders read.

    Raises:
        ValueError: ``data_dir`` holds no dataset folder, or a named one is missing.
    """
    found = sorted(p.name for p in data_dir.iterdir() if p.is_dir()) if data_dir.is_dir() else []
    if not found:
        raise ValueError(f"{data_dir} holds no dataset folders (expected DATA/<Dataset>/*.json)")
    missing = sorted(set(datasets or []) - set(found))
    if missing:
        raise ValueError(f"no dataset folder {missing} in {data_dir}; it has {found}")
    chosen = [d for d in found if datasets is None or d in datasets]
    return {d: sorted(p.name for p in (data_dir / d).glob("*.json")) for d in chosen}


def sample_schemas(files: dict[str, list[str]], per_dataset: int, seed: int) -> list[SchemaFile]:
    """Up to ``per_dataset`` schemas of each dataset (all of a smaller one), datasets in
    name order and each one's files sorted.

    Raises:
        ValueError: ``per_dataset`` < 1.
    """
    if per_dataset < 1:
        raise ValueError(f"per_dataset must be >= 1, got {per_dataset}")
    sample = []
    for dataset in sorted(files):
        names = sorted(files[dataset])
        picked = random.Random(f"{seed}:{dataset}").sample(names, min(per_dataset, len(names)))
        sample += [SchemaFile(dataset, name) for name in sorted(picked)]
    return sample


def compact_schema(schema: dict[str, Any]) -> str:
    """The schema as compact JSON (key order kept): the fewest prompt tokens."""
    return json.dumps(schema, ensure_ascii=False, separators=(",", ":"))


def schema_prompt(schema: dict[str, Any], max_schema_chars: int) -> str:
    """The user message asking for an object matching ``schema``.

    The instruction comes first, so every prompt shares it as a cached prefix; the
    schema's text is cut at ``max_schema_chars`` (the grammar, not the prompt, is
    what enforces the schema: the prompt only has to say what the object is about).
    """
    text = compact_schema(schema)
    if len(text) > max_schema_chars:
        text = text[:max_schema_chars] + " ... (schema truncated)"
    return (
        "Write one JSON object that is valid under the JSON Schema below. Fill in "
        "realistic values. Reply with the JSON object only.\n\n"
        f"JSON Schema:\n{text}"
    )
