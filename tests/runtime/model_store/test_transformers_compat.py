"""A tokenizer loads through transformers from the root of a source checkout, where
radixlm's own ``kernels/`` folder shadows Hugging Face's ``kernels`` package."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

PROGRAM = """
from radixlm.runtime.model_store.transformers_compat import import_hub_kernels
import_hub_kernels()
import kernels
from transformers import AutoConfig  # loads transformers' hub-kernels integration
import transformers.integrations.hub_kernels
print(kernels.__file__)
"""


def test_hub_kernels_win_over_the_checkout_folder_from_the_root() -> None:
    try:
        importlib.metadata.version("kernels")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("Hugging Face's kernels is not installed (transformers before 5.25)")
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    path = Path(done.stdout.strip().splitlines()[-1]).resolve()
    assert ROOT / "kernels" not in path.parents
