"""Device placement: which device an engine runs on, and how tensors cross to it.

Every pass is built on the host (the scheduler's tensors are CPU tensors) and
crosses to the model's device once, in ``ModelRunner.launch``; its results cross
back once per step (``start_to_host`` queues them when the pass is launched,
``HostCopy.wait`` waits once when they are read: with overlap scheduling, after the
next pass was launched). On a GPU both directions are asynchronous: a host tensor is
staged in pinned (page-locked) memory so its copy does not make the host wait, and
the copies back are queued together and waited for once.

Every crossing goes through this module (``to_device``, ``start_to_host`` /
``to_host``), so a
``count_traffic()`` block can count them: a test or a benchmark on the CPU learns
what a step would copy and wait for on a GPU (on a CPU engine the "device" is the
host, and each call counts as the crossing it is on a GPU). The many small tensors
one step builds on the host (row parameters, index lists) cross together, as one
buffer (``to_device_packed``)::

    host    [ order: int64 | params: float32 (n, 3) | rows: int64 ]    parts
    buffer  [ bytes .............................................. ]    one copy
    device  [ order view   | params view            | rows view   ]    same dtypes, shapes
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

__all__ = [
    "DeviceTraffic",
    "HostCopy",
    "count_traffic",
    "counting_traffic",
    "resolve_device",
    "start_to_host",
    "to_device",
    "to_device_packed",
    "to_host",
]

_Parts = TypeVar("_Parts")
# Every packed part starts at a multiple of this many bytes, so it can be viewed as
# any dtype up to 8 bytes wide.
_ALIGN = 8


@dataclass
class DeviceTraffic:
    """Crossings counted by a ``count_traffic()`` block.

    copies_to_device: host tensors sent to the model's device (``to_device``).
    copies_to_host: device tensors read back (``to_host``), each one copy.
    syncs: times the host waited for the device (one per ``to_host`` call).
    """

    copies_to_device: int = 0
    copies_to_host: int = 0
    syncs: int = 0


# The open count_traffic() blocks. Empty unless a test or a benchmark counts; a block
# removes its own counter on exit, so nothing needs resetting by hand.
_counters: list[DeviceTraffic] = []


@contextmanager
def count_traffic() -> Iterator[DeviceTraffic]:
    """Counts every crossing made (on any thread) while the block runs."""
    counter = DeviceTraffic()
    _counters.append(counter)
    try:
        yield counter
    finally:
        _counters.remove(counter)


def counting_traffic() -> bool:
    """Whether a ``count_traffic()`` block is open: code that skips a crossing when
    the tensors are on the device already takes the crossing path then, so a CPU run
    counts what a GPU one copies."""
    return bool(_counters)


def resolve_device(name: str) -> str:
    """ "auto" -> "cuda" when torch sees a GPU, else "cpu"; "cpu" and "cuda" as they are.

    Raises ValueError for "cuda" on a machine where torch sees none.
    """
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            "device 'cuda': torch sees no GPU here (a CPU build of torch, or no driver)"
        )
    return name


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device``; a host tensor bound for a GPU goes through pinned memory
    without waiting (the copy is ordered on the current stream before any kernel
    that reads it)."""
    if _counters and t.device.type == "cpu":
        for counter in _counters:
            counter.copies_to_device += 1
    if t.device == device:
        return t
    if t.device.type == "cpu" and device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)  # to the host: the copy must be waited for


class HostCopy:
    """Device tensors on their way to the host: every copy is queued at once (into
    pinned memory on a GPU) and ``wait`` waits for them together, once. Between the
    two the host is free to prepare the next pass (overlap scheduling)."""

    def __init__(self, tensors: tuple[torch.Tensor, ...]) -> None:
        for counter in _counters:
            counter.copies_to_host += len(tensors)
        self._event: torch.cuda.Event | None = None
        self._waited = False
        on_gpu = [t for t in tensors if t.device.type == "cuda"]
        if not on_gpu:
            self._host = tensors
            return
        self._host = tuple(
            torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)
            if t.device.type == "cuda"
            else t
            for t in tensors
        )
        self._event = torch.cuda.Event()
        self._event.record(torch.cuda.current_stream(on_gpu[0].device))

    def wait(self) -> tuple[torch.Tensor, ...]:
        """The tensors on the host (one synchronisation, counted at the first call)."""
        if not self._waited:
            for counter in _counters:
                counter.syncs += 1
            if self._event is not None:
                self._event.synchronize()
            self._waited = True
        return self._host


def start_to_host(*tensors: torch.Tensor) -> HostCopy:
    """Queues the tensors' copies to the host now; ``HostCopy.wait`` has them."""
    return HostCopy(tensors)


def to_device_packed(parts: _Parts, device: torch.device) -> _Parts:
    """``parts`` with every tensor in it on ``device``, all in one copy.

    ``parts``: a host tensor, None, or a tuple, list or dataclass of these (nested),
    as built for one step; it comes back with the same structure, each tensor a view
    of one device buffer at its own dtype and shape. Nothing is copied on a CPU engine
    unless traffic is counted (then the buffer is built, and counts as one copy).

    Raises:
        ValueError: a tensor in ``parts`` is not on the host.
        TypeError: ``parts`` holds something else (a dataclass field must be one of
            these too).
    """
    tensors: list[torch.Tensor] = []

    def collect(t: torch.Tensor) -> torch.Tensor:
        tensors.append(t)
        return t

    _map_tensors(parts, collect)
    if not tensors or (device.type == "cpu" and not _counters):
        return parts
    buffer, starts = _pack(tensors, pinned=device.type == "cuda")
    sent = to_device(buffer, device)
    views = iter(
        sent[start : start + _num_bytes(t)].view(t.dtype).view(t.shape)
        for t, start in zip(tensors, starts)
    )
    return _map_tensors(parts, lambda _: next(views))


def _map_tensors(parts: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``parts`` with ``fn`` applied to each host tensor in it, in a fixed order."""
    if isinstance(parts, torch.Tensor):
        if parts.device.type != "cpu":
            raise ValueError(f"to_device_packed sends host tensors, got one on {parts.device}")
        return fn(parts)
    if parts is None:
        return None
    if isinstance(parts, (tuple, list)):
        return type(parts)(_map_tensors(p, fn) for p in parts)
    if dataclasses.is_dataclass(parts) and not isinstance(parts, type):
        fields = dataclasses.fields(parts)
        return dataclasses.replace(
            parts, **{f.name: _map_tensors(getattr(parts, f.name), fn) for f in fields}
        )
    raise TypeError(f"to_device_packed sends tensors, None, tuples and dataclasses, got {parts!r}")


def _pack(tensors: list[torch.Tensor], pinned: bool) -> tuple[torch.Tensor, list[int]]:
    """One uint8 host buffer holding every tensor's bytes, and where each starts."""
    starts, end = [], 0
    for t in tensors:
        end += -end % _ALIGN
        starts.append(end)
        end += _num_bytes(t)
    buffer = torch.empty(end, dtype=torch.uint8, pin_memory=pinned)
    for t, start in zip(tensors, starts):
        buffer[start : start + _num_bytes(t)] = t.contiguous().reshape(-1).view(torch.uint8)
    return buffer, starts


def _num_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def to_host(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The tensors on the host, all copies queued first and waited for once (one
    synchronisation per call, whatever their number); host tensors as they are."""
    return start_to_host(*tensors).wait()
