"""radixlm: a structured-generation program runtime.

``import radixlm as sgl`` runs SGLang frontend programs: ``@function`` bodies that
append text, role blocks, ``gen`` and ``select`` to a program state, ``fork`` it,
and run once, streamed or in batches, on radixlm's runtime (``Runtime``: the engine
in this process; ``RuntimeEndpoint``: a radixlm server over HTTP; ``OpenAI``: any
OpenAI-compatible server, for what that API can express). ``radixlm.Engine``
is the engine itself (SGLang's offline ``Engine`` API). The engine loads when a
``Runtime`` or ``Engine`` is first made.

SGLang's module paths map one level up: ``sglang.lang.ir`` is ``radixlm.ir``
(``REGEX_INT``, ...), ``sglang.lang.choices`` is ``radixlm.choices``
(``ChoicesSamplingMethod``, ``ChoicesDecision``), ``sglang.global_config`` is
``radixlm.global_config`` (``from radixlm.global_config import global_config``); as in
SGLang, the package attribute ``radixlm.global_config`` is the object, not the module.
"""

from typing import TYPE_CHECKING, Any

from radixlm.api import (
    ProgramArgumentError,
    assistant,
    assistant_begin,
    assistant_end,
    gen,
    gen_int,
    gen_string,
    image,
    select,
    separate_reasoning,
    system,
    system_begin,
    system_end,
    user,
    user_begin,
    user_end,
    video,
)
from radixlm.choices import (
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)
from radixlm.function import SglFunction, function, get_default_backend, set_default_backend
from radixlm.global_config import global_config
from radixlm.interpreter import ProgramState, ProgramStateGroup, UnsupportedInputError
from radixlm.runtime.errors import (
    ContextLengthError,
    InvalidRequestError,
    InvalidSamplingParamsError,
    ModelLoadError,
    ModelNotFoundError,
    RadixLMError,
    RequestLimitError,
)

if TYPE_CHECKING:
    from radixlm.backends.openai import OpenAI
    from radixlm.backends.runtime import Runtime
    from radixlm.backends.runtime_endpoint import RuntimeEndpoint
    from radixlm.runtime.entrypoints.engine import Engine

__all__ = [
    "ContextLengthError",
    "Engine",
    "InvalidRequestError",
    "InvalidSamplingParamsError",
    "ModelLoadError",
    "ModelNotFoundError",
    "OpenAI",
    "ProgramArgumentError",
    "ProgramState",
    "ProgramStateGroup",
    "RadixLMError",
    "RequestLimitError",
    "Runtime",
    "RuntimeEndpoint",
    "SglFunction",
    "UnsupportedInputError",
    "assistant",
    "assistant_begin",
    "assistant_end",
    "flush_cache",
    "function",
    "gen",
    "gen_int",
    "gen_string",
    "get_default_backend",
    "get_server_info",
    "global_config",
    "greedy_token_selection",
    "image",
    "select",
    "separate_reasoning",
    "set_default_backend",
    "system",
    "system_begin",
    "system_end",
    "token_length_normalized",
    "unconditional_likelihood_normalized",
    "user",
    "user_begin",
    "user_end",
    "video",
]


def flush_cache(backend: Any = None) -> bool:
    """Empties the backend's (default: the default backend's) prefix cache; False
    when there is no backend or requests are running."""
    backend = backend or get_default_backend()
    return False if backend is None else backend.flush_cache()


def get_server_info(backend: Any = None) -> dict[str, Any] | None:
    """What the backend (default: the default backend) serves; None without one."""
    backend = backend or get_default_backend()
    return None if backend is None else backend.get_server_info()


def __getattr__(name: str) -> Any:
    if name == "Engine":
        from radixlm.runtime.entrypoints.engine import Engine

        return Engine
    if name == "Runtime":
        from radixlm.backends.runtime import Runtime

        return Runtime
    if name == "OpenAI":
        from radixlm.backends.openai import OpenAI

        return OpenAI
    if name == "RuntimeEndpoint":
        from radixlm.backends.runtime_endpoint import RuntimeEndpoint

        return RuntimeEndpoint
    raise AttributeError(f"module 'radixlm' has no attribute {name!r}")
