"""Device placement: which device an engine runs on, and how tensors cross to it.

Every pass is built on the host (the scheduler's tensors are CPU tensors) and
crosses to the model's device once, in ``ModelRunner.run``; its results cross
back once per step (``to_host``). On a GPU both directions are asynchronous: a
host tensor is staged in pinned (page-locked) memory so its copy does not make
the host wait, and the copies back are queued together and waited for once.
"""

from __future__ import annotations

import torch

__all__ = ["resolve_device", "to_device", "to_host"]


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
    if t.device == device:
        return t
    if t.device.type == "cpu" and device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)  # to the host: the copy must be waited for


def to_host(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The tensors on the host, all copies queued first and waited for once (one
    synchronisation per call, whatever their number); host tensors as they are."""
    on_gpu = [t for t in tensors if t.device.type == "cuda"]
    if not on_gpu:
        return tensors
    host = tuple(
        torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)
        if t.device.type == "cuda"
        else t
        for t in tensors
    )
    torch.cuda.current_stream(on_gpu[0].device).synchronize()
    return host
