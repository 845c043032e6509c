"""Speculative decoding's building blocks: proposals without a second model
(``NgramProposer``: prompt lookup and the radix tree's cached continuations), a
draft model's, and the controller that plans each step. Verifying K proposals
against the target's logits (``Verifier``: greedy prefix match, rejection sampling)
is sampling's (radixlm.runtime.sampling.verify), as the runner does it.
How they meet the scheduler: docs/speculative.md."""

from radixlm.runtime.speculative.ngram import (
    NgramConfig,
    NgramIndex,
    NgramProposer,
    Proposal,
    ProposalSource,
    cached_continuation,
)

__all__ = [
    "NgramConfig",
    "NgramIndex",
    "NgramProposer",
    "Proposal",
    "ProposalSource",
    "cached_continuation",
]
