"""One sampling step's plan: how its rows are grouped, and the tensors its stages read.

The host knows everything about the rows; the device holds the logits. A plan is
built on the host from the rows alone, and the tensors its stages read (the row
order, the float parameters, the penalties' entries) cross to the logits' device in
one copy (``SamplingPlan.to``). Groups lie back to back in the plan's order, each
with its unseeded rows first, so a stage takes a group, or a group's seeded rows, as
a slice, and no index list crosses per group::

    batch row     0      1       2       3       4      5
    sampled as    plain  greedy  top_k5  plain*  plain  greedy     (* seeded)
    order         1  5 | 0  4  3 | 2
    groups        greedy [0:2] | plain [2:5], unseeded [2:4] | top_k 5 [5:6]

Groups come in the order of their first row in the batch (greedy first, it draws
nothing), so the sampler's shared stream hands its uniforms to the same rows, in
the same order, as a row-by-row loop over the groups would.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixlm.runtime.device import to_device_packed
from radixlm.runtime.sampling.penalties import Penalties

if TYPE_CHECKING:
    from radixlm.runtime.io.sampling_params import SamplingParams
    from radixlm.runtime.sampling.sampler import SamplingRow

__all__ = ["PlanTensors", "RowGroup", "RowParams", "SamplingPlan", "group_key"]


def group_key(params: SamplingParams, vocab_size: int) -> tuple[str, int]:
    """How a row's candidates are found: ("greedy", 0), ("top_k", k) (its own k, never
    padded to a batch maximum), ("top_p", 0) (the nucleus over all V) or ("plain", 0)."""
    if params.is_greedy:
        return ("greedy", 0)
    if 1 < params.top_k < vocab_size:
        return ("top_k", params.top_k)
    return ("top_p", 0) if params.top_p < 1.0 else ("plain", 0)


@dataclass(frozen=True)
class RowParams:
    """The float parameters the stages read, one row per logits row.

    values: (n, 3) float32 columns temperature, top_p, min_p (each rounded to float32
        as a stage compares with it).
    """

    values: torch.Tensor

    @classmethod
    def of(cls, rows: Sequence[SamplingRow]) -> RowParams:
        table = [[r.params.temperature, r.params.top_p, r.params.min_p] for r in rows]
        return cls(torch.tensor(table, dtype=torch.float32).reshape(len(rows), 3))

    @property
    def temperature(self) -> torch.Tensor:
        return self.values[:, 0]

    @property
    def top_p(self) -> torch.Tensor:
        return self.values[:, 1]

    @property
    def min_p(self) -> torch.Tensor:
        return self.values[:, 2]

    def take(self, rows: slice | torch.Tensor) -> RowParams:
        """These parameters of ``rows`` (a slice, or an index on their device)."""
        return RowParams(self.values[rows])


@dataclass(frozen=True)
class RowGroup:
    """Rows sampled alike: rows ``span`` of the plan's order.

    Attributes:
        kind: "greedy", "plain", "top_k" or "top_p" (see ``group_key``).
        top_k: k for a "top_k" group, else 0.
        start: the group's first row in the plan's order.
        rows: the group's rows in that order: unseeded first, each part in batch order.
    """

    kind: str
    top_k: int
    start: int
    rows: tuple[SamplingRow, ...]

    @property
    def span(self) -> slice:
        return slice(self.start, self.start + len(self.rows))


@dataclass(frozen=True)
class PlanTensors:
    """What crosses to the device for one step (each None when nothing reads it).

    order: (B,) int64: row i of the plan's order is batch row order[i]; None when
        that is the batch order.
    params: the parameters of the rows in the plan's order; None when every row is
        greedy.
    penalties: see ``Penalties`` (batch order); None when no row has any.
    """

    order: torch.Tensor | None
    params: RowParams | None
    penalties: Penalties | None


@dataclass(frozen=True)
class SamplingPlan:
    """The groups of one step's rows and the tensors their stages read.

    Build it with ``of`` (on the host), send it with ``to``.
    """

    groups: tuple[RowGroup, ...]
    tensors: PlanTensors

    @classmethod
    def of(cls, rows: Sequence[SamplingRow], vocab_size: int) -> SamplingPlan:
        members: dict[tuple[str, int], list[int]] = {("greedy", 0): []}
        for i, row in enumerate(rows):
            members.setdefault(group_key(row.params, vocab_size), []).append(i)
        order: list[int] = []
        groups = []
        for (kind, k), idx in members.items():
            if idx:
                idx.sort(key=lambda i: rows[i].params.seed is not None)  # stable
                groups.append(RowGroup(kind, k, len(order), tuple(rows[i] for i in idx)))
                order += idx
        in_order = order == list(range(len(rows)))
        sampled = len(members[("greedy", 0)]) < len(rows)
        tensors = PlanTensors(
            None if in_order else torch.tensor(order, dtype=torch.long),
            RowParams.of([rows[i] for i in order]) if sampled else None,
            Penalties.of(rows, vocab_size),
        )
        return cls(tuple(groups), tensors)

    def to(self, device: torch.device) -> SamplingPlan:
        """This plan with its tensors on ``device``: one copy (none if it has none)."""
        return dataclasses.replace(self, tensors=to_device_packed(self.tensors, device))

    @property
    def all_greedy(self) -> bool:
        return all(g.kind == "greedy" for g in self.groups)

    def adjust(self, logits: torch.Tensor) -> torch.Tensor:
        """(B, V) logits after penalties and min_new_tokens (a copy); ``logits``
        itself when no row has any."""
        penalties = self.tensors.penalties
        return logits if penalties is None else penalties.apply(logits)

    def params(self, group: RowGroup) -> RowParams:
        assert self.tensors.params is not None, "a greedy-only plan has no parameters"
        return self.tensors.params.take(group.span)

    def ordered(self, t: torch.Tensor) -> torch.Tensor:
        """(B, ...) batch rows -> the same rows in the plan's order."""
        return t if self.tensors.order is None else t[self.tensors.order]

    def restored(self, t: torch.Tensor) -> torch.Tensor:
        """(B, ...) rows in the plan's order -> batch order."""
        if self.tensors.order is None:
            return t
        out = torch.empty_like(t)
        out[self.tensors.order] = t
        return out
