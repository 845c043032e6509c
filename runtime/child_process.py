"""The command line of every Python process radixlm starts: ``python -P -m MODULE``.

``python -m`` puts the working directory first on ``sys.path``, so whatever a user's
directory holds shadows the installed packages in every child. From the root of a
source checkout that is radixlm's own ``kernels/`` folder, which hides Hugging Face's
``kernels`` package that transformers imports (``cannot import name 'CUDAProperties'
from 'kernels'``); elsewhere a stray ``torch.py`` or ``radixlm/`` does the same. A child
never needs its working directory importable: radixlm resolves from the install
(the editable install's finder included), so it is left off:

    Python >= 3.11   python -P -m MODULE ARGS...          -P: no working directory
    Python 3.10      python -c BOOTSTRAP MODULE ARGS...   the bootstrap drops the ''
                                                          that -c puts first, then runs
                                                          MODULE as -m would

The working directory itself is unchanged: relative paths in ARGS still resolve.
"""

from __future__ import annotations

import sys

__all__ = ["python_module_command"]

_HAS_SAFE_PATH_FLAG = sys.version_info >= (3, 11)

# sys is built in; runpy is imported only once the working directory is off the path.
_RUN_MODULE_WITHOUT_CWD = """\
import sys
if sys.path and sys.path[0] == "":
    del sys.path[0]
import runpy
runpy.run_module(sys.argv.pop(1), run_name="__main__", alter_sys=True)
"""


def python_module_command(module: str, *args: str) -> list[str]:
    """``[python, ..., module, *args]``: runs ``module`` as ``python -m`` does, in this
    interpreter, without the working directory on ``sys.path``."""
    if _HAS_SAFE_PATH_FLAG:
        return [sys.executable, "-P", "-m", module, *args]
    return [sys.executable, "-c", _RUN_MODULE_WITHOUT_CWD, module, *args]
