"""The plain data the scheduler hands the model runner, and what comes back.

``ForwardBatch`` is the only thing the runner sees: tensors and sampling rows,
no queues and no requests. ``ModelOutput`` is plain Python data the scheduler
maps back onto its requests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from radixlm.runtime.attention import AttentionInputs
from radixlm.runtime.device import counting_traffic, to_device
from radixlm.runtime.io.messages import TokenLogprob
from radixlm.runtime.sampling.sampler import SamplingRow

__all__ = ["ForwardBatch", "ModelOutput", "TokenLogprob"]


@dataclass(frozen=True)
class ForwardBatch:
    """One model pass. Filled by the scheduler; read by the runner.

    input_ids, positions: (T,) the new tokens of every request, request after request.
    attn: where those tokens' K/V go and what they attend to.
    sample_indices: (S,) flat index of the last token of each request that samples;
        with ``proposals``, (N,) every position of each sampling row's verify block.
    sampling_rows: (S) how each of those requests samples.
    proposals: None, or (S) the tokens each sampling row proposes (speculative
        decoding; () for a row without any): its last K + 1 tokens in the pass are its
        pending token and the K proposals, and each of those positions gets logits
        (``sample_indices``), which the runner verifies (radixlm.runtime.speculative).
    draft_probs: with ``proposals``, (S) each row's (K, V) draft distributions (a
        draft model's proposals, verified by rejection sampling), or None per row
        (deterministic proposals: n-gram, radix).
    return_logprobs: whether any sampling row wants its chosen token's logprob.
    prompt_logprob_indices: (P,) flat indices whose next-token logprob is wanted ...
    prompt_logprob_targets: (P,) ... for these (already known) next tokens.
    prompt_top_k: top alternatives per prompt position (max over requests).
    grammar_bitmask: (G, W) int32 allowed-token bitmask of the constrained sampling
        rows, or None when no row is constrained (no mask work at all).
    grammar_rows: (G,) which sampling rows the bitmask rows belong to (with
        ``proposals``: which logits rows, one per position of a constrained block).
    grammar_ready: waits until ``grammar_bitmask`` is filled, when its fill runs
        beside the pass (radixlm.runtime.scheduling.mask_worker); None: filled. Read
        the mask through ``grammar_mask()``; it stays on the CPU until then.
    carried_positions, carried_rows: (C,) each, or None. Overlap scheduling builds a
        pass before the host has read the previous pass's sampled ids: input token
        ``carried_positions[c]`` (a placeholder here) is the previous pass's sampled
        id ``carried_rows[c]``, filled in on the device when the pass is launched
        (``ModelRunner.launch``).
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    attn: AttentionInputs
    sample_indices: torch.Tensor
    sampling_rows: tuple[SamplingRow, ...]
    return_logprobs: bool
    prompt_logprob_indices: torch.Tensor
    prompt_logprob_targets: torch.Tensor
    prompt_top_k: int
    grammar_bitmask: torch.Tensor | None = None
    grammar_rows: torch.Tensor | None = None
    grammar_ready: Callable[[], None] | None = None
    proposals: tuple[tuple[int, ...], ...] | None = None
    draft_probs: tuple[torch.Tensor | None, ...] | None = None
    carried_positions: torch.Tensor | None = None
    carried_rows: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())

    def grammar_mask(self) -> torch.Tensor | None:
        """``grammar_bitmask`` once filled (waiting for its fill), on the batch's device.

        Raises whatever the fill raised (a grammar engine's error fails the pass)."""
        self.settle_grammar()
        if self.grammar_bitmask is None:
            return None
        return to_device(self.grammar_bitmask, self.input_ids.device)

    def settle_grammar(self) -> None:
        """Waits for a fill running beside the pass (the matchers are the scheduler's
        again once it returns)."""
        if self.grammar_ready is not None:
            self.grammar_ready()

    def to(self, device: torch.device) -> ForwardBatch:
        """This batch with every tensor on ``device``: ``self`` when it is there
        already (the scheduler makes every tensor of a batch on one device), unless
        device traffic is being counted."""
        if self.input_ids.device == device and not counting_traffic():
            return self

        def move(t: torch.Tensor) -> torch.Tensor:
            return to_device(t, device)  # to a GPU: pinned, without waiting

        def move_optional(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else move(t)

        return replace(
            self,
            input_ids=move(self.input_ids),
            positions=move(self.positions),
            attn=self.attn.to(device),
            sample_indices=move(self.sample_indices),
            prompt_logprob_indices=move(self.prompt_logprob_indices),
            prompt_logprob_targets=move(self.prompt_logprob_targets),
            # a mask still being filled moves when it is read (grammar_mask)
            grammar_bitmask=(
                move_optional(self.grammar_bitmask)
                if self.grammar_ready is None
                else self.grammar_bitmask
            ),
            grammar_rows=move_optional(self.grammar_rows),
            carried_positions=move_optional(self.carried_positions),
            carried_rows=move_optional(self.carried_rows),
        )

    def with_carried(self, previous_ids: torch.Tensor | None) -> ForwardBatch:
        """This batch (on the device) with its carried input tokens filled in from
        ``previous_ids``, the previous pass's (S,) sampled ids on the device."""
        if self.carried_positions is None:
            return self
        assert previous_ids is not None, "a pass that carries ids needs the previous pass's"
        input_ids = self.input_ids.clone()
        input_ids[self.carried_positions] = previous_ids[self.carried_rows]
        return replace(self, input_ids=input_ids)


@dataclass(frozen=True)
class ModelOutput:
    """next_token_ids: (S) sampled ids; logprobs: (S) entries when asked, else empty;
    prompt_logprobs: (P) entries, in ``prompt_logprob_indices`` order.

    With proposals (speculative decoding): accepted_ids: (S) the proposals each row
    accepted, which come before its ``next_token_ids`` entry; accepted_logprobs: (S)
    their entries when asked. Both empty without proposals."""

    next_token_ids: list[int]
    logprobs: list[TokenLogprob]
    prompt_logprobs: list[TokenLogprob]
    accepted_ids: list[list[int]] = field(default_factory=list)
    accepted_logprobs: list[list[TokenLogprob]] = field(default_factory=list)
