"""``@function``: a program, and how it runs (once, streamed, or a batch at once).

``run()`` takes the program's arguments plus SGLang's sampling defaults (every gen
starts from them: temperature 1.0, max_new_tokens 128, ...) and returns the
``ProgramState``; ``run_batch`` runs many programs concurrently, so the runtime
batches their requests, and returns their states in input order.

``run`` and ``run_batch`` read ``global_config`` once, when they start (see
``global_config.py``): the default backend, ``verbosity``, the special-token
switches every gen sends, and whether a batch precomputes the constant prefix.

``num_api_spec_tokens`` is accepted and has no effect. In SGLang it batches the
gens of a chat-API model (which cannot continue a prefix) into one speculative
call; radixlm's backends continue any prefix, and the radix cache already serves
each gen's prompt from the KV of the previous one, so there is no call to save.
"""

from __future__ import annotations

import inspect
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from radixlm.api import ProgramArgumentError
from radixlm.backends.base import Backend
from radixlm.global_config import RunSettings, global_config
from radixlm.interpreter import ProgramState, StreamExecutor
from radixlm.ir import Expr, GenParams
from radixlm.runtime.errors import InvalidRequestError
from radixlm.runtime.io.sampling_fields import CHECKED_KINDS, fields_on
from radixlm.runtime.io.sampling_params import SamplingParams

__all__ = ["SglFunction", "function", "get_default_backend", "set_default_backend"]

# SGLang's threshold: a shorter constant prefix is not worth a precache request.
_PRECACHE_MIN_CHARS = 64


def set_default_backend(backend: Backend) -> None:
    """The backend programs run on when given none: ``global_config.default_backend``."""
    global_config.default_backend = backend


def get_default_backend() -> Backend | None:
    return global_config.default_backend


def function(func: Callable[..., Any] | None = None, num_api_spec_tokens: int | None = None) -> Any:
    """``@function`` or ``@function(num_api_spec_tokens=...)`` over a program body
    ``f(s, *args, **kwargs)``."""
    if func is not None:
        return SglFunction(func, num_api_spec_tokens=num_api_spec_tokens)
    return lambda f: SglFunction(f, num_api_spec_tokens=num_api_spec_tokens)


# run()'s sampling keywords and their defaults are the sampling table's (SGLang's);
# the sequences default to None ("not set") rather than ().
_RUN_DEFAULTS: dict[str, Any] = {
    **{
        spec.name: spec.default if spec.kind in CHECKED_KINDS else None for spec in fields_on("run")
    },
    "return_logprob": False,
    "logprob_start_len": None,
    "top_logprobs_num": None,
    "return_text_in_logprobs": False,
}
_RUN_FIELDS = frozenset(spec.name for spec in fields_on("run"))


