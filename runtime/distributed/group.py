"""One process's place in the tensor-parallel group, over ``torch.distributed``.

Two process groups over the same ranks:

- the model's (gloo on CPUs, NCCL on GPUs): the all-reduce after each row-parallel
  block, the vocabulary's embedding all-reduce and logit all-gather, bounded by
  ``ParallelConfig.dist_timeout_s``;
- the control group (gloo, CPU tensors): rank 0 sends each pass to the others. It has
  no practical timeout, as a rank waits on it for as long as the server idles; a
  peer that dies is seen at once all the same (its connection closes).

Any failure of a collective is a ``RankFailedError``: the ranks are no longer in step,
so the engine stops (``radixlm serve`` exits non-zero) rather than compute garbage.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from radixlm.runtime.config import ParallelConfig
from radixlm.runtime.distributed.sharding import ShardPlan
from radixlm.runtime.errors import RankFailedError
from radixlm.runtime.models.config import ArchConfig

__all__ = ["CommStats", "TensorParallelGroup"]

logger = logging.getLogger(__name__)
T = TypeVar("T")

_CONTROL_TIMEOUT = datetime.timedelta(days=365)  # rank 0's next pass may be far off


@dataclass
class CommStats:
    """Collectives on the model group since the group started, and the seconds they
    took on this rank (waiting for the slowest rank included)."""

    all_reduces: int = 0
    all_reduce_s: float = 0.0
    gathers: int = 0
    gather_s: float = 0.0


class TensorParallelGroup:
    """This rank's collectives and shard plan; build with ``join``."""

    def __init__(self, plan: ShardPlan, control: Any) -> None:
        self.plan = plan
        self.rank, self.size = plan.rank, plan.size
        self.stats = CommStats()
        self._control = control
        self._vocab = plan.vocab()

    @classmethod
    def join(
        cls, parallel: ParallelConfig, rank: int, arch: ArchConfig, device: str, init_addr: str
    ) -> TensorParallelGroup:
        """Joins the group (blocks until all ``tp_size`` ranks have). NCCL on a GPU
        (each rank on its node's GPU of its local index), gloo on the CPU."""
        if device == "cuda":
            torch.cuda.set_device(rank % parallel.ranks_per_node)
        backend = "nccl" if device == "cuda" else "gloo"
        _run(
            lambda: dist.init_process_group(
                backend,
                init_method=f"tcp://{init_addr}",
                rank=rank,
                world_size=parallel.tp_size,
                timeout=datetime.timedelta(seconds=parallel.dist_timeout_s),
            ),
            f"joining the tensor-parallel group at {init_addr} as rank {rank}",
        )
        control = dist.new_group(backend="gloo", timeout=_CONTROL_TIMEOUT)
        logger.info("tensor parallel: rank %d of %d joined (%s)", rank, parallel.tp_size, backend)
        return cls(ShardPlan(rank, parallel.tp_size, arch), control)

    # ---- the model's collectives ------------------------------------------------------

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The ranks' partial sums of ``x`` added, in place; returns ``x``."""
        start = time.perf_counter()
        _run(lambda: dist.all_reduce(x), "an all-reduce")
        self.stats.all_reduces += 1
        self.stats.all_reduce_s += time.perf_counter() - start
        return x

    def embed(self, embedding: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        """(T,) token ids -> (T, hidden): each rank looks up the ids of its vocabulary
        slice (zeros for the rest) and the ranks add theirs (exact: one is non-zero)."""
        local = ids - self._vocab.start
        inside = (local >= 0) & (local < len(self._vocab))
        hidden = embedding(torch.where(inside, local, 0))
        return self.all_reduce(hidden.masked_fill_(~inside[:, None], 0))

    def gather_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """(N, this rank's vocabulary) -> (N, vocabulary): every rank's logits side by side."""
        shard = self.plan.vocab_shard
        if logits.shape[1] < shard:  # the last rank's shorter slice
            logits = torch.nn.functional.pad(logits, (0, shard - logits.shape[1]))
        parts = [torch.empty_like(logits) for _ in range(self.size)]
        start = time.perf_counter()
        _run(lambda: dist.all_gather(parts, logits.contiguous()), "a logits all-gather")
        self.stats.gathers += 1
        self.stats.gather_s += time.perf_counter() - start
        return torch.cat(parts, dim=1)[:, : self.plan.arch.vocab_size]

    def min_int(self, value: int) -> int:
        """The smallest of every rank's ``value`` (what all of them can hold)."""
        t = torch.tensor([value], dtype=torch.int64)
        _run(
            lambda: dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self._control),
            "agreeing on a size",
        )
        return int(t.item())

    # ---- rank 0 -> the others ---------------------------------------------------------

    def send(self, message: object) -> None:
        """Rank 0: hands ``message`` (CPU tensors only) to every other rank."""
        _run(
            lambda: dist.broadcast_object_list([message], src=0, group=self._control),
            "sending a pass to the other ranks",
        )

    def receive(self) -> Any:
        """Another rank: the next message rank 0 sends (waits for it)."""
        box: list[Any] = [None]
        _run(
            lambda: dist.broadcast_object_list(box, src=0, group=self._control),
            "waiting for rank 0",
        )
        return box[0]

    def close(self) -> None:
        """Leaves the group (this process can join another afterwards)."""
        if dist.is_initialized():
            dist.destroy_process_group()


def _run(op: Callable[[], T], what: str) -> T:
    try:
        return op()
    except RuntimeError as e:  # DistBackendError / gloo's "Connection closed by peer" / ...
        raise RankFailedError(f"tensor parallel: {what} failed: {e}") from e
