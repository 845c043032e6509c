"""The device seam's packed copy: many host tensors cross as one buffer and come back
as themselves (dtype, shape, values), counted as one copy."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from radixlm.runtime.device import DeviceTraffic, count_traffic, to_device_packed

CPU = torch.device("cpu")


@dataclass(frozen=True)
class Inner:
    ids: torch.Tensor
    missing: torch.Tensor | None


@dataclass(frozen=True)
class Outer:
    values: torch.Tensor
    inner: Inner | None


def _parts() -> tuple:
    """Odd sizes and every width, so each part needs its own alignment."""
    return (
        torch.tensor([True, False, True]),
        torch.arange(5, dtype=torch.int64).reshape(5),
        None,
        torch.tensor([[0.5, -1.25, 3.0]], dtype=torch.float32),
        torch.tensor(7, dtype=torch.int16),  # 0-d
        torch.empty(2, 0, dtype=torch.float64),
        Outer(torch.tensor([1e-300, 2.0], dtype=torch.float64), Inner(torch.tensor([3]), None)),
        [torch.tensor([1, 2], dtype=torch.int32)],
    )


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, (Outer, Inner)):
        return type(a) is type(b) and _same(list(vars(a).values()), list(vars(b).values()))
    return a is b


def test_packed_parts_come_back_as_they_were_in_one_copy() -> None:
    parts = _parts()
    with count_traffic() as seen:
        sent = to_device_packed(parts, CPU)
    assert seen == DeviceTraffic(copies_to_device=1)
    assert _same(parts, sent)
    assert sent[1].untyped_storage().data_ptr() == sent[3].untyped_storage().data_ptr()


def test_nothing_is_packed_on_a_cpu_engine_unless_counted() -> None:
    parts = _parts()
    assert to_device_packed(parts, CPU) is parts


def test_parts_without_tensors_make_no_copy() -> None:
    with count_traffic() as seen:
        assert to_device_packed((None, [None]), CPU) == (None, [None])
    assert seen == DeviceTraffic()


def test_only_host_tensors_and_their_containers_are_sent() -> None:
    with pytest.raises(ValueError, match="host tensors"):
        to_device_packed((torch.empty(2, device="meta"),), CPU)
    with pytest.raises(TypeError, match="tensors, None, tuples and dataclasses"):
        to_device_packed((torch.arange(2), 3), CPU)
