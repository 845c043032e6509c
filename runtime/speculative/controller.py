"""The scheduler's side of speculation: per request, how many tokens to propose this
step (adaptive K), which ones (``NgramProposer``, or a ``DraftModel`` for all the
step's rows in one call), and how many of them its grammar lets through; after the
pass, what was accepted.

Adaptive K. Each request keeps decayed counts of the proposal positions it tried and
accepted; their ratio ``a`` (with a weak prior of one half) estimates the chance that
its next proposed token is accepted, given the ones before it were. Row r's j-th
proposal adds a_r^j expected tokens, and a pass costs what ``PassCost`` says (measured
at start-up, or 1 + c * (n - 1) one-token passes for n tokens, c =
``speculative_token_cost``), so ``plan_num_tokens`` adds proposals, best first, while
they raise the pass's expected tokens per unit of cost::

    one row,    a = 0.9, c = 0.1:  k = 4 -> 4.10 tokens for 1.4 passes
    one row,    a = 0.1, c = 0.1:  k = 0 (k = 1 would give 1.1 / 1.1 = 1.0)
    eight rows, a = 0.4, c = 0.1:  k = 0 each (8 / 1.7 per pass; one more token
                                   would add 0.4 for 0.1)

and then keeps them only if the verify pass beats the decode pass it replaces: where a
verify pass's own cost (a GPU's extend path against its graphed decode) outweighs what
the proposals save, the step proposes nothing.

At k = 0 nothing is proposed; every ``PROBE_INTERVAL``-th such step proposes one
token anyway where a row accepted ``PROBE_ACCEPTANCE`` of the time would pay, so a request whose
text turns repetitive (a JSON object after prose) gets its proposals back. Steps where
the proposer finds nothing change nothing.

Grammar. Text the grammar forces next (a JSON key, ``":"``) is proposed first, as the
tokenizer spells it (source "grammar"), then the n-gram continuation after it. The
whole proposal is walked through the matcher (and rolled back): a token the grammar
forbids ends the proposal before it; a token that completes the grammar, or after
which the grammar forces text that jump-forward appends, ends it after it (the output
processor ends the request or jumps there).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from radixlm.runtime.config import SpeculativeConfig
from radixlm.runtime.mem_cache.radix_cache import PrefixCache
from radixlm.runtime.reasoning.gate import ReasoningMatcher
from radixlm.runtime.speculative.cost import PassCost
from radixlm.runtime.speculative.draft import DraftModel, DraftRow
from radixlm.runtime.speculative.ngram import (
    NgramConfig,
    NgramIndex,
    NgramProposer,
    Proposal,
    ProposalSource,
)

if TYPE_CHECKING:
    from radixlm.runtime.constrained import JumpForward
    from radixlm.runtime.constrained.base import GrammarMatcher
    from radixlm.runtime.io.sampling_params import SamplingParams
    from radixlm.runtime.scheduling.request import Request

__all__ = [
    "PROBE_INTERVAL",
    "SpecState",
    "SpecStats",
    "Speculator",
    "best_num_tokens",
    "plan_num_tokens",
]

# while a request's K is 0, one step in this many proposes one token anyway
PROBE_INTERVAL = 16
# weight of the past in the acceptance counts, per verified step (~10 steps remembered)
DECAY = 0.9
# prior: half a position accepted of one tried (a = 0.5 before any evidence); weak
# enough that a run of rejections takes ``a`` below any cost that matters (0.5 / 11)
PRIOR_ACCEPTED, PRIOR_TRIED = 0.5, 1.0
# a probing row is planned as if accepted this often (text that turned repetitive): it
# proposes where such a row would pay, and nowhere the batch cannot pay even then
PROBE_ACCEPTANCE = 0.9


@dataclass
class SpecState:
    """One request's speculation: its history index and acceptance counts.

    max_tokens: the most tokens it may propose per step (engine K, or fewer asked).
    accepted, tried: decayed counts of accepted and tried proposal positions.
    steps_off: steps since the last proposal while its K was 0.
    """

    index: NgramIndex | None  # None: a draft model proposes
    max_tokens: int
    accepted: float = 0.0
    tried: float = 0.0
    steps_off: int = 0

    @property
    def acceptance(self) -> float:
        """Estimated chance that a proposed token is accepted (given its predecessors)."""
        return (self.accepted + PRIOR_ACCEPTED) / (self.tried + PRIOR_TRIED)


@dataclass
class SpecStats:
    """Counters of the engine's speculation (added on the loop thread).

    verify_rows: decode rows that verified at least one proposal.
    proposed, accepted: proposal tokens verified / accepted, by source name (in
        ``get_stats()``, jump-forward's forced tokens too: source "jump_forward", all
        accepted, none verified).
    accept_lengths: how many rows accepted 0, 1, ..., K tokens (index = length).
    """

    verify_rows: int = 0
    proposed: dict[str, int] = field(default_factory=dict)
    accepted: dict[str, int] = field(default_factory=dict)
    accept_lengths: list[int] = field(default_factory=list)

    @property
    def num_proposed(self) -> int:
        return sum(self.proposed.values())

    @property
    def num_accepted(self) -> int:
        return sum(self.accepted.values())

    @property
    def acceptance_rate(self) -> float:
        """Accepted proposal tokens per verified one (0 before any)."""
        return self.num_accepted / self.num_proposed if self.num_proposed else 0.0

    @property
    def mean_accept_length(self) -> float:
        """Accepted tokens per verify row (tokens emitted per row: one more)."""
        return self.num_accepted / self.verify_rows if self.verify_rows else 0.0

    def snapshot(self) -> SpecStats:
        """A copy the loop thread no longer changes."""
        return SpecStats(
            self.verify_rows, dict(self.proposed), dict(self.accepted), list(self.accept_lengths)
        )


def best_num_tokens(acceptance: float, max_tokens: int, cost: PassCost | float) -> int:
    """One request alone in its pass: the k in [0, max_tokens] with the most expected
    tokens per unit of pass cost, (1 - a^(k+1)) / (1 - a) tokens (ties: the smaller k).
    ``plan_num_tokens`` for a batch of one."""
    return plan_num_tokens([acceptance], [max_tokens], cost)[0]


def plan_num_tokens(
    acceptances: Sequence[float],
    caps: Sequence[int],
    cost: PassCost | float,
    num_tokens: int | None = None,
    expected: float | None = None,
) -> list[int]:
    """How many tokens each of a pass's decode rows proposes, for the most expected
    tokens per unit of pass time.

    Row r's j-th proposal adds acceptances[r] ** j expected tokens (every proposal before
    it accepted too). Proposals are added best first while they raise tokens per verify
    pass time: the gain must exceed ``expected * verify_per_token / verify(n)``, a bar
    that rises with the batch (one row: 0.1 at a per-token cost of 0.1; eight rows:
    ~0.47), so a big batch speculates only on rows that are accepted often. Then, when
    the pass would otherwise decode (nothing forced: ``num_tokens`` is one per row), the
    proposals stay only if the verify pass emits faster than the decode pass: none
    otherwise. None either for a batch larger than the costs were timed at
    (``PassCost.trusted``).

    Args:
        acceptances, caps: per row, its acceptance estimate and most proposals.
        cost: the pass cost model, or a per-token cost (``PassCost.per_token``).
        num_tokens, expected: the pass's tokens and expected emitted tokens before
            these proposals (default: one each per row).
    """
    model = cost if isinstance(cost, PassCost) else PassCost.per_token(cost)
    rows = len(caps)
    if not model.trusted(rows):  # a batch larger than any the costs were timed at
        return [0] * rows
    n = rows if num_tokens is None else num_tokens
    emitted = float(rows) if expected is None else expected
    decodes = n == rows
    ks = [0] * rows
    gains = [a if cap > 0 else 0.0 for a, cap in zip(acceptances, caps)]
    while True:
        best = max(range(rows), key=gains.__getitem__, default=None)
        if best is None or gains[best] <= 0.0:
            break
        gain = gains[best]
        if (emitted + gain) / model.verify(rows, n + 1) <= emitted / model.verify(rows, n) * (
            1 + 1e-9
        ):
            break
        ks[best] += 1
        n += 1
        emitted += gain
        more = ks[best] < caps[best]
        gains[best] = gain * acceptances[best] if more else 0.0
    if decodes and any(ks):
        plain = rows / model.decode(rows)
        if emitted / model.verify(rows, n) <= plain * (1 + 1e-9):
            return [0] * rows
    return ks


class Speculator:
    """Proposals for the decode rows of each pass; see the module docstring.

    Args:
        config: the engine's speculative options (``config.enabled``).
        cache: the prefix cache whose continuations the n-gram proposer reads.
        draft: the draft model (``speculative="draft"``), which then proposes instead.
        jump: tokenizes the text a request's grammar forces, proposed first (n-gram).
    """

    def __init__(
        self,
        config: SpeculativeConfig,
        cache: PrefixCache,
        draft: DraftModel | None = None,
        jump: JumpForward | None = None,
    ) -> None:
        if (config.speculative == "draft") != (draft is not None):
            raise ValueError('a draft model goes with speculative="draft", and only with it')
        self.config = config
        # the planner's pass times: the engine measures them at start-up
        # (``use_pass_cost``); until then, or without calibration, the fixed model
        self.pass_cost = PassCost.per_token(config.speculative_token_cost)
        self.stats = SpecStats()
        self._draft = draft
        self._jump = jump
        ngram = NgramConfig(
            num_tokens=config.speculative_num_tokens,
            max_ngram=config.speculative_ngram_max,
            min_ngram=config.speculative_ngram_min,
        )
        self._proposer = NgramProposer(ngram, cache)

    def use_pass_cost(self, cost: PassCost) -> None:
        """Plans every later step with ``cost`` (measured on the engine's device)."""
        self.pass_cost = cost

    def new_state(self, token_ids: Sequence[int], params: SamplingParams) -> SpecState | None:
        """A request's state, its index holding ``token_ids`` (prompt + output so far);
        None when the request asks for no speculation."""
        k = self.config.speculative_num_tokens
        if params.speculative_num_tokens is not None:
            k = min(k, params.speculative_num_tokens)
        if k <= 0 or params.max_new_tokens <= 1:
            return None
        index = None if self._draft is not None else self._proposer.new_index(token_ids)
        return SpecState(index, k)

    def propose_all(self, reqs: Sequence[Request], room: int) -> list[Proposal]:
        """What each of ``reqs`` (the pass's decoding requests, one pending token
        each) verifies this step, ``room`` tokens at most in all: text their grammars
        force first, then as many proposals each as ``plan_num_tokens`` finds worth
        their cost (every one, without adaptivity), first requests first for room."""
        caps, forced = [], []
        for req in reqs:
            cap = self._cap(req, room)
            tokens: tuple[int, ...] = ()
            if cap and self._draft is None and req.grammar is not None and self._jump:
                tokens = self._jump.forced_tokens(req.grammar, req.all_ids[-1])[:cap]
            caps.append(cap - len(tokens))
            forced.append(tokens)
            room -= cap
        ks = self._plan(reqs, caps, forced)
        if self._draft is not None:
            proposals = self._drafted(reqs, ks)
        else:
            proposals = [self._from_history(r, f, k) for r, f, k in zip(reqs, forced, ks)]
        out = []
        for req, proposal in zip(reqs, proposals):
            if req.grammar is not None and proposal.token_ids:
                proposal = _cut(proposal, _grammar_prefix(req.grammar, proposal, req.jump_forward))
            if proposal.token_ids:
                req.spec.steps_off = 0  # type: ignore[union-attr]
            out.append(proposal)
        return out

    def propose(self, req: Request, room: int) -> Proposal:
        """``propose_all`` for one request."""
        return self.propose_all([req], room)[0]

    def record(self, req: Request, proposal: Proposal, num_accepted: int) -> None:
        """A verified proposal of ``req`` had its first ``num_accepted`` tokens accepted."""
        k = proposal.num_tokens
        if k == 0:
            return
        state = req.spec
        if state is not None:
            state.accepted = state.accepted * DECAY + num_accepted
            state.tried = state.tried * DECAY + num_accepted + (num_accepted < k)
        req.num_spec_verify += 1
        req.num_spec_accepted += num_accepted
        if not req.log_metrics:
            return
        stats, source = self.stats, proposal.source.value
        stats.verify_rows += 1
        stats.proposed[source] = stats.proposed.get(source, 0) + k
        stats.accepted[source] = stats.accepted.get(source, 0) + num_accepted
        if len(stats.accept_lengths) <= num_accepted:
            stats.accept_lengths.extend([0] * (num_accepted + 1 - len(stats.accept_lengths)))
        stats.accept_lengths[num_accepted] += 1

    def release(self, req: Request) -> None:
        """``req`` gave up its KV (finished, aborted, retracted): so does the draft's."""
        if self._draft is not None:
            self._draft.release(req.rid)

    def _cap(self, req: Request, room: int) -> int:
        """The most tokens ``req`` may propose this step: its K, ``room``, and what
        ``max_new_tokens`` leaves (0 also while its grammar cannot roll back)."""
        state = req.spec
        if state is None:
            return 0
        # each verified proposal emits one more token: keep the last for the target
        remaining = req.params.max_new_tokens - len(req.output_ids) - 1
        cap = min(state.max_tokens, room, remaining)
        if cap <= 0 or (req.grammar is not None and not _can_roll_back(req.grammar)):
            return 0
        return cap

    def _from_history(self, req: Request, forced: tuple[int, ...], k: int) -> Proposal:
        """The text ``req``'s grammar forces, then up to ``k`` n-gram / radix tokens."""
        state = req.spec
        if state is None or (not forced and not k):
            return _NONE
        assert state.index is not None
        rest = self._proposer.propose(state.index, k, after=forced) if k else _NONE
        if not forced:
            return rest
        return Proposal(forced + rest.token_ids, ProposalSource.GRAMMAR)

    def _plan(
        self, reqs: Sequence[Request], caps: list[int], forced: list[tuple[int, ...]]
    ) -> list[int]:
        """Proposals per request beyond its forced text (``plan_num_tokens``); a
        request left at none proposes one every ``PROBE_INTERVAL``-th such step."""
        if not self.config.speculative_adaptive:
            return caps
        acceptances = [r.spec.acceptance if r.spec is not None else 0.0 for r in reqs]
        num_forced = sum(len(f) for f in forced)

        def plan(rates: list[float]) -> list[int]:
            n = len(reqs) + num_forced
            return plan_num_tokens(rates, caps, self.pass_cost, num_tokens=n, expected=n)

        ks = plan(acceptances)
        probing = []
        for i, req in enumerate(reqs):
            state = req.spec
            if ks[i] or not caps[i] or forced[i] or state is None:
                continue
            state.steps_off += 1
            if state.steps_off >= PROBE_INTERVAL:
                probing.append(i)
        if probing:
            # a probe proposes one token where a row that turned repetitive would pay
            rates = list(acceptances)
            for i in probing:
                rates[i] = PROBE_ACCEPTANCE
            paid = plan(rates)
            for i in probing:
                if paid[i]:
                    reqs[i].spec.steps_off = 0  # type: ignore[union-attr]
                    ks[i] = 1
        return ks

    def _drafted(self, reqs: Sequence[Request], wanted: list[int]) -> list[Proposal]:
        """The draft model's proposals for the requests that want any, in one call."""
        assert self._draft is not None
        asking = [i for i, k in enumerate(wanted) if k]
        rows = [
            DraftRow(reqs[i].rid, reqs[i].all_ids, wanted[i], reqs[i].sampling_row())
            for i in asking
        ]
        proposals = [_NONE] * len(reqs)
        for i, drafted in zip(asking, self._draft.propose(rows) if rows else []):
            if drafted.token_ids:
                proposals[i] = Proposal(drafted.token_ids, ProposalSource.DRAFT, drafted.probs)
        return proposals


_NONE = Proposal((), ProposalSource.NONE)


def _cut(proposal: Proposal, num_tokens: int) -> Proposal:
    """The first ``num_tokens`` of a proposal (its draft distributions too)."""
    if num_tokens == proposal.num_tokens:
        return proposal
    if num_tokens == 0:
        return _NONE
    probs = None if proposal.draft_probs is None else proposal.draft_probs[:num_tokens]
    return Proposal(proposal.token_ids[:num_tokens], proposal.source, probs)


def _can_roll_back(matcher: GrammarMatcher) -> bool:
    """Whether tokens accepted now can be undone: a reasoning gate rolls back only
    inside the answer."""
    return not isinstance(matcher, ReasoningMatcher) or matcher.in_answer


def _grammar_prefix(matcher: GrammarMatcher, proposal: Proposal, jump_forward: bool) -> int:
    """How long a prefix of the proposal the grammar allows, cut after a token that
    completes it or (with jump-forward) is followed by forced text; the matcher ends
    as it started."""
    kept = 0
    try:
        for token in proposal.token_ids:
            if not matcher.accept_token(token):
                break
            kept += 1
            if matcher.is_terminal() or (jump_forward and matcher.forced_string()):
                break
    finally:
        if kept:
            matcher.rollback(kept)
    return kept
