"""Which forward path each kind of pass takes on the CPU, chosen once at start-up.

Three kinds of pass have a C++ kernel path beside the torch one:

  decode attention   decode rows: ``decode_attention_cpu.cpp`` vs gather + SDPA
  extend attention   prefill rows, fresh or on a cached prefix:
                     ``extend_attention_cpu.cpp`` vs SDPA
  few-row layers     passes of up to 64 tokens: ``small_batch_cpu.cpp`` (a pass of
                     decode rows in one call) vs the eager model; the same option
                     runs a float32 or bfloat16 model's elementwise steps as C++ passes

``attention_backend="auto"`` and ``cpu_layer_kernels=True`` (the defaults) take a
kernel path where the measured table says it beats the torch path, looked up by

  CPU kind   "amx" (AMX tiles with bfloat16: torch's oneDNN multiplies bfloat16 in
             them) or "no_amx"
  ISA        the kernels' build: "avx2" or "avx512" (there is no AMX build)
  dtype      the model's: "float32" or "bfloat16" (the kernels take no other)
  kind       "decode_attention", "extend_attention" or "few_row_layers"

and the few-row layers stop at the most rows a measured pass says they are faster
for, on the measured model nearest the engine's in hidden size (the default model's,
or one measured beside it: a larger model's products are oneDNN's sooner).

The table is ``cpu_paths_table.json`` beside this module (package data), written by
``benchmarks/bench_cpu_paths.py --write-table``: whole passes of each kind through
the engine's runner, both ISA builds (the avx2 one with torch's kernels held to AVX2
too, as on an AVX2-only CPU), each dtype; a kind's kernel is faster where the
geometric mean of its passes' ratios (without / with the kernel, paired per repeat) is
above 1. Measured so far on one CPU, without AMX (figures, and the one kind not
measured: benchmarks/README.md, "CPU paths and kernels"). A run merges its rows into
the file under its own CPU kind, so an AMX machine's run adds "amx" rows beside the
others. Where the table has no row for this CPU:

  an AMX CPU       takes the "no_amx" rows of its ISA and dtype (until a run on an
                   AMX machine writes its own)
  bfloat16         (a kind no run measured in it with this build, as extend attention
                   with the avx2 build, whose torch side takes minutes a pass): the
                   float32 verdict of the same build
  anything else    (a dtype or ISA no run measured): the torch path

and the start-up log line says so (``CpuPaths.notes``). A table rather than a
calibration at start-up: the choice is the same on every run of a machine, so are
the outputs, and start-up costs nothing. A CPU without AVX2 (or a non-x86 one) gets
the torch path on every kind, said in one logged line. ``attention_backend="cpu"``
insists on the attention kernels; ``"torch"`` and ``cpu_layer_kernels=False`` turn
them off.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

import torch

from radixlm.kernels.cpu import native
from radixlm.runtime.attention import AttentionBackend, kernel_attention

__all__ = [
    "AMX",
    "CPU_KINDS",
    "KERNEL",
    "KINDS",
    "NO_AMX",
    "TABLE_FILE",
    "TORCH",
    "Choice",
    "CpuPaths",
    "KernelRule",
    "PathsTable",
    "attention_paths",
    "cpu_kind",
    "dtype_name",
    "kernel_is_faster",
    "kernel_rule",
    "packaged_table",
]

KERNEL, TORCH = "kernel", "torch"
AMX, NO_AMX = "amx", "no_amx"
CPU_KINDS = (AMX, NO_AMX)
KINDS = ("decode_attention", "extend_attention", "few_row_layers")
TABLE_FILE = "cpu_paths_table.json"
# the flags of AMX tiles that multiply bfloat16 (what oneDNN's bfloat16 GEMMs use)
_AMX_FLAGS = frozenset({"amx_tile", "amx_bf16"})


def cpu_kind(flags: frozenset[str] | None = None) -> str:
    """AMX when ``flags`` (default: this CPU's, from /proc/cpuinfo) include AMX tiles
    with bfloat16, else NO_AMX."""
    flags = native.cpu_flags() if flags is None else flags
    return AMX if _AMX_FLAGS <= flags else NO_AMX


def dtype_name(dtype: torch.dtype | str) -> str:
    """The name of ``dtype`` ("bfloat16" for ``torch.bfloat16``; a string passes)."""
    return dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class Choice:
    """One lookup's answer: whether the kernel path is taken, and ``fallback``, why
    it came from a rule instead of a row measured for this CPU kind (None: measured)."""

    kernel_is_faster: bool
    fallback: str | None = None


@dataclass(frozen=True)
class PathsTable:
    """The measured table: ``rows[cpu kind][isa][dtype]`` is one run's entry, whose
    ``kinds[kind]["kernel_is_faster"]`` is the verdict for each kind that run measured
    (the rest of the entry is what was measured, where and how: bench_cpu_paths.py)."""

    rows: Mapping[str, Mapping[str, Mapping[str, Mapping[str, Any]]]]

    @classmethod
    def from_json(cls, text: str) -> PathsTable:
        """The table in ``text`` (the file's JSON).

        Raises:
            ValueError: not the file's layout: a CPU kind other than CPU_KINDS, or an
                entry without verdicts, or with one not a boolean or not of KINDS."""
        data = json.loads(text)
        rows = data.get("cpus") if isinstance(data, dict) else None
        if not isinstance(rows, dict):
            raise ValueError(f"{TABLE_FILE}: expected an object with 'cpus', got {text[:80]!r}")
        for cpu, isas in rows.items():
            if cpu not in CPU_KINDS:
                raise ValueError(f"{TABLE_FILE}: CPU kind {cpu!r}, expected one of {CPU_KINDS}")
            for isa, dtypes in isas.items():
                for dtype, entry in dtypes.items():
                    _check_entry(f"{cpu}/{isa}/{dtype}", entry)
                    for model, measured in entry.get("models", {}).items():
                        _check_entry(f"{cpu}/{isa}/{dtype}/models/{model}", measured)
        return cls(rows)

    def lookup(self, cpu: str, isa: str, dtype: str, kind: str) -> Choice:
        """Whether the kernel path of ``kind`` is faster with the ``isa`` build for a
        ``dtype`` model on a CPU of kind ``cpu``: this CPU kind's row, else (an AMX
        CPU) the NO_AMX row, else the torch path (see the module's docstring)."""
        if kind not in KINDS:
            raise ValueError(f"pass kind {kind!r}, expected one of {KINDS}")
        verdict = self._verdict(cpu, isa, dtype, kind)
        if verdict is not None:
            return Choice(verdict)
        verdict = self._verdict(NO_AMX, isa, dtype, kind) if cpu == AMX else None
        if verdict is not None:
            return Choice(verdict, f"no AMX CPU measured: the {isa} {dtype} rows without AMX")
        if dtype == "bfloat16":  # the kernels' other dtype: its float32 verdict
            for row_cpu in dict.fromkeys((cpu, NO_AMX)):
                verdict = self._verdict(row_cpu, isa, "float32", kind)
                if verdict is not None:
                    why = f"bfloat16 not measured with the {isa} build: its float32 verdict"
                    return Choice(verdict, why)
        return Choice(False, f"{dtype} not measured with the {isa} build, so the torch path")

    def max_rows(
        self, cpu: str, isa: str, dtype: str, kind: str, hidden_size: int | None = None
    ) -> int | None:
        """The most decode rows up to which ``kind``'s kernel measured faster (its
        ratio at least 1 on every decode pass of that many rows or fewer) where a
        larger pass measured slower, from this CPU kind's row (an AMX CPU: the NO_AMX
        row): measured on the model whose hidden size is nearest ``hidden_size`` (by
        ratio) of the row's and those measured beside it (``models``), the row's own
        where sizes are not known. None where no measured pass says a limit (every one
        faster, or none)."""
        for row_cpu in dict.fromkeys((cpu, NO_AMX)):
            entry = self.rows.get(row_cpu, {}).get(isa, {}).get(dtype)
            measured = _nearest_model(entry or {}, hidden_size)
            passes = measured.get("kinds", {}).get(kind, {}).get("passes")
            if isinstance(passes, dict):
                return _rows_faster(passes)
        return None

    def _verdict(self, cpu: str, isa: str, dtype: str, kind: str) -> bool | None:
        entry = self.rows.get(cpu, {}).get(isa, {}).get(dtype, {"kinds": {}})
        verdict = entry["kinds"].get(kind)
        return None if verdict is None else verdict["kernel_is_faster"]


def _nearest_model(entry: Mapping[str, Any], hidden_size: int | None) -> Mapping[str, Any]:
    """Of a row and the models measured beside it, the one whose hidden size is
    nearest ``hidden_size`` by ratio (a tie: the row); the row where either size is
    not known."""
    if hidden_size is None or not isinstance(entry.get("hidden_size"), int):
        return entry
    models = entry.get("models", {})
    candidates = [entry] + [m for m in models.values() if isinstance(m.get("hidden_size"), int)]
    return min(candidates, key=lambda m: abs(math.log(m["hidden_size"] / hidden_size)))


def _rows_faster(passes: Mapping[str, Any]) -> int | None:
    """From a kind's measured passes (``decode<N>``: ``ratio``), the largest N below
    the first decode pass measured slower (ratio under 1), or None where none was
    (or the smallest was: the verdict is the kind's, not a limit's)."""
    decodes = sorted(
        (int(name.removeprefix("decode")), p.get("ratio"))
        for name, p in passes.items()
        if name.removeprefix("decode").isdigit() and isinstance(p, dict)
    )
    faster = None
    for rows, ratio in decodes:
        if not isinstance(ratio, (int, float)) or ratio < 1:
            return faster
        faster = rows
    return None


def _check_entry(where: str, entry: Any) -> None:
    """A row holds a verdict for one or more kinds (a run may measure only some)."""
    kinds = entry.get("kinds") if isinstance(entry, dict) else None
    if (
        not isinstance(kinds, dict)
        or not kinds
        or any(k not in KINDS for k in kinds)
        or any(
            not isinstance(v, dict) or not isinstance(v.get("kernel_is_faster"), bool)
            for v in kinds.values()
        )
    ):
        raise ValueError(
            f"{TABLE_FILE}: {where} needs a boolean kernel_is_faster for some of {KINDS}"
        )


@functools.cache
def packaged_table() -> PathsTable:
    """The table shipped beside this module (read once: it is package data)."""
    text = resources.files(__package__).joinpath(TABLE_FILE).read_text()
    return PathsTable.from_json(text)


def kernel_is_faster(isa: str, dtype: torch.dtype | str, kind: str) -> bool:
    """Whether ``kind``'s kernel path is taken with the ``isa`` build for a ``dtype``
    model on this CPU, by the packaged table (fallbacks included)."""
    return packaged_table().lookup(cpu_kind(), isa, dtype_name(dtype), kind).kernel_is_faster


@dataclass(frozen=True)
class KernelRule:
    """The table's verdict for one build and dtype on this CPU, every kind at once.

    decode_attention, extend_attention, few_row_layers: whether the kernel path is
        faster (what "auto" and ``cpu_layer_kernels`` then take).
    notes: "kind, kind: why" for the verdicts that came from a fallback rule, one per
        reason; empty where every kind was measured on this CPU kind.
    """

    isa: str
    dtype: str
    decode_attention: bool
    extend_attention: bool
    few_row_layers: bool
    notes: tuple[str, ...] = ()
    few_row_layers_max_rows: int | None = None  # passes past it slower: torch's path


def kernel_rule(
    isa: str,
    dtype: torch.dtype | str,
    table: PathsTable | None = None,
    cpu: str | None = None,
    hidden_size: int | None = None,
) -> KernelRule:
    """``table``'s (default: the packaged one) verdicts for the ``isa`` build and a
    ``dtype`` model on a CPU of kind ``cpu`` (default: this one's); the few-row
    layers' limit from the measured shape nearest ``hidden_size`` (the model's)."""
    table = packaged_table() if table is None else table
    cpu = cpu_kind() if cpu is None else cpu
    name = dtype_name(dtype)
    choices = {kind: table.lookup(cpu, isa, name, kind) for kind in KINDS}
    kinds_of: dict[str, list[str]] = {}  # each fallback's reason: the kinds it decided
    for kind, choice in choices.items():
        if choice.fallback is not None:
            kinds_of.setdefault(choice.fallback, []).append(kind)
    notes = tuple(f"{', '.join(kinds)}: {why}" for why, kinds in kinds_of.items())
    verdicts = {kind: c.kernel_is_faster for kind, c in choices.items()}
    max_rows = None
    if choices["few_row_layers"].fallback is None:  # a measured row: its passes say
        max_rows = table.max_rows(cpu, isa, name, "few_row_layers", hidden_size)
    return KernelRule(isa, name, **verdicts, notes=notes, few_row_layers_max_rows=max_rows)


@dataclass(frozen=True)
class CpuPaths:
    """The path ("kernel" or "torch") each pass kind takes, and why.

    isa: the kernels' build ("avx512" or "avx2"), None when no kernel is used.
    decode_attention, extend_attention, few_row_layers: KERNEL or TORCH.
    elementwise: KERNEL when a float32 or bfloat16 model's eager RMSNorm, RoPE and SwiGLU
        run as C++ passes (with the few-row layer kernels).
    notes: why a kind takes the torch path where the kernel could have served, and
        where a choice came from a fallback rule rather than a measured row.
    """

    isa: str | None
    decode_attention: str = TORCH
    extend_attention: str = TORCH
    few_row_layers: str = TORCH
    elementwise: str = TORCH
    notes: tuple[str, ...] = ()

    def describe(self) -> str:
        """One line for the start-up log."""
        kinds = (
            f"decode attention {self.decode_attention}, extend attention "
            f"{self.extend_attention}, few-row layers {self.few_row_layers}, "
            f"elementwise {self.elementwise}"
        )
        build = f"{self.isa} kernels" if self.isa else "no kernels"
        notes = f" ({'; '.join(self.notes)})" if self.notes else ""
        return f"CPU paths ({build}): {kinds}{notes}"


def attention_paths(backend: AttentionBackend[Any]) -> tuple[str, str]:
    """The (decode attention, extend attention) paths ``backend`` takes: KERNEL for
    the rows it attends through radixlm's C++ kernels, else TORCH."""
    rows = kernel_attention(backend)
    return (KERNEL if rows.decode else TORCH, KERNEL if rows.extend else TORCH)
