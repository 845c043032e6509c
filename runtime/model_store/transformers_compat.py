"""Importing ``transformers`` from a source checkout of radixlm.

transformers 5.25 and later import Hugging Face's ``kernels`` package (one of their
dependencies) when they load a model class or tokenizer. radixlm's own kernels live in
a folder named ``kernels/`` at the repository root (installed as ``radixlm.kernels``);
whenever that root is on ``sys.path`` (Python started there, or pytest, which puts it
first), ``import kernels`` finds the folder instead of the package and every tokenizer
load fails with ``cannot import name 'CUDAProperties' from 'kernels'``.

``import_hub_kernels`` imports the real package once, with the checkout's root off the
path for that one import, so later imports get it from ``sys.modules``. Installed
radixlm (a wheel) never has the clash; there it is a plain import.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

__all__ = ["import_hub_kernels"]

_CHECKOUT_ROOT = Path(__file__).resolve().parents[2]  # runtime/model_store/ -> the root


def import_hub_kernels() -> None:
    """Puts Hugging Face's ``kernels`` (when installed) in ``sys.modules``; call it
    before importing from ``transformers``."""
    module = sys.modules.get("kernels")
    if module is not None and not _is_ours(module):
        return
    sys.modules.pop("kernels", None)
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _CHECKOUT_ROOT]
    try:
        importlib.import_module("kernels")
    except ImportError:  # transformers before 5.25 go without it
        pass
    finally:
        sys.path[:] = saved


def _is_ours(module: object) -> bool:
    file = getattr(module, "__file__", None)
    return file is not None and Path(file).resolve().parent == _CHECKOUT_ROOT / "kernels"
