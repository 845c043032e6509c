"""What a pass costs, as the speculation planner sees it: measured on the engine's own
device at start-up, or given.

A decode pass (one token per row) and a verify pass (rows with proposals) take different
paths: on a GPU the decode pass replays a CUDA graph and the verify pass runs the extend
kernels eagerly, so the first proposal of a step can cost far more than the next ones.
Each path is linear in what it computes::

    decode pass of B rows:           decode_base + decode_per_row * B
    verify pass of B rows, N tokens: verify_base + verify_per_row * B + verify_per_token * N

``calibrate`` fits both from a few timed passes (``time_pass(rows, tokens)``: the engine's
are scratch passes through its runner, ``scratch_pass_timer``); ``PassCost.per_token``
is the fixed model of ``speculative_token_cost`` (both paths alike, each token a share of
a one-token pass), for tests and for engines that skip the calibration.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from radixlm.runtime.attention import AttentionInputs
from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.io.sampling_params import SamplingParams
from radixlm.runtime.mem_cache.kv_pool import PAD_SLOT
from radixlm.runtime.sampling.sampler import SamplingRow

__all__ = ["PassCost", "PassTimer", "calibrate", "calibration_rows", "scratch_pass_timer"]

# time_pass(num_rows, num_tokens) -> seconds of one pass (num_tokens == num_rows: decode)
PassTimer = Callable[[int, int], float]
# context each scratch row attends to (a decode step's, roughly)
SCRATCH_CONTEXT = 128
# How far below the decode pass it extends a fitted verify pass may fall and still be
# believed. The two run different code (on a CPU the decode pass is the C++ whole step,
# the verify pass layer by layer), so a verify pass of B rows and B + 1 tokens can truly
# cost a little less: on the default model in float32 (AMD EPYC, AVX-512, 2 cores) one
# row's decode pass took 22.9-23.9 ms and its verify pass of two tokens 21.3-21.7 ms
# (fastest of 10, two runs). Noise that slows the decode passes gives far larger gaps
# (a fit of 37 ms against 16 ms on the same machine while it was busy).
VERIFY_SHORTFALL = 0.2


@dataclass(frozen=True)
class PassCost:
    """Time of one pass (seconds when measured; any unit when given), see the module
    docstring. Every coefficient is >= 0.

    max_rows: the largest batch the fit was timed at (None: a given model, for any
    batch). Past it the fit is an extrapolation a CPU's passes do not follow (a verify
    pass of 32 rows took several times its fitted time on the default model), so no proposal is
    planned there (``trusted``)."""

    decode_base: float
    decode_per_row: float
    verify_base: float
    verify_per_row: float
    verify_per_token: float
    max_rows: int | None = None

    def __post_init__(self) -> None:
        if (
            min(self.decode_base, self.decode_per_row) < 0
            or min(self.verify_base, self.verify_per_row, self.verify_per_token) < 0
        ):
            raise ValueError(f"pass cost coefficients must be >= 0, got {self}")
        if self.decode_base + self.decode_per_row <= 0:
            raise ValueError(f"a decode pass must cost something, got {self}")

    @classmethod
    def per_token(cls, token_cost: float) -> PassCost:
        """Each token of any pass costs ``token_cost`` of a one-token pass:
        n tokens cost 1 + token_cost * (n - 1), decode or verify."""
        return cls(1.0 - token_cost, token_cost, 1.0 - token_cost, 0.0, token_cost)

    def trusted(self, num_rows: int) -> bool:
        """Whether the model holds at this batch size (timed there, or below it)."""
        return self.max_rows is None or num_rows <= self.max_rows

    def decode(self, num_rows: int) -> float:
        return self.decode_base + self.decode_per_row * num_rows

    def verify(self, num_rows: int, num_tokens: int) -> float:
        per_row, per_token = self.verify_per_row, self.verify_per_token
        return self.verify_base + per_row * num_rows + per_token * num_tokens

    def plausible(self, row_counts: Sequence[int]) -> bool:
        """Whether a fit can be trusted: a verify pass computes its rows' decode tokens
        and more, so one well below the decode pass at a timed batch size (more than
        ``VERIFY_SHORTFALL`` of it) came from the machine's noise (passes slowed by
        other processes), not from the device."""
        floor = 1.0 - VERIFY_SHORTFALL
        return all(self.verify(b, b + 1) >= floor * self.decode(b) for b in row_counts)

    def can_pay(self, num_rows: int, max_tokens: int) -> bool:
        """Whether a verify pass in which every row proposes ``max_tokens`` and all are
        accepted would emit tokens faster than a decode pass: when not, no proposal can
        pay at this batch size (nor past the batches the costs were timed at)."""
        emitted = num_rows * (1 + max_tokens)
        faster = emitted / self.verify(num_rows, emitted) > num_rows / self.decode(num_rows)
        return self.trusted(num_rows) and faster


def calibrate(
    time_pass: PassTimer, row_counts: Sequence[int], num_tokens: int, repeats: int = 2
) -> PassCost:
    """Fits ``PassCost`` to timed passes: for each B of ``row_counts``, decode passes of B
    rows, and verify passes of B rows proposing one token (B + 1 tokens) and K each
    (B * (1 + K) tokens, K = ``num_tokens``); the fastest of ``repeats`` runs each (the
    machine's noise only slows a pass), after one untimed pass of each path. Needs two
    row counts or more."""
    counts = sorted(set(row_counts))
    if len(counts) < 2 or counts[0] < 1:
        raise ValueError(f"calibrate needs two row counts >= 1 or more, got {row_counts}")
    if num_tokens < 1 or repeats < 1:
        raise ValueError(f"num_tokens and repeats must be >= 1, got {num_tokens}, {repeats}")

    def fastest(rows: int, tokens: int) -> float:
        return min(time_pass(rows, tokens) for _ in range(repeats))

    time_pass(counts[0], counts[0])  # warm-ups, untimed: first passes allocate and compile
    time_pass(counts[0], counts[0] + 1)

    decode = [(b, fastest(b, b)) for b in counts]
    shapes = sorted({(b, n) for b in counts for n in (b + 1, b * (1 + num_tokens))})
    verify = [(b, n, fastest(b, n)) for b, n in shapes]
    decode_base, decode_per_row = _least_squares([[1.0, b] for b, _ in decode], decode)
    verify_base, per_row, per_token = _least_squares([[1.0, b, n] for b, n, _ in verify], verify)
    return PassCost(
        decode_base, decode_per_row, verify_base, per_row, per_token, max_rows=counts[-1]
    )


def _least_squares(design: list[list[float]], samples: Sequence[tuple]) -> list[float]:
    """Non-negative coefficients of the least-squares fit of the samples' last column
    (a coefficient the fit drives below zero is dropped and the rest refitted)."""
    a = torch.tensor(design, dtype=torch.float64)
    y = torch.tensor([s[-1] for s in samples], dtype=torch.float64)
    keep = list(range(a.shape[1]))
    while True:
        solution = torch.linalg.lstsq(a[:, keep], y[:, None], driver="gelsd").solution[:, 0]
        negative = [k for k, v in zip(keep, solution.tolist()) if v < 0]
        if not negative:
            coefficients = [0.0] * a.shape[1]
            for k, v in zip(keep, solution.tolist()):
                coefficients[k] = v
            return coefficients
        keep.remove(negative[0])


def calibration_rows(device_type: str, max_running_requests: int) -> tuple[int, ...]:
    """The batch sizes timed at start-up: a GPU's are cheap up to the sizes served; a
    CPU's stay small enough that the calibration takes well under a second."""
    wanted = (1, 32, 128) if device_type == "cuda" else (1, 8)
    return tuple(sorted({min(b, max_running_requests) for b in wanted}))


def scratch_pass_timer(runner: ModelRunner, context_len: int) -> PassTimer:
    """Times passes through ``runner`` that touch no request's KV: every row reads
    ``req_to_token`` row 0 (all ``PAD_SLOT`` before the first request) and writes its
    K/V to the padding slot, as CUDA graph capture's padding rows do. Call it before
    the engine admits anything. Tokens are spread over the rows, the first ones longest."""
    row = SamplingRow(SamplingParams(temperature=0, max_new_tokens=2), (), frozenset())
    device = runner.device

    def scratch_batch(num_rows: int, num_tokens: int) -> ForwardBatch:
        extra, rest = divmod(num_tokens - num_rows, num_rows)
        extend = [1 + extra + (i < rest) for i in range(num_rows)]
        prefix = min(SCRATCH_CONTEXT, context_len - max(extend))
        lens = torch.tensor(extend, dtype=torch.int64)
        positions = torch.cat([torch.arange(prefix, prefix + e) for e in extend])
        ends = torch.cumsum(lens, 0) - 1
        proposals = None
        if num_tokens > num_rows:
            proposals = tuple((0,) * (e - 1) for e in extend)
            sample_indices = torch.arange(num_tokens)
        else:
            sample_indices = ends
        none = torch.zeros(0, dtype=torch.int64)
        attn = AttentionInputs(
            torch.zeros(num_rows, dtype=torch.int64),
            torch.full((num_rows,), prefix, dtype=torch.int64),
            lens,
            torch.full((num_tokens,), PAD_SLOT, dtype=torch.int64),
            max(extend),
        )
        return ForwardBatch(
            torch.zeros(num_tokens, dtype=torch.int64),
            positions,
            attn,
            sample_indices,
            (row,) * num_rows,
            False,
            none,
            none,
            0,
            proposals=proposals,
        )

    def time_pass(num_rows: int, num_tokens: int) -> float:
        batch = scratch_batch(num_rows, num_tokens)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        runner.run(batch)  # reads its sampled ids back: the pass has finished
        return time.perf_counter() - start

    return time_pass