class SglFunction:
    """A program. Calling it equals ``run``."""

    def __init__(
        self,
        func: Callable[..., Any],
        num_api_spec_tokens: int | None = None,
        bind_arguments: dict[str, Any] | None = None,
    ) -> None:
        if not callable(func):
            raise TypeError(f"@function needs a callable, got {func!r}")
        if num_api_spec_tokens is not None and (
            isinstance(num_api_spec_tokens, bool)
            or not isinstance(num_api_spec_tokens, int)
            or num_api_spec_tokens < 1
        ):
            raise ValueError(
                f"num_api_spec_tokens must be an int >= 1, got {num_api_spec_tokens!r}"
            )
        self.func = func
        self.num_api_spec_tokens = num_api_spec_tokens
        self.bind_arguments = dict(bind_arguments or {})
        self.arg_names = list(inspect.signature(func).parameters)[1:]
        self.__name__ = getattr(func, "__name__", "program")
        self.__doc__ = func.__doc__

    def bind(self, **kwargs: Any) -> SglFunction:
        """This program with some arguments fixed."""
        unknown = set(kwargs) - set(self.arg_names)
        if unknown:
            raise TypeError(f"{self.__name__}() has no arguments {sorted(unknown)}")
        return SglFunction(self.func, self.num_api_spec_tokens, {**self.bind_arguments, **kwargs})

    def __call__(self, *args: Any, **kwargs: Any) -> ProgramState:
        return self.run(*args, **kwargs)

    def run(
        self,
        *args: Any,
        stream: bool = False,
        backend: Backend | None = None,
        use_thread: bool = True,
        **kwargs: Any,
    ) -> ProgramState:
        """Runs the program once; with ``stream=True`` returns at once and the
        state streams (``text_iter``). Sampling defaults (``max_new_tokens``,
        ``temperature``, ...) go here too; each gen's own arguments win.

        Raises:
            ProgramArgumentError: a sampling default of the wrong type or out of its
                bound (``runtime/io/sampling_fields``); and what the program body
                raises (a gen's failure is ``state.error()``).
        """
        settings = global_config.run_settings()
        defaults, program_kwargs = _split_defaults(kwargs, settings)
        state = self._new_state(backend, defaults, stream)
        call_args = {**self.bind_arguments, **program_kwargs}
        body_args = (self, state, args, call_args, settings.print_text)
        if stream:
            thread = threading.Thread(target=_run_body, args=body_args, daemon=True)
            thread.start()
            return state
        _run_body(*body_args)
        return state

    def run_batch(
        self,
        batch_kwargs: Sequence[dict[str, Any] | Sequence[Any]],
        *,
        backend: Backend | None = None,
        num_threads: int | str = "auto",
        progress_bar: bool = False,
        generator_style: bool = False,
        **kwargs: Any,
    ) -> list[ProgramState] | Iterator[ProgramState]:
        """Runs one program per entry (a dict of keyword arguments, or a tuple of
        positional ones) concurrently; their states in input order (a generator
        of them with ``generator_style``). With ``global_config.enable_precache_with_tracing``
        (the default) and more than one entry, the program's constant prefix is first
        computed into the prefix cache, when it is longer than 64 characters."""
        settings = global_config.run_settings()
        defaults, extra = _split_defaults(kwargs, settings)
        if extra:
            raise TypeError(f"run_batch() got unexpected arguments {sorted(extra)}")
        entries = list(batch_kwargs)
        if not entries:
            return iter(()) if generator_style else []
        workers = _num_threads(num_threads, len(entries))
        backend = _resolve(backend)
        if settings.precache_with_tracing and len(entries) > 1:
            self._precache(backend)

        def one(entry: dict[str, Any] | Sequence[Any]) -> ProgramState:
            args, kw = ((), entry) if isinstance(entry, dict) else (tuple(entry), {})
            state = self._new_state(backend, defaults, False)
            _run_body(self, state, args, {**self.bind_arguments, **kw}, settings.print_text)
            state.sync()
            return state

        results = _run_all(one, entries, workers, progress_bar)
        return results if generator_style else list(results)

    def trace(self, *args: Any, backend: Backend | None = None, **kwargs: Any) -> list[Expr]:
        """The program's expressions, recorded without running anything (variables
        read in the body are ``ir.placeholder``s, arguments not given
        ``ir.SymbolicArgument``s). ``backend`` is SGLang's argument, unused: a trace
        needs no model.

        Raises:
            TypeError: the body formats an argument not given into a string
                (``f"{arg}"``, ``str(arg)``, ``"%s" % arg``, ``"{}".format(arg)``).
        """
        from radixlm.tracer import trace_program

        return trace_program(self, args, {**self.bind_arguments, **kwargs})

    def cache(self, backend: Backend | None = None) -> str:
        """Computes the program's constant prefix (the text before its first gen,
        select or argument) into the backend's prefix cache; returns that prefix."""
        backend = _resolve(backend)
        prefix = self._constant_prefix(backend)
        if prefix:
            backend.cache_prefix(backend.tokenize(prefix))
        return prefix

    def _precache(self, backend: Backend) -> None:
        prefix = self._constant_prefix(backend)
        if len(prefix) > _PRECACHE_MIN_CHARS:
            backend.cache_prefix(backend.tokenize(prefix))

    def _constant_prefix(self, backend: Backend) -> str:
        from radixlm.tracer import constant_prefix, trace_program

        nodes = trace_program(self, (), dict(self.bind_arguments), prefix_only=True)
        return constant_prefix(nodes, backend.chat_template)

    def _new_state(
        self, backend: Backend | None, defaults: GenParams, stream: bool
    ) -> ProgramState:
        return ProgramState(StreamExecutor(_resolve(backend), defaults, stream))


