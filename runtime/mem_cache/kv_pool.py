"""KV cache memory: preallocated per-layer K/V tensors, a slot allocator, and
the per-request token -> slot table.

Layout (page size 1: one slot holds one token's K and V for every layer)::

    k[layer]: (num_slots, Hkv, D)      v[layer]: (num_slots, Hkv, D)
    k_scale[layer]: (num_slots, Hkv)    v_scale[layer]: (num_slots, Hkv)   (quantized only)
    slot 0 is the padding slot: never handed out, so padded gathers read
    valid memory; masks make sure its contents never matter.

    req_to_token[row, pos] = slot holding position ``pos`` of the request
    that owns ``row``.

A quantized pool (``KVFormat``: int8 or fp8 codes with a bfloat16 scale per token and
head, radixlm.runtime.mem_cache.kv_quant) quantizes what ``write`` gets; the backends
read codes and scales. A KIVI pool (``kivi4``/``kivi2``) holds packed codes, their
parameters (``meta``) and each request row's float window (``window_k``/``window_v``),
written by a pass's ``KiviWrites`` and read by position (radixlm.runtime.mem_cache.kivi).

Ownership: only the ``SlotAllocator`` hands out and takes back slot ids; the
scheduler (later the radix cache) decides when.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixlm.runtime.device import to_device
from radixlm.runtime.mem_cache.kivi import KiviLayout
from radixlm.runtime.mem_cache.kv_quant import KVFormat, dequantize, kv_format, quantize

__all__ = ["KVPool", "SlotAllocator", "ReqToTokenTable", "TableWrites", "PAD_SLOT"]

PAD_SLOT = 0


class KVPool:
    """K and V tensors for every layer, one slot per token.

    dtype: the model's (what ``write`` gets and a float pool holds); fmt: how the pool
    stores them (None: ``dtype``, unquantized).
    """

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        fmt: KVFormat | None = None,
        rows: int = 0,
    ) -> None:
        """rows: the req_to_token rows, each with a float window in a KIVI pool."""
        if num_slots < 2:
            raise ValueError(f"a KV pool needs at least 2 slots, got {num_slots}")
        self.num_slots = num_slots
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.dtype = dtype
        self.format = fmt if fmt is not None else kv_format("auto", dtype)
        shape = (num_layers, num_slots, num_kv_heads, head_dim)
        layout = self.format.kivi
        if layout is not None:
            if rows < 1:
                raise ValueError("a KIVI pool needs the req_to_token rows (rows=) for its windows")
            if (why := layout.unsupported(head_dim)) is not None:
                raise ValueError(why)
            shape = (num_layers, num_slots, num_kv_heads, layout.packed_dim(head_dim))
            meta = (num_layers, num_slots, num_kv_heads, layout.meta_dim(head_dim))
            self.meta = torch.empty(meta, dtype=torch.float16, device=device)
            self.meta[:, PAD_SLOT] = 0
            # zeros: a window entry past a sequence's end is read (then masked): finite
            window = (num_layers, rows, layout.group, num_kv_heads, head_dim)
            self.window_k = torch.zeros(window, dtype=dtype, device=device)
            self.window_v = torch.zeros(window, dtype=dtype, device=device)
        # empty, not zeros: pages are committed as slots are first used. Only the
        # padding slot is ever read before being written, so only it is zeroed
        # (a NaN there would survive a zero attention weight: 0 * NaN = NaN).
        self.k = torch.empty(shape, dtype=self.format.code_dtype, device=device)
        self.v = torch.empty(shape, dtype=self.format.code_dtype, device=device)
        self.k[:, PAD_SLOT] = 0
        self.v[:, PAD_SLOT] = 0
        self.k_scale: torch.Tensor | None = None
        self.v_scale: torch.Tensor | None = None
        if self.format.quantized:
            self.k_scale = torch.empty(shape[:3], dtype=torch.bfloat16, device=device)
            self.v_scale = torch.empty(shape[:3], dtype=torch.bfloat16, device=device)
            self.k_scale[:, PAD_SLOT] = 0
            self.v_scale[:, PAD_SLOT] = 0
        self._layer_index = torch.arange(num_layers, device=device)[:, None]  # (L, 1)

    @property
    def quantized(self) -> bool:
        """int8/fp8 codes with a scale per token and head (``k_scale``)."""
        return self.format.quantized

    @property
    def kivi(self) -> bool:
        """KIVI codes (``meta``, windows; written by ``KiviWrites``)."""
        return self.format.kivi is not None

    @property
    def kivi_layout(self) -> KiviLayout:
        assert self.format.kivi is not None, "not a KIVI pool"
        return self.format.kivi

    def bytes_per_token(self) -> int:
        """One token's K and V in every layer of this pool (``bytes_per_slot``)."""
        return self.format.bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim)

    @staticmethod
    def bytes_per_slot(
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        fmt: KVFormat | None = None,
    ) -> int:
        """One slot's K and V in every layer (scales included)."""
        fmt = fmt if fmt is not None else kv_format("auto", dtype)
        return fmt.bytes_per_token(num_layers, num_kv_heads, head_dim)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store K/V of new tokens. slots: (T,), k/v: (T, Hkv, D). (A KIVI pool's
        writes need positions: ``KiviWrites``.)"""
        assert not self.kivi, "a KIVI pool is written through KiviWrites"
        if self.k_scale is None:
            self.k[layer].index_copy_(0, slots, k)
            self.v[layer].index_copy_(0, slots, v)
            return
        for codes, scales, x in ((self.k, self.k_scale, k), (self.v, self.v_scale, v)):
            q, s = quantize(x, self.format)  # bytes: torch has no fp8 index_copy on CPU
            codes.view(torch.uint8)[layer].index_copy_(0, slots, q.view(torch.uint8))
            scales[layer].index_copy_(0, slots, s)  # type: ignore[index]

    def write_layers(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store K/V of new tokens in every layer at once. slots: (B,), k/v: (L, B, Hkv, D)."""
        assert not self.kivi, "a KIVI pool is written through KiviWrites"
        index = (self._layer_index, slots[None, :])  # (L, 1) x (1, B) -> (L, B)
        if self.k_scale is None:
            self.k.index_put_(index, k)
            self.v.index_put_(index, v)
            return
        for codes, scales, x in ((self.k, self.k_scale, k), (self.v, self.v_scale, v)):
            q, s = quantize(x, self.format)
            codes.view(torch.uint8).index_put_(index, q.view(torch.uint8))
            scales.index_put_(index, s)  # type: ignore[union-attr]

    def dequantized(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(k, v) of ``slots`` (any shape S) in layer ``layer``: (*S, Hkv, D) in the
        model's dtype (a float pool's values as stored). Not for a KIVI pool, read by
        position (``kivi.gather``)."""
        assert not self.kivi, "a KIVI pool is read by position (kivi.gather)"
        if self.k_scale is None:
            return self.k[layer][slots], self.v[layer][slots]
        k = self.k[layer].view(torch.uint8)[slots].view(self.format.code_dtype)
        v = self.v[layer].view(torch.uint8)[slots].view(self.format.code_dtype)
        return (
            dequantize(k, self.k_scale[layer][slots], self.dtype),
            dequantize(v, self.v_scale[layer][slots], self.dtype),  # type: ignore[index]
        )


class SlotAllocator:
    """Hands out free KV slots; the only owner of slot ids.

    Invariant: ``num_free + (slots handed out and not yet freed) == capacity``.
    """

    def __init__(self, num_slots: int) -> None:
        self.capacity = num_slots - 1  # slot 0 is the padding slot
        self._free = torch.arange(1, num_slots, dtype=torch.int64)
        self._num_free = self.capacity

    @property
    def num_free(self) -> int:
        return self._num_free

    def allocate(self, num_tokens: int) -> torch.Tensor | None:
        """Returns ``num_tokens`` slot ids, or None when not enough are free."""
        if num_tokens > self._num_free:
            return None
        start = self.capacity - self._num_free
        self._num_free -= num_tokens
        return self._free[start : start + num_tokens].clone()

    def free(self, slots: torch.Tensor) -> None:
        """Gives slots back. Freeing a slot twice is a bug the caller must not make."""
        n = int(slots.numel())
        if n == 0:
            return
        if n > self.capacity - self._num_free:
            raise RuntimeError("freeing more KV slots than are allocated")
        # Free slots live in _free[capacity - num_free:]; prepend the returned ones.
        end = self.capacity - self._num_free
        self._free[end - n : end] = slots.to(torch.int64)
        self._num_free += n


@dataclass(frozen=True)
class TableWrites:
    """``table[rows[i], positions[i]] = slots[i]``: (N,) int64 CPU tensors each."""

    rows: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor


class ReqToTokenTable:
    """Maps (request row, position) -> KV slot; rows are handed out per running request.

    Two copies, one truth::

        host     (CPU)            every write lands here at once; every read is from
                                  here: the scheduler never waits for the device
        table    (model device)   what the attention backends read; the writes staged
                                  since the last ``flush`` reach it together, in one
                                  copy (pinned on a GPU) and one indexed store

    On the CPU both are one tensor (``host_mirror`` off): nothing is staged or copied.
    Reading ``table`` flushes first, so a device read never sees a stale entry.

    ``record_writes()`` keeps a journal of the writes (``TableWrites``) that
    ``take_writes`` hands over: tensor-parallel rank 0 sends it with each pass, and the
    other ranks ``apply`` it to their copies of the table.
    """

    def __init__(
        self,
        max_running_requests: int,
        max_context_len: int,
        device: torch.device | str = "cpu",
        host_mirror: bool | None = None,
    ) -> None:
        """host_mirror: keep a separate host copy (None: when ``device`` is not the CPU;
        True on the CPU runs the GPU's code path, for tests and benchmarks)."""
        shape = (max_running_requests, max_context_len)
        self.host = torch.zeros(shape, dtype=torch.int64)
        if host_mirror is None:
            host_mirror = torch.device(device).type != "cpu"
        self._device_table = (
            torch.zeros(shape, dtype=torch.int64, device=device) if host_mirror else self.host
        )
        # (rows, positions) of the host entries written since the last flush
        self._staged: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._free_rows = list(range(max_running_requests - 1, -1, -1))
        self._journal: list[TableWrites] | None = None  # see record_writes

    @property
    def table(self) -> torch.Tensor:
        """(rows, max_context_len) int64 on the model's device, every write applied."""
        if self._staged:
            self.flush()
        return self._device_table

    @property
    def num_free_rows(self) -> int:
        return len(self._free_rows)

    def allocate_row(self) -> int | None:
        return self._free_rows.pop() if self._free_rows else None

    def free_row(self, row: int) -> None:
        self._free_rows.append(row)

    def record_writes(self) -> None:
        """From now on, every write is also kept for ``take_writes``."""
        self._journal = []

    def take_writes(self) -> tuple[TableWrites, ...]:
        """The writes since the last call (``record_writes`` must have been called)."""
        assert self._journal is not None, "record_writes() was not called"
        writes, self._journal = tuple(self._journal), []
        return writes

    def apply(self, writes: tuple[TableWrites, ...]) -> None:
        """Repeats another table's writes, in order."""
        for w in writes:
            self.write_positions(w.rows, w.positions, w.slots)

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        """Positions ``start ..`` of ``row`` get ``slots`` (host int64 ids)."""
        n = slots.numel()
        if n == 0:
            return
        self.host[row, start : start + n] = slots
        if self._journal is not None or self._device_table is not self.host:
            rows = torch.full((n,), row, dtype=torch.int64)
            positions = torch.arange(start, start + n)
            self._note(rows, positions, slots)

    def write_positions(
        self, rows: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor
    ) -> None:
        """``table[rows[i], positions[i]] = slots[i]`` for every i; (N,) host tensors each."""
        self.host[rows, positions] = slots
        self._note(rows, positions, slots)

    def _note(self, rows: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor) -> None:
        if self._device_table is not self.host:
            self._staged.append((rows, positions))
        if self._journal is not None:
            self._journal.append(TableWrites(rows, positions, slots.to(torch.int64)))

    def flush(self) -> None:
        """Applies the staged writes to the device table: one copy of their (row,
        position, slot) triples, one indexed store. The slots come from the host copy
        as it is now, so a position written twice since the last flush ends with its
        last value whatever order the device stores duplicates in."""
        if not self._staged:
            return
        rows = torch.cat([r for r, _ in self._staged])
        positions = torch.cat([p for _, p in self._staged])
        self._staged = []
        triples = torch.stack((rows, positions, self.host[rows, positions]))  # (3, N)
        on_device = to_device(triples, self._device_table.device)
        self._device_table[on_device[0], on_device[1]] = on_device[2]

    def read(self, row: int, num_tokens: int) -> torch.Tensor:
        """The slots of ``row``'s first ``num_tokens`` positions: a view of the host copy
        (never a device read)."""
        return self.host[row, :num_tokens]
