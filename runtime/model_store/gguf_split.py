"""The names of a GGUF split into files, as llama.cpp names the parts (``gguf-split``,
``convert_hf_to_gguf.py --split-max-*``; large models on the hub come so)::

    Model-Q4_K_M-00001-of-00003.gguf   every metadata key, split.no 0, split.count 3,
    Model-Q4_K_M-00002-of-00003.gguf   then tensors; the other parts: split.no and
    Model-Q4_K_M-00003-of-00003.gguf   split.count, then tensors

The first part stands for the whole model (llama.cpp loads it and finds the others
beside it); so does radixlm (``gguf_arch.open_gguf``, ``hub.pick_gguf``). Names only
here: no ``gguf`` import, for the hub's listing as for files on disk.
"""

from __future__ import annotations

import re

__all__ = ["split_part_names"]

_PART = re.compile(r"(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf", re.IGNORECASE)


def split_part_names(name: str) -> list[str] | None:
    """Every part's name of the split GGUF ``name`` is a part of, the first first
    (``m-00002-of-00003.gguf`` -> ``[m-00001-of-00003.gguf, m-00002-..., m-00003-...]``,
    in ``name``'s folder if it has one); None when ``name`` is no part's name."""
    match = _PART.fullmatch(name)
    if match is None or not 1 <= int(match["no"]) <= int(match["count"]):
        return None
    count = int(match["count"])
    suffix = name[match.end("count") :]  # ".gguf" as spelled
    return [f"{match['stem']}-{i:05d}-of-{count:05d}{suffix}" for i in range(1, count + 1)]
