"""How users reach the runtime: the offline ``Engine`` (and its loop thread), the
wiring of every component from an ``EngineConfig`` (``build_runtime``), and the CLI."""

from radixlm.runtime.entrypoints.engine import Engine, EngineStats

__all__ = ["Engine", "EngineStats"]
