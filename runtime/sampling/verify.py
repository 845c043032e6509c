"""Verifying K proposed tokens per row against the target model, for a batch of rows.

A verifying row with K proposals x_0 .. x_{K-1} runs as an extend of 1 + K tokens
(its pending token, then the proposals) with logits kept at every position, so
position j holds the target's logits for the token after ``all_ids + x[:j]``. The
rows' positions lie back to back in one logits tensor::

    logits   | row 0: K = 2   | row 1: K = 0 | row 2: K = 3        |
             |  P0   P1   P2  |  P0          |  P0   P1   P2   P3  |
    offset      0               3              4

    a row emits  x_0 .. x_{m-1}, y_m      m accepted proposals (0 <= m <= K) and
                                          one token y_m from the target at position m

Every emitted token follows the target's distribution exactly as without
speculation. p_j is the sampler's processed distribution at position j: its
penalties and min_new_tokens see ``output_ids + x[:j]``, then the grammar mask,
temperature, top-k, top-p, min-p. Two ways to decide m:

- **deterministic proposals** (n-gram and radix: q_j is one-hot on x_j) and every
  greedy row: the ``Sampler`` itself draws y_j ~ p_j at every position, as it would
  without speculation (same stages, same grammar masks, a seeded row's stream keyed
  by (seed, step)), and m is the first j with y_j != x_j. That *is* rejection
  sampling with a one-hot q: x_j is accepted with probability p_j(x_j) =
  min(1, p_j(x_j) / q_j(x_j)), and a rejected y_j follows p_j without x_j,
  renormalised, which is normalize(max(0, p_j - q_j)). Greedy rows accept while
  x_j == argmax and then emit the argmax; a seeded row emits, token for token,
  what it emits without speculation.
- **draft distributions** (a draft model gives q_j; x_j was drawn from it):
  rejection sampling (Leviathan et al. 2023; Chen et al. 2023): accept x_j when
  u * q_j(x_j) < p_j(x_j), u ~ U[0, 1); at the first rejection draw y_j from
  normalize(max(0, p_j - q_j)); after K acceptances draw the bonus y_K from p_K.
  A seeded row's u and draw come from its own generator keyed by (seed, step).
  Every row's test and draw are computed at every position on the device, and m is
  the first rejection: the host never waits for one row to learn where the next
  starts. Unseeded rows take two uniforms per position (test, draw) from the
  verifier's stream, in one draw per step, whatever they accept.

p for the draft path is built from the sampler's own stages (its ``SamplingPlan``,
``scale_logits``, ``nucleus``), so it is the distribution the sampler draws from by
construction, not a second implementation.

Host and device: a step's grammar masks apply to all its positions at once, its
index lists cross in one copy, and the host learns what every row emits in one
``to_host`` (the step's one wait; the sampler's top_p read-back aside).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from radixlm.runtime.device import counting_traffic, to_device_packed, to_host
from radixlm.runtime.sampling.draws import SharedStream
from radixlm.runtime.sampling.plan import RowGroup, SamplingPlan
from radixlm.runtime.sampling.sampler import (
    SampleOutput,
    Sampler,
    SamplingRow,
    draw,
    mix_seed,
    nucleus,
    scale_logits,
    with_logprobs,
)

__all__ = ["VerifyOutput", "VerifyRow", "Verifier"]


@dataclass(frozen=True)
class VerifyRow:
    """One row of a verify step.

    Attributes:
        sampling: the row's sampling state before this step (``output_ids``: the
            tokens emitted so far, without the proposals).
        proposal: the K proposed token ids (K = 0: an ordinary decode step).
        draft_probs: (K, V) the draft's distribution q at each proposal (x_j was
            drawn from row j), or None for a deterministic proposer (q one-hot).
    """

    sampling: SamplingRow
    proposal: Sequence[int]
    draft_probs: torch.Tensor | None = None

    @property
    def num_positions(self) -> int:
        """Logits rows this row occupies: one per proposal, plus the bonus position."""
        return len(self.proposal) + 1


@dataclass(frozen=True)
class VerifyOutput:
    """What one verify step returns.

    Attributes:
        token_ids: per row, the tokens to append: its accepted proposals, then one
            token from the target (1 to K + 1 tokens).
        logprobs: the emitted tokens' logprobs (as ``Sampler.sample`` returns them:
            the raw distribution at each token's position), flat in row order;
            None unless requested.
    """

    token_ids: list[list[int]]
    logprobs: SampleOutput | None = None

    @property
    def num_accepted(self) -> list[int]:
        """Accepted proposals per row."""
        return [len(ids) - 1 for ids in self.token_ids]


class Verifier:
    """Decides which proposals a batch of rows keeps (see the module docstring).

    Args:
        sampler: the engine's sampler; deterministic proposals are verified with
            its draws, so its shared stream advances by one draw per position.
        seed: seeds the stream that unseeded draft-distribution rows draw from.
    """

    def __init__(self, sampler: Sampler, seed: int = 0) -> None:
        self._sampler = sampler
        self._stream = SharedStream(seed)  # unseeded draft-distribution rows draw from it

    def verify(
        self,
        logits: torch.Tensor,
        rows: Sequence[VerifyRow],
        return_logprobs: bool = False,
        grammar_bitmask: torch.Tensor | None = None,
        grammar_rows: torch.Tensor | None = None,
    ) -> VerifyOutput:
        """Accepts a prefix of each row's proposals and draws one more token.

        Args:
            logits: (N, V) raw logits, N = sum of ``row.num_positions``, laid out
                row after row as drawn in the module docstring; not modified.
            rows: the rows, in the logits' order (``draft_probs`` on the logits'
                device).
            return_logprobs: also return the emitted tokens' logprobs.
            grammar_bitmask: (G, W) int32 allowed-token masks for logits rows
                ``grammar_rows`` (G,), one per constrained position (None: all N
                rows in order); both on the logits' device.

        Raises:
            ValueError: logits do not have shape (N, V), a proposed token is out of
                the vocabulary, or a row's draft_probs is not (K, V).
        """
        self._check_inputs(logits, rows)
        offsets = _offsets(rows)
        position_rows = [_at_position(row, j) for row in rows for j in range(row.num_positions)]
        masked = logits
        if grammar_bitmask is not None:  # every position at once: no index to split
            masked = logits.to(torch.float32, copy=True)  # raw logits stay for logprobs
            self._sampler.apply_grammar(masked, grammar_bitmask, grammar_rows)
        direct = [i for i, r in enumerate(rows) if _is_direct(r)]
        # unseeded first: their uniforms are one draw from the verifier's stream
        drafted = sorted(
            (i for i, r in enumerate(rows) if not _is_direct(r)),
            key=lambda i: rows[i].sampling.params.seed is not None,
        )
        layout = _Layout.of(rows, offsets, direct, drafted)
        layout = to_device_packed(layout, logits.device)  # the step's one copy
        results = []  # on the device until the one wait below
        if direct:
            subset = [position_rows[p] for p in _positions(rows, offsets, direct)]
            drawn = self._sampler.sample(_rows_at(masked, layout.direct_at), subset, False)
            results.append(drawn.next_token_ids)
        if drafted:
            assert layout.rejection is not None
            subset = [position_rows[p] for p in _positions(rows, offsets, drafted)]
            probs = self.target_probs(_rows_at(masked, layout.drafted_at), subset)
            drafted_rows = [rows[i] for i in drafted]
            results += self._reject_sample(probs, drafted_rows, layout.rejection)
        host = [t.tolist() for t in to_host(*results)] if results else []  # the one wait
        emitted: list[list[int]] = [[] for _ in rows]
        if direct:
            _split_matching(host.pop(0), rows, direct, emitted)
        if drafted:
            for i, m, token in zip(drafted, *host):
                emitted[i] = [int(t) for t in rows[i].proposal[:m]] + [token]
        if not return_logprobs:
            return VerifyOutput(emitted)
        return VerifyOutput(emitted, _emitted_logprobs(logits, position_rows, offsets, emitted))

    def target_probs(self, logits: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
        """(n, V) raw logits -> (n, V) float32 distributions the sampler draws from,
        each summing to 1 (greedy rows: one-hot on the argmax). Grammar masks are the
        caller's to apply first (``Sampler.apply_grammar``)."""
        logits = logits.float()
        plan = SamplingPlan.of(rows, self._sampler.vocab_size).to(logits.device)  # one copy
        if not plan.groups:
            return torch.zeros_like(logits)
        ordered = plan.ordered(plan.adjust(logits))  # (n, V), groups back to back
        weights = [self._processed(ordered[g.span], g, plan) for g in plan.groups]
        probs = plan.restored(torch.cat(weights))
        return probs / probs.sum(dim=-1, keepdim=True)

    def _processed(
        self, adjusted: torch.Tensor, group: RowGroup, plan: SamplingPlan
    ) -> torch.Tensor:
        """(n, V) adjusted logits of one group -> (n, V) unnormalised weights: the
        sampler's candidates (its k best, or all V sorted) after top_p / min_p."""
        if group.kind == "greedy":
            one_hot = torch.zeros_like(adjusted)
            return one_hot.scatter_(1, adjusted.argmax(dim=-1, keepdim=True), 1.0)
        params = plan.params(group)
        scaled = scale_logits(adjusted, group.rows, params)
        if group.kind == "top_k":
            cand, ids = scaled.topk(group.top_k, dim=-1)  # (n, k), as Sampler._sample_top_k
            weights = cand.softmax(dim=-1)
        else:  # "plain" and "top_p": the same kept set as the sampler's top-256 shortcut
            weights, ids = scaled.softmax(dim=-1).sort(dim=-1, descending=True, stable=True)
        return torch.zeros_like(scaled).scatter_(1, ids, nucleus(weights, params))

    def _reject_sample(
        self, probs: torch.Tensor, rows: list[VerifyRow], at: _Rejection
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rejection sampling over the drafted rows' (N_d, V) target distributions
        (rows unseeded first, positions back to back) -> (n_d,) accepted proposals m
        and (n_d,) the token drawn at position m, on the device.

        Every proposal is tested (x_j kept when u * q_j(x_j) < p_j(x_j)); a row's m is
        its first rejection (else K), and y_m is drawn from normalize(max(0, p_m - q_m))
        (after K acceptances from p_K), without the host learning m first.
        """
        q = torch.cat([r.draft_probs for r in rows if r.draft_probs is not None]).float()
        residual = probs.clone()  # (N_d, V); the bonus positions keep p
        residual[at.proposal_at] = (probs[at.proposal_at] - q).clamp_min_(0.0)
        spent = ~(residual.sum(dim=-1, keepdim=True) > 0.0)  # p == q up to rounding
        weights = torch.where(spent, probs, residual)  # nothing to correct: draw from p
        num_unseeded = sum(r.num_positions for r in rows if r.sampling.params.seed is None)
        tests, draw_u = self._uniforms(rows, len(probs), num_unseeded, probs.device)
        m = _accepted(probs, q, tests, at)
        stop_at = at.first + m  # (n_d,) where each row draws its last token
        unseeded = sum(r.sampling.params.seed is None for r in rows)  # rows, first
        tokens = []
        if unseeded:
            where = stop_at[:unseeded]
            tokens.append(draw(weights[where], draw_u[where]))
        if unseeded < len(rows):
            seeded = rows[unseeded:]
            tokens.append(self._seeded_races(weights, seeded, m[unseeded:], stop_at[unseeded:]))
        return m, torch.cat(tokens)

    def _uniforms(
        self, rows: list[VerifyRow], num_positions: int, num_unseeded: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(N_d,) float64 test uniforms (the proposal positions' are read) and the
        unseeded positions' draw uniforms: two per position from the verifier's stream
        in one draw, whatever is accepted; seeded rows' tests from their own streams."""
        tests = torch.zeros(num_positions, dtype=torch.float64, device=device)
        draw_u = tests[:0]
        if num_unseeded:
            generator = self._stream.generator(device)
            u = torch.rand(2, num_unseeded, generator=generator, dtype=torch.float64, device=device)
            tests[:num_unseeded] = u[0]
            draw_u = u[1]
        at = num_unseeded
        for row in rows:
            if row.sampling.params.seed is None:
                continue
            for j in range(len(row.proposal)):
                generator = self._seeded_generator(row.sampling, j, device)
                torch.rand(1, generator=generator, out=tests[at + j : at + j + 1])
            at += row.num_positions
        return tests, draw_u

    def _seeded_races(
        self, weights: torch.Tensor, rows: list[VerifyRow], m: torch.Tensor, stop_at: torch.Tensor
    ) -> torch.Tensor:
        """(n,) the token each seeded row draws at its position m: an exponential race
        (as the sampler's) on the row's stream for that position, after its test u.

        A race at a position needs the host to pick its stream. On a CPU engine m is a
        host tensor, so each row races only where it stops; on a device every position
        races (the host does not wait to learn m) and m picks the winners."""
        if weights.device.type == "cpu" and not counting_traffic():
            steps = [[m_i] for m_i in m.tolist()]
            return self._race(weights[stop_at], rows, steps)
        steps = [list(range(r.num_positions)) for r in rows]
        first = len(weights) - sum(len(s) for s in steps)  # the seeded rows' positions
        every = self._race(weights[first:], rows, steps)  # (positions,)
        return every[stop_at - first]

    def _race(
        self, weights: torch.Tensor, rows: list[VerifyRow], steps: list[list[int]]
    ) -> torch.Tensor:
        """The winners of exponential races over (n, V) ``weights``, one row per
        (row, position j) in ``steps`` order, each on the stream of its row's position j
        (past its test uniform, for a proposal position)."""
        vocab_size = weights.shape[1]
        u = torch.empty(len(weights), vocab_size, dtype=torch.float64, device=weights.device)
        at = 0
        for row, positions in zip(rows, steps):
            for j in positions:
                generator = self._seeded_generator(row.sampling, j, weights.device)
                if j < len(row.proposal):
                    torch.rand(1, generator=generator, dtype=torch.float64, device=weights.device)
                torch.rand(vocab_size, generator=generator, out=u[at])
                at += 1
        score = torch.where(weights > 0, weights.double() / u.log_().neg_(), -1.0)
        return score.argmax(dim=1)

    def _seeded_generator(
        self, row: SamplingRow, position: int, device: torch.device
    ) -> torch.Generator:
        """A seeded row's own stream for output step len(output_ids) + position."""
        assert row.params.seed is not None
        generator = torch.Generator(device=device)
        generator.manual_seed(mix_seed(row.params.seed, len(row.output_ids) + position))
        return generator

    def _check_inputs(self, logits: torch.Tensor, rows: Sequence[VerifyRow]) -> None:
        vocab = self._sampler.vocab_size
        expected = (sum(r.num_positions for r in rows), vocab)
        if logits.dim() != 2 or tuple(logits.shape) != expected:
            raise ValueError(f"expected logits of shape {expected}, got {tuple(logits.shape)}")
        for row in rows:
            if any(not 0 <= t < vocab for t in row.proposal):
                raise ValueError(f"proposed tokens must lie in [0, {vocab}): {row.proposal}")
            q = row.draft_probs
            if q is not None and tuple(q.shape) != (len(row.proposal), vocab):
                shape = (len(row.proposal), vocab)
                raise ValueError(f"expected draft_probs of shape {shape}, got {tuple(q.shape)}")


def _is_direct(row: VerifyRow) -> bool:
    """Verified by the sampler's own draws: deterministic proposals and greedy rows."""
    return row.draft_probs is None or row.sampling.params.is_greedy


def _at_position(row: VerifyRow, j: int) -> SamplingRow:
    """The sampling row at position j: as if proposals x[:j] were already emitted."""
    if j == 0:
        return row.sampling
    outputs = row.sampling.output_ids
    if isinstance(outputs, torch.Tensor):  # a host tensor, as the scheduler keeps it
        more = torch.tensor(list(row.proposal[:j]), dtype=outputs.dtype)
        return dataclasses.replace(row.sampling, output_ids=torch.cat([outputs, more]))
    return dataclasses.replace(row.sampling, output_ids=[*outputs, *row.proposal[:j]])


def _offsets(rows: Sequence[VerifyRow]) -> list[int]:
    """Each row's first logits row."""
    offsets, total = [], 0
    for row in rows:
        offsets.append(total)
        total += row.num_positions
    return offsets


def _positions(rows: Sequence[VerifyRow], offsets: list[int], which: list[int]) -> list[int]:
    """The logits rows of rows ``which``, in order."""
    return [p for i in which for p in range(offsets[i], offsets[i] + rows[i].num_positions)]


@dataclass(frozen=True)
class _Rejection:
    """Where the drafted rows' positions lie in their (N_d, V) target distributions
    (rows back to back, in the order they were verified): n_d rows, P proposals.

    proposal_at, proposal_ids: (P,) int64 the position of each proposal, and its token.
    row_of, step_of: (N_d,) int64 which drafted row each position is, and its j.
    first: (n_d,) int64 each drafted row's first position.
    """

    proposal_at: torch.Tensor
    proposal_ids: torch.Tensor
    row_of: torch.Tensor
    step_of: torch.Tensor
    first: torch.Tensor

    @classmethod
    def of(cls, rows: list[VerifyRow]) -> _Rejection:
        proposal_at, proposal_ids, row_of, step_of, first = [], [], [], [], []
        for r, row in enumerate(rows):
            first.append(len(row_of))
            proposal_at += range(len(row_of), len(row_of) + len(row.proposal))
            proposal_ids += [int(t) for t in row.proposal]
            row_of += [r] * row.num_positions
            step_of += range(row.num_positions)
        lists = (proposal_at, proposal_ids, row_of, step_of, first)
        return cls(*(torch.tensor(x, dtype=torch.long) for x in lists))


@dataclass(frozen=True)
class _Layout:
    """A verify step's host-built index tensors, sent to the device in one copy.

    direct_at, drafted_at: (N_x,) int64 the logits rows of the directly verified and
        of the drafted rows' positions; None when that is every row in order, or no
        row is verified that way.
    rejection: the drafted rows' positions (None without drafted rows).
    """

    direct_at: torch.Tensor | None
    drafted_at: torch.Tensor | None
    rejection: _Rejection | None

    @classmethod
    def of(
        cls, rows: Sequence[VerifyRow], offsets: list[int], direct: list[int], drafted: list[int]
    ) -> _Layout:
        num_positions = sum(r.num_positions for r in rows)

        def index(which: list[int]) -> torch.Tensor | None:
            positions = _positions(rows, offsets, which)
            if not which or positions == list(range(num_positions)):
                return None
            return torch.tensor(positions, dtype=torch.long)

        rejection = _Rejection.of([rows[i] for i in drafted]) if drafted else None
        return cls(index(direct), index(drafted), rejection)


def _rows_at(t: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
    return t if index is None else t[index]


def _accepted(
    probs: torch.Tensor, q: torch.Tensor, tests: torch.Tensor, at: _Rejection
) -> torch.Tensor:
    """(n_d,) each drafted row's accepted proposals m: its first position that stops,
    a rejected proposal (u * q_j(x_j) >= p_j(x_j), in float64) or its bonus position."""
    p_x = probs[at.proposal_at, at.proposal_ids]  # (P,)
    q_x = q.gather(1, at.proposal_ids[:, None]).squeeze(1)
    stops = torch.ones(len(probs), dtype=torch.bool, device=probs.device)
    stops[at.proposal_at] = ~(tests[at.proposal_at] * q_x < p_x)
    step = torch.where(stops, at.step_of, len(probs))  # (N_d,) j where it stops
    first = torch.full_like(at.first, len(probs))
    return first.scatter_reduce_(0, at.row_of, step, "amin")


def _split_matching(
    drawn: list[int], rows: Sequence[VerifyRow], which: list[int], emitted: list[list[int]]
) -> None:
    """Fills ``emitted[i]`` for rows ``which`` from their draws at every position: the
    draws up to and including the first that differs from the proposal."""
    start = 0
    for i in which:
        proposal, n = rows[i].proposal, rows[i].num_positions
        m = 0
        while m < len(proposal) and drawn[start + m] == proposal[m]:
            m += 1
        emitted[i] = drawn[start : start + m + 1]
        start += n


def _emitted_logprobs(
    logits: torch.Tensor,
    position_rows: list[SamplingRow],
    offsets: list[int],
    emitted: list[list[int]],
) -> SampleOutput:
    """Logprobs of the emitted tokens from the raw logits at their positions."""
    positions = [offsets[i] + t for i, ids in enumerate(emitted) for t in range(len(ids))]
    tokens = [t for ids in emitted for t in ids]
    host = (torch.tensor(positions, dtype=torch.long), torch.tensor(tokens, dtype=torch.long))
    at, ids = to_device_packed(host, logits.device)  # one copy
    return with_logprobs(logits[at].float(), [position_rows[p] for p in positions], ids)
