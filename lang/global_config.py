"""``radixlm.global_config``: SGLang's ``global_config``, the one process-wide object
SGLang programs read and set (``sgl.global_config.verbosity = 2``).

radixlm otherwise keeps no global state, and this object stays at the edge: only
``SglFunction.run`` / ``run_batch`` / ``cache`` and ``set_default_backend`` /
``get_default_backend`` read it, once per call (``run_settings``); the interpreter,
the tracer and the backends get the values they need passed down, so a run never
sees the object change under it and everything below can be built twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["GlobalConfig", "RunSettings", "global_config"]


@dataclass(frozen=True)
class RunSettings:
    """What one ``run`` / ``run_batch`` takes from ``global_config``, read when it starts."""

    print_text: bool  # verbosity >= 2: print each program's final text
    precache_with_tracing: bool
    skip_special_tokens: bool
    spaces_between_special_tokens: bool


@dataclass(slots=True)
class GlobalConfig:
    """SGLang's ``GlobalConfig`` fields, with SGLang's defaults. A misspelled field
    raises ``AttributeError`` (slots) instead of silently doing nothing.

    Honoured:
        verbosity: 2 or more prints each program's final text when its run ends.
        default_backend: the backend of ``run`` / ``run_batch`` / ``cache`` when none
            is passed; ``set_default_backend`` sets it, ``get_default_backend`` reads it.
        skip_special_tokens_in_output: every gen's ``skip_special_tokens``.
        spaces_between_special_tokens_in_out: every gen's
            ``spaces_between_special_tokens`` (slow tokenizers only; fast ones ignore it).
        enable_precache_with_tracing: ``run_batch`` of more than one program first
            computes the program's constant prefix (traced, as ``cache``) into the
            prefix cache when it is longer than 64 characters, so that the batch's
            programs, which reach the engine together, all find it there.

    No effect here:
        enable_parallel_encoding: SGLang's ``join("concate_and_append")`` then joins
            the branches' KV caches; radixlm appends the branches' text (the radix
            cache already holds each branch's KV under that text).
        default_init_new_token_ratio, default_min_new_token_ratio_factor,
        default_new_token_ratio_decay_steps, torch_empty_cache_interval,
        retract_decode_steps, flashinfer_workspace_size, enable_gds, gds_path:
            SGLang's server constants. radixlm's engine takes its settings from its
            own config (``Engine(...)`` options, ``radixlm serve`` flags), never from
            this object or the environment variables SGLang reads them from.
    """

    verbosity: int = 0
    default_backend: Any = None
    skip_special_tokens_in_output: bool = True
    spaces_between_special_tokens_in_out: bool = True
    enable_precache_with_tracing: bool = True
    enable_parallel_encoding: bool = True
    default_init_new_token_ratio: float = 0.7
    default_min_new_token_ratio_factor: float = 0.14
    default_new_token_ratio_decay_steps: float = 600.0
    torch_empty_cache_interval: float = -1.0
    retract_decode_steps: int = 20
    flashinfer_workspace_size: int = 384 * 1024 * 1024
    enable_gds: bool = False
    gds_path: str = "/tmp/gds/"

    def run_settings(self) -> RunSettings:
        """The honoured fields a run uses, checked.

        Raises:
            ValueError: a field holds a value of the wrong type (named).
        """
        if isinstance(self.verbosity, bool) or not isinstance(self.verbosity, int):
            raise ValueError(f"global_config.verbosity must be an int, got {self.verbosity!r}")
        for name in (
            "skip_special_tokens_in_output",
            "spaces_between_special_tokens_in_out",
            "enable_precache_with_tracing",
        ):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ValueError(f"global_config.{name} must be a bool, got {value!r}")
        return RunSettings(
            print_text=self.verbosity >= 2,
            precache_with_tracing=self.enable_precache_with_tracing,
            skip_special_tokens=self.skip_special_tokens_in_output,
            spaces_between_special_tokens=self.spaces_between_special_tokens_in_out,
        )


global_config = GlobalConfig()
