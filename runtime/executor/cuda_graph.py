"""Decode passes replayed from CUDA graphs, one captured per batch size.

A decode step of a small model on a GPU is hundreds of kernel launches of a few
microseconds each: the host's launch cost, not the GPU, bounds it. A CUDA graph
records the step's launches once and replays them in one call. Graphs replay on
fixed buffers, so ``DecodeGraphs`` keeps one set of static inputs sized for the
largest captured batch (token ids, positions, ``req_to_token`` rows, cached
lengths, new slots) and captures, for each batch size of a ladder (1, 2, 4, 8,
then every 8 up to 256 and every 16 past it, up to the largest decode batch:
``max_running_requests`` unless ``cuda_graph_max_bs`` says less), the backend's
``prepare`` and the model's forward over the first rows of those buffers. A pass
of B decode rows copies its inputs into the buffers, pads them up to the next
captured size with rows that attend one position and write their K/V to the
pool's padding slot, replays, and reads the first B rows of the graph's output.

What runs on the host at a replay (``run``): five copies of the pass's inputs into
the buffers and five fills of the padding rows, then one ``graph.replay()``. The
model's Python (its layer loop, each layer's norms, RoPE, attention and MLP calls,
the backend's ``prepare``) ran once, at capture; whatever it decided on the host
then (the decode split count for that batch size, the launch grids, which fused
kernels to call) is fixed in the graph. So ``prepare`` of a decode pass and every
layer's ``forward`` may compute nothing on the host from values, only from shapes
(``graph_capturable``).

Only a backend whose decode ``prepare`` and ``forward`` are device ops alone
can be captured (``AttentionBackend.graph_capturable``: "triton"). Every graph
shares one memory pool, captured largest first, as the smaller ones fit in what
the largest used.

``GraphCapture`` is the one seam to the device: ``CudaGraphCapture`` records
real graphs; ``EagerReplay`` stands in for it on a CPU, running the captured
function again at every replay over the same buffers, so that everything but
the recording itself (the buffers, the padding, the ladder, the runner's
choice of path) runs in the CPU test suite.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from functools import partial
from typing import Protocol

import torch

from radixlm.runtime.attention import AttentionBackend, AttentionInputs
from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.mem_cache.kv_pool import PAD_SLOT

__all__ = [
    "CudaGraphCapture",
    "DecodeGraphs",
    "EagerReplay",
    "GraphCapture",
    "graph_batch_sizes",
]

Replay = Callable[[], torch.Tensor]


# Past this batch size the ladder steps by 16: fewer graphs to capture, and at most
# 15 idle rows in 257 or more (under 6% of a pass).
_FINE_LADDER_MAX = 256


def graph_batch_sizes(max_batch_size: int) -> tuple[int, ...]:
    """The captured ladder: 1, 2, 4, 8, then every 8 up to 256 and every 16 past it, up
    to and including ``max_batch_size`` (a pass pads up to the next size: at most 7
    idle rows up to 256, 15 past it)."""
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
    fine = range(16, min(max_batch_size, _FINE_LADDER_MAX) + 1, 8)
    coarse = range(_FINE_LADDER_MAX + 16, max_batch_size + 1, 16)
    ladder = [1, 2, 4, 8, *fine, *coarse]
    sizes = [n for n in ladder if n <= max_batch_size]
    if sizes[-1] != max_batch_size:
        sizes.append(max_batch_size)
    return tuple(sizes)


class GraphCapture(Protocol):
    def capture(self, forward: Replay) -> Replay:
        """Records ``forward`` (a function of static buffers only) and returns a
        replay: a call that runs it again on whatever the buffers hold now and
        returns its output (the same tensor at every replay, for a real graph)."""
        ...


class CudaGraphCapture:
    """Real CUDA graphs on the current device, sharing one memory pool."""

    def __init__(self, warm_up_runs: int = 2) -> None:
        self._warm_up_runs = warm_up_runs
        self._pool: tuple[int, int] | None = None

    def capture(self, forward: Replay) -> Replay:
        # Warm-up runs on a side stream, as torch.cuda.graphs asks: Triton compiles
        # its kernels and cuBLAS picks its algorithms outside the recording.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(self._warm_up_runs):
                forward()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = forward()
        if self._pool is None:
            self._pool = graph.pool()

        def replay() -> torch.Tensor:
            graph.replay()
            return out

        return replay


class EagerReplay:
    """A CPU stand-in for ``CudaGraphCapture``: "capture" runs ``forward`` once
    (as a real capture's warm-up would), and every replay runs it again."""

    def capture(self, forward: Replay) -> Replay:
        forward()
        return forward


class DecodeGraphs:
    """Runs decode passes of up to ``max(batch_sizes)`` rows by graph replay; see
    the module docstring."""

    def __init__(
        self,
        model: torch.nn.Module,
        backend: AttentionBackend,
        batch_sizes: tuple[int, ...],
        capture: GraphCapture,
    ) -> None:
        if not backend.graph_capturable:
            raise ValueError(f"attention backend {backend.name!r} cannot be captured in a graph")
        self.model = model
        self.backend = backend
        self.batch_sizes = tuple(sorted(set(batch_sizes)))
        self._capture = capture
        device = backend.kv_pool.k.device
        n = self.batch_sizes[-1]

        def buffer(fill: int) -> torch.Tensor:
            return torch.full((n,), fill, dtype=torch.int64, device=device)

        self._input_ids, self._positions = buffer(0), buffer(0)
        self._rows, self._prefix_lens = buffer(0), buffer(0)
        self._extend_lens, self._out_cache_loc = buffer(1), buffer(PAD_SLOT)
        self._replays: dict[int, Replay] = {}
        self.passes = 0  # passes replayed

    @property
    def max_batch_size(self) -> int:
        return self.batch_sizes[-1]

    @torch.inference_mode()
    def capture_all(self) -> None:
        """Captures every batch size, largest first (the pool the first one fills
        serves the rest). The buffers hold padding rows meanwhile, so a capture
        writes nothing but the padding slot."""
        for size in reversed(self.batch_sizes):
            self._replays[size] = self._capture.capture(partial(self._forward, size))

    def accepts(self, batch: ForwardBatch) -> bool:
        """Decode rows only (known on the host: ``max_extend_len``), no more than
        the largest captured size, every graph captured."""
        rows = batch.attn.rows.numel()
        return (
            len(self._replays) == len(self.batch_sizes)
            and rows <= self.max_batch_size
            and batch.attn.longest_extend == 1
        )

    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """One accepted pass (on the graphs' device): (B, hidden) final hidden states
        of its B rows; their K/V land in the pool."""
        b = batch.attn.rows.numel()
        size = self.batch_sizes[bisect.bisect_left(self.batch_sizes, b)]
        attn = batch.attn
        for buffer, values, pad in (
            (self._input_ids, batch.input_ids, 0),
            (self._positions, batch.positions, 0),
            (self._rows, attn.rows, 0),
            (self._prefix_lens, attn.prefix_lens, 0),
            (self._out_cache_loc, attn.out_cache_loc, PAD_SLOT),
        ):
            buffer[:b].copy_(values)
            buffer[b:size].fill_(pad)  # padding rows: one position, written to the padding slot
        hidden = self._replays[size]()
        self.passes += 1
        return hidden[:b]

    def _forward(self, size: int) -> torch.Tensor:
        """The captured work: the backend's decode metadata from the buffers' first
        ``size`` rows, then the model over them."""
        inputs = AttentionInputs(
            self._rows[:size],
            self._prefix_lens[:size],
            self._extend_lens[:size],
            self._out_cache_loc[:size],
            max_extend_len=1,
        )
        metadata = self.backend.prepare(inputs)
        return self.model(self._input_ids[:size], self._positions[:size], metadata)
