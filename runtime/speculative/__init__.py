"""Speculative decoding's building blocks: proposals without a second model
(``NgramProposer``: prompt lookup and the radix tree's cached continuations) and
the verification of K proposals against the target's logits (``Verifier``: greedy
prefix match, rejection sampling). How they meet the scheduler: docs/speculative.md."""

from radixlm.runtime.speculative.ngram import (
    NgramConfig,
    NgramIndex,
    NgramProposer,
    Proposal,
    ProposalSource,
    cached_continuation,
)
from radixlm.runtime.speculative.verify import Verifier, VerifyOutput, VerifyRow

__all__ = [
    "NgramConfig",
    "NgramIndex",
    "NgramProposer",
    "Proposal",
    "ProposalSource",
    "Verifier",
    "VerifyOutput",
    "VerifyRow",
    "cached_continuation",
]