def _run_body(
    func: SglFunction, state: ProgramState, args: tuple, kwargs: dict, print_text: bool
) -> None:
    try:
        state.ret_value = func.func(state, *args, **kwargs)
    finally:
        state.stream_executor.end()
    state.stream_executor.wait_finished()
    if print_text:  # global_config.verbosity >= 2, as SGLang
        print(state.text())


def _resolve(backend: Backend | None) -> Backend:
    backend = backend or get_default_backend()
    if backend is None:
        raise RuntimeError(
            "no backend: call radixlm.set_default_backend(radixlm.Runtime()) or pass backend="
        )
    return backend


def _split_defaults(
    kwargs: dict[str, Any], settings: RunSettings
) -> tuple[GenParams, dict[str, Any]]:
    """(the sampling defaults among ``kwargs`` over SGLang's, with the run's special-token
    switches; the program's own args)."""
    values = dict(_RUN_DEFAULTS)
    program = {}
    for key, value in kwargs.items():
        if key in values:
            _check_default(key, value)
            values[key] = value
        else:
            program[key] = value
    if values["stop"] is not None:
        values["stop"] = (
            (values["stop"],) if isinstance(values["stop"], str) else tuple(values["stop"])
        )
    if values["stop_regex"] is not None:
        sr = values["stop_regex"]
        values["stop_regex"] = (sr,) if isinstance(sr, str) else tuple(sr)
    if values["stop_token_ids"] is not None:
        values["stop_token_ids"] = tuple(values["stop_token_ids"])
    values["skip_special_tokens"] = settings.skip_special_tokens
    values["spaces_between_special_tokens"] = settings.spaces_between_special_tokens
    return GenParams(**values), program


def _check_default(name: str, value: Any) -> None:
    """A run() sampling default checked as the engine will check it, where it is written
    (None: SGLang's default). Raises ProgramArgumentError naming it."""
    if value is None or name not in _RUN_FIELDS:
        return
    try:
        SamplingParams(**{name: value})
    except InvalidRequestError as e:
        raise ProgramArgumentError(f"run(): {e}") from e


def _num_threads(num_threads: int | str, num_programs: int) -> int:
    if num_threads == "auto":
        # Programs mostly wait on the engine: enough threads that all of them reach
        # it together (the engine batches them), bounded for huge batches.
        return max(1, min(num_programs, 256, 32 * (os.cpu_count() or 1)))
    if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
        raise ValueError(f"num_threads must be 'auto' or an int >= 1, got {num_threads!r}")
    return min(num_threads, num_programs)


def _run_all(
    one: Callable[[Any], ProgramState], entries: list[Any], workers: int, progress_bar: bool
) -> Iterator[ProgramState]:
    bar = None
    if progress_bar:
        from tqdm import tqdm

        bar = tqdm(total=len(entries))
    try:
        with ThreadPoolExecutor(workers, thread_name_prefix="radixlm-batch") as pool:
            futures = [pool.submit(one, entry) for entry in entries]
            if bar is not None:
                for future in futures:
                    future.add_done_callback(lambda _: bar.update())
            for future in futures:
                yield future.result()
    finally:
        if bar is not None:
            bar.close()
