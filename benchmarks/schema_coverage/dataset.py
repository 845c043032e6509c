"""JSONSchemaBench's schemas as files, in either of its two layouts.

    JSONSchemaBench  ``DATA/<Dataset>/<name>.json``, one JSON schema each (its ``data/``)
    MaskBench        ``DATA/<Dataset>---<name>.json`` or ``DATA/<Dataset>_<n>.json``,
                     each ``{"schema": ..., "tests": ...}`` (its ``maskbench/data/``:
                     most of the same schemas, plus BFCL's function-call ones, JSON mode
                     eval's and MCP's)

``list_schema_files`` tells them apart (dataset folders, or ``*.json`` files at the top).
The sample is drawn per dataset from that dataset's sorted file names with a
generator seeded by ``"<seed>:<dataset>"``, so it depends on the seed and the names
alone (not on the order the file system lists them, nor on which other datasets
are present).
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "SOURCES",
    "SchemaFile",
    "compact_schema",
    "data_folder",
    "is_maskbench",
    "list_schema_files",
    "sample_schemas",
    "schema_prompt",
]

# The repository both layouts come from, at the commit the figures were measured on, and
# where each layout lies in it.
REPOSITORY = "https://github.com/guidance-ai/jsonschemabench"
COMMIT = "ba103c73"
SOURCES = {"jsonschemabench": "data", "maskbench": "maskbench/data"}

# A MaskBench file's dataset: the part before "---", else the name less "_<n>.json".
_MASKBENCH_DATASET = re.compile(r"^(?:(.+?)---.*|(.+)_\d+\.json)$")


@dataclass(frozen=True)
class SchemaFile:
    """One schema of the benchmark: its dataset and file name; ``wrapped`` for a
    MaskBench file (at the folder's top, the schema under its ``"schema"`` key)."""

    dataset: str
    name: str
    wrapped: bool = False

    def path(self, data_dir: Path) -> Path:
        return data_dir / self.name if self.wrapped else data_dir / self.dataset / self.name

    def load(self, data_dir: Path) -> Any:
        """The schema.

        Raises:
            OSError: the file cannot be read.
            ValueError: it is not JSON, or a MaskBench file without a ``"schema"``.
        """
        doc = json.loads(self.path(data_dir).read_text(encoding="utf-8"))
        if not self.wrapped:
            return doc
        if not isinstance(doc, dict) or "schema" not in doc:
            raise ValueError(f'{self.name}: a MaskBench file holds {{"schema": ...}}')
        return doc["schema"]


def default_cache() -> Path:
    """Where ``data_folder`` keeps its clone: ``$RADIXLM_CACHE`` (default
    ``~/.cache/radixlm``) / ``jsonschemabench``."""
    root = os.environ.get("RADIXLM_CACHE") or Path.home() / ".cache" / "radixlm"
    return Path(root) / "jsonschemabench"


def data_folder(source: str, cache: Path, fetch: bool) -> Path:
    """``source``'s folder (a key of ``SOURCES``) in the clone at ``cache``, cloned there
    at ``COMMIT`` first when ``fetch`` and it is missing.

    Raises:
        ValueError: an unknown source; the clone is missing and ``fetch`` is off; or git
            failed (offline, no git): what it said.
    """
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}; known: {sorted(SOURCES)}")
    folder = cache / SOURCES[source]
    if folder.is_dir():
        return folder
    if not fetch:
        raise ValueError(
            f"{folder} is missing: give --data DIR (JSONSchemaBench's data/ or "
            f"maskbench/data/), or --fetch to clone {REPOSITORY} into {cache}"
        )
    commands = (
        ["git", "clone", "--quiet", REPOSITORY, str(cache)],
        ["git", "-C", str(cache), "checkout", "--quiet", COMMIT],
    )
    for command in commands:
        try:
            subprocess.run(command, check=True, capture_output=True, text=True)
        except (OSError, subprocess.CalledProcessError) as e:
            said = getattr(e, "stderr", None) or str(e)
            raise ValueError(f"fetching {REPOSITORY} failed: {' '.join(command)}: {said}") from e
    if not folder.is_dir():
        raise ValueError(f"{REPOSITORY} at {COMMIT} has no {SOURCES[source]}/")
    return folder


def is_maskbench(data_dir: Path) -> bool:
    """Whether ``data_dir`` is MaskBench's layout: ``*.json`` files at its top."""
    return data_dir.is_dir() and any(data_dir.glob("*.json"))


def list_schema_files(data_dir: Path, datasets: list[str] | None = None) -> dict[str, list[str]]:
    """Each dataset's ``*.json`` file names, sorted; ``datasets`` limits those read.

    Raises:
        ValueError: ``data_dir`` holds no dataset, or a named one is missing.
    """
    if is_maskbench(data_dir):
        grouped: dict[str, list[str]] = {}
        for p in data_dir.glob("*.json"):
            match = _MASKBENCH_DATASET.match(p.name)
            dataset = (match.group(1) or match.group(2)) if match else p.stem
            grouped.setdefault(dataset, []).append(p.name)
    else:
        folders = [p for p in data_dir.iterdir() if p.is_dir()] if data_dir.is_dir() else []
        grouped = {p.name: [f.name for f in p.glob("*.json")] for p in folders}
    if not grouped:
        raise ValueError(
            f"{data_dir} holds no dataset folders (expected DATA/<Dataset>/*.json, or "
            "MaskBench's DATA/<Dataset>---<name>.json)"
        )
    found = sorted(grouped)
    missing = sorted(set(datasets or []) - set(found))
    if missing:
        raise ValueError(f"no dataset folder {missing} in {data_dir}; it has {found}")
    return {d: sorted(grouped[d]) for d in found if datasets is None or d in datasets}


def sample_schemas(
    files: dict[str, list[str]], per_dataset: int, seed: int, *, wrapped: bool = False
) -> list[SchemaFile]:
    """Up to ``per_dataset`` schemas of each dataset (all of a smaller one), datasets in
    name order and each one's files sorted; ``wrapped``: MaskBench's files.

    Raises:
        ValueError: ``per_dataset`` < 1.
    """
    if per_dataset < 1:
        raise ValueError(f"per_dataset must be >= 1, got {per_dataset}")
    sample = []
    for dataset in sorted(files):
        names = sorted(files[dataset])
        picked = random.Random(f"{seed}:{dataset}").sample(names, min(per_dataset, len(names)))
        sample += [SchemaFile(dataset, name, wrapped) for name in sorted(picked)]
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
