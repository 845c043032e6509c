"""Which attention backend an engine gets: a registry of backends by name.

Each backend's module defines its ``BackendEntry`` (``TORCH_ENTRY``,
``TRITON_ENTRY``; the "cpu" one is made from its options by ``cpu_entry``);
``default_registry`` lists them, so adding a backend is a file and a line here.
``select`` (``select_backend``) decides::

    requested name  that backend, or a ConfigError saying why it cannot serve:
                    wrong device, a model it does not take, no build on this
                    machine, or a build that failed
    "auto"          the first other entry that runs on this device, can be built
                    here, is preferred (for "cpu", its options: the measured
                    table in runtime/executor/cpu_paths.py; "triton" on a GPU), takes
                    the model, and builds; else the fallback ("torch": any
                    device, any model)

A model a preferred entry does not take is logged (info) under "auto", a failed
build warned about; a wrong device, no kernel build on this CPU, or an entry
"auto" would not take here pass silently (the start-up ``CpuPaths`` line says
the second).
"""

from __future__ import annotations

import logging
from typing import Any

from radixlm.kernels.cpu.native import KernelBuildError
from radixlm.runtime.attention.base import AttentionBackend, BackendContext, BackendEntry
from radixlm.runtime.attention.cpu_kernels import CpuAttentionOptions, cpu_entry
from radixlm.runtime.attention.torch_sdpa import TORCH_ENTRY
from radixlm.runtime.attention.triton import TRITON_ENTRY
from radixlm.runtime.config import ConfigError

__all__ = ["AUTO", "BackendRegistry", "default_registry", "select_backend"]

logger = logging.getLogger(__name__)

AUTO = "auto"

_DEVICE_NAMES = {"cpu": "CPU", "cuda": "GPU"}


class BackendRegistry:
    """Backends by name, in registration order ("auto" tries them in it), and the
    fallback "auto" takes when none other serves."""

    def __init__(self, fallback: BackendEntry) -> None:
        self.fallback = fallback
        self._entries: dict[str, BackendEntry] = {fallback.name: fallback}

    def register(self, entry: BackendEntry) -> None:
        """Adds a backend. Raises ValueError when its name is taken (or is "auto")."""
        if entry.name in self._entries or entry.name == AUTO:
            raise ValueError(f"attention backend {entry.name!r} is registered already")
        self._entries[entry.name] = entry

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def select(self, requested: str, context: BackendContext) -> AttentionBackend[Any]:
        """The backend ``requested`` ("auto" or a registered name) gets in ``context``.

        Raises ConfigError when a named backend cannot serve, saying why.
        """
        if requested == AUTO:
            return self._select_auto(context)
        entry = self._entries.get(requested)
        if entry is None:
            names = (AUTO, *self._entries)
            raise ConfigError(f"attention_backend must be one of {names}, got {requested!r}")
        return _build_named(entry, context)

    def _select_auto(self, context: BackendContext) -> AttentionBackend[Any]:
        fallback = self.fallback
        for entry in self._entries.values():
            if entry is fallback or not _runs_on(entry, context.device):
                continue
            if entry.unavailable(context) is not None or not entry.preferred(context):
                continue
            reason = entry.supports(context.arch, context.dtype, context.device)
            if reason is not None:
                logger.info("attention_backend 'auto': using %r, as %s", fallback.name, reason)
                continue
            try:
                return entry.build(context, False)
            except KernelBuildError as e:
                logger.warning(
                    "attention_backend 'auto': using %r, as the kernels failed: %s",
                    fallback.name,
                    e,
                )
        return fallback.build(context, False)


def _runs_on(entry: BackendEntry, device: str) -> bool:
    return entry.device_type is None or entry.device_type == device


def _build_named(entry: BackendEntry, context: BackendContext) -> AttentionBackend[Any]:
    prefix = f"attention_backend {entry.name!r}"
    if not _runs_on(entry, context.device):
        where = _DEVICE_NAMES.get(entry.device_type, entry.device_type)
        raise ConfigError(f"{prefix} runs on the {where}, not on {context.device!r}")
    reason = entry.supports(context.arch, context.dtype, context.device)
    if reason is None:
        reason = entry.unavailable(context)
    if reason is not None:
        raise ConfigError(f"{prefix}: {reason}")
    try:
        return entry.build(context, True)
    except KernelBuildError as e:
        raise ConfigError(f"{prefix}: {e}") from e


def default_registry(cpu: CpuAttentionOptions | None = None) -> BackendRegistry:
    """A fresh registry of radixlm's backends: "torch" (the fallback), then "cpu"
    (CPUs; built and chosen as ``cpu`` says, by default ``CpuAttentionOptions.native()``),
    then "triton" (GPUs)."""
    registry = BackendRegistry(TORCH_ENTRY)
    registry.register(cpu_entry(cpu if cpu is not None else CpuAttentionOptions.native()))
    registry.register(TRITON_ENTRY)
    return registry


def select_backend(
    requested: str, context: BackendContext, registry: BackendRegistry | None = None
) -> AttentionBackend[Any]:
    """``registry.select(requested, context)``, on ``default_registry()`` unless given."""
    return (registry or default_registry()).select(requested, context)
