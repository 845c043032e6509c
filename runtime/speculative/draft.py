"""A draft model: a small second model that proposes K tokens per request, with the
distribution q each token was drawn from, for rejection sampling (``VerifyRow``'s
``draft_probs``; radixlm.runtime.sampling.verify).

The draft has its own KV pool, slot allocator and ``req_to_token`` table, built as the
target's are (``build_model_shard``: radixlm.runtime.executor.model_shard). Its pool
stores K/V in the target's format (``kv_cache_dtype``, passed by the engine's
assembly): a quantized target's draft is quantized too, for the same memory trade;
any format works, as the verifier's rejection sampling keeps the target's
distribution whatever q the draft proposes from. Per request
id it holds the KV of a prefix of that request's sequence; each ``propose`` first cuts
what it holds back to the longest common prefix with the sequence the target has now,
which is how it follows accepted tokens, rejected proposals, jump-forward rewrites and
retractions without being told about any of them::

    held         [ p0 p1 p2 t  x0 x1 ]      after the last propose (x: its proposals)
    token_ids    [ p0 p1 p2 t  x0 y1 ]      target accepted x0, then emitted y1 (pending)
    kept         [ p0 p1 p2 t  x0 ]         common prefix; x1's slot freed
    extend       [ y1 ]                     one batched extend over every row's missing
                                            tokens (at least the last one: its logits
                                            give q_0), positions len(kept) ..
    decode j=1.. [ x'_{j-1} ]               K - 1 batched decode steps: x'_j ~ q_j
    held         [ p0 p1 p2 t  x0 y1 x'0 .. x'_{K-2} ]   (x'_{K-1} has no KV yet)

q_j is the draft's logits put through the target's sampling rules
(``Verifier.target_probs``: penalties and min_new_tokens seeing ``output_ids`` plus
the tokens drafted before j, temperature, top-k, top-p, min-p; greedy rows one-hot on
the argmax). Grammar masks are not applied: the speculator walks the proposal through
the matcher afterwards and cuts it at a forbidden token, and rejection sampling stays
exact for any q that x was really drawn from.

Draws: a seeded row draws x_j from its own generator keyed by (seed, output step
len(output_ids) + j), on a stream salted apart from the verifier's (which keys its
acceptance uniforms by the same pair: sharing them would correlate x_j with its own
acceptance test); other rows draw from the draft's generator, seeded once.

Host and device: each pass's inputs cross in one copy, and each draw is read back in
one ``to_host`` (the host feeds x_j to the next pass and to the penalties that see it).

Pool pressure: a row needs ``missing + K - 1`` slots; when they are not free, the
least recently used request ids outside the call lose their KV; a row that still
cannot fit its missing tokens proposes nothing, one that fits them proposes fewer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from radixlm.runtime.attention import AttentionInputs
from radixlm.runtime.config import ConfigError, EngineConfig
from radixlm.runtime.device import to_device_packed, to_host
from radixlm.runtime.errors import RadixLMError
from radixlm.runtime.executor.model_shard import ModelShard, build_model_shard
from radixlm.runtime.models.build import resolve_model
from radixlm.runtime.sampling.sampler import Sampler, SamplingRow, draw, mix_seed
from radixlm.runtime.sampling.verify import Verifier
from radixlm.runtime.speculative.draft_kv import DraftHoldings, Held, Plan

__all__ = ["DraftModel", "DraftProposal", "DraftRow", "DraftRowError"]

# salts a seeded row's draft stream apart from the verifier's (seed, step) stream
_DRAFT_STREAM = 0x5D2AF7


class DraftRowError(RadixLMError, ValueError):
    """A ``DraftRow`` the draft cannot take (no tokens, K < 1, a token out of the
    vocabulary, a request id twice in one call)."""


@dataclass(frozen=True)
class DraftRow:
    """One request to propose for.

    Attributes:
        rid: the target request's id (the draft keeps its KV under it).
        token_ids: the request's whole sequence now (prompt + output); the last one
            is the pending token (sampled, no KV in the target yet).
        num_tokens: K, how many tokens to propose (>= 1).
        sampling: the request's sampling row, as the target's batch builder makes it
            (``output_ids``: without any proposal; ``prompt_ids``: the prompt, which
            the repetition penalty reads).
    """

    rid: str
    token_ids: Sequence[int]
    num_tokens: int
    sampling: SamplingRow


@dataclass(frozen=True)
class DraftProposal:
    """What the draft proposes for one row.

    Attributes:
        token_ids: the K proposed tokens (fewer, or none, only when the draft's pool,
            table rows or context length ran out).
        probs: (len(token_ids), V) float32 on the draft's device: row j is the
            distribution token j was drawn from (one-hot on the argmax for greedy rows).
    """

    token_ids: tuple[int, ...]
    probs: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


class DraftModel:
    """A draft model with its own KV memory, keyed by the target's request ids.

    Build it with ``load``. Not thread-safe: the scheduler's thread calls it.
    """

    def __init__(self, shard: ModelShard, seed: int = 0) -> None:
        self._shard = shard
        self._model = shard.model
        self._backend = shard.backend
        self._kv = DraftHoldings(shard.req_to_token, shard.pool.num_slots, shard.context_len)
        self._table = shard.req_to_token
        self._device = self._table.table.device
        self.vocab_size = shard.arch.vocab_size
        self.context_len = shard.context_len
        # target_probs is the sampler's stages; the verifier's own streams go unused
        self._verifier = Verifier(Sampler(self.vocab_size, seed=seed), seed)
        self._generator = torch.Generator(device=self._device).manual_seed(seed)

    @classmethod
    def load(
        cls,
        model_path: str,
        target_vocab_size: int,
        dtype: str,
        max_total_tokens: int,
        device: str = "cpu",
        seed: int = 0,
        **engine_options: Any,
    ) -> DraftModel:
        """Loads the draft as the engine loads its target.

        Args:
            model_path: the draft's model directory (or GGUF file).
            target_vocab_size: the target's vocabulary size; the draft's must equal it.
            dtype, max_total_tokens, device: the draft's engine options (its KV pool
                holds ``max_total_tokens`` tokens).
            seed: seeds the stream unseeded rows draw from.
            engine_options: further engine options for the draft (``EngineConfig``
                names: ``max_running_requests`` sizes its table, ``attention_backend``,
                ``cpu_layer_kernels``, ``context_length``, ...).

        Raises:
            ConfigError: the vocabularies differ (both sizes named) or an option is bad.
            ModelLoadError: the draft's files are missing or unreadable.
        """
        config = EngineConfig.from_kwargs(
            model_path=model_path,
            dtype=dtype,
            max_total_tokens=max_total_tokens,
            device=device,
            random_seed=seed,
            **engine_options,
        )
        source, arch, resolved = resolve_model(config)
        if arch.vocab_size != target_vocab_size:
            raise ConfigError(
                f"the draft model's vocabulary has {arch.vocab_size} tokens, the target's "
                f"{target_vocab_size}: a draft must share the target's vocabulary"
            )
        return cls(build_model_shard(config, source, arch, resolved), seed)

    @property
    def capacity(self) -> int:
        """KV slots in the draft's pool (the padding slot aside)."""
        return self._kv.capacity

    @property
    def num_free_slots(self) -> int:
        return self._kv.num_free_slots

    def held_token_ids(self, rid: str) -> tuple[int, ...]:
        """The tokens whose KV the draft holds for ``rid`` (empty: none)."""
        return self._kv.held_token_ids(rid)

    def release(self, rid: str) -> None:
        """Frees ``rid``'s KV and table row (the request finished, was aborted or
        retracted); an id the draft holds nothing for is ignored."""
        self._kv.release(rid)

    @torch.inference_mode()
    def propose(self, rows: Sequence[DraftRow]) -> list[DraftProposal]:
        """Proposes up to ``row.num_tokens`` tokens for each row, in one extend pass
        and K - 1 decode passes over all rows (see the module docstring).

        Returns:
            one proposal per row, in order.

        Raises:
            DraftRowError: a row without tokens, with K < 1, with a token outside the
                vocabulary, or a request id twice.
        """
        self._check_rows(rows)
        self._kv.tick()
        batch = {row.rid for row in rows}
        plans = []
        for i, row in enumerate(rows):
            plan = self._kv.plan(i, row, batch)
            if plan is not None:
                plans.append(plan)
        try:
            if plans:
                self._draft(plans, rows)
        except BaseException:  # a failed pass: drop the rows' KV, leak no slot
            for plan in plans:
                self._kv.drop(plan)
            raise
        empty = DraftProposal((), torch.zeros((0, self.vocab_size), device=self._device))
        proposals = [empty] * len(rows)
        for plan in plans:
            proposals[plan.index] = DraftProposal(tuple(plan.drafted), torch.stack(plan.probs))
        return proposals

    def _draft(self, plans: list[Plan], rows: Sequence[DraftRow]) -> None:
        """The extend pass, then a draw and a decode pass per further token."""
        logits = self._forward([(p.held, p.token_ids[p.start :]) for p in plans])
        active = plans
        for _ in range(max(p.num_tokens for p in plans)):
            sampling = [_drafted_row(rows[p.index].sampling, p.drafted) for p in active]
            q = self._verifier.target_probs(logits, sampling)  # (B, V)
            tokens = self._draw(q, sampling)
            for p, token, q_row in zip(active, tokens, q):
                p.drafted.append(token)
                p.probs.append(q_row)
            active = [p for p in active if len(p.drafted) < p.num_tokens]
            if not active:
                return
            logits = self._forward([(p.held, [p.drafted[-1]]) for p in active])

    def _forward(self, segments: list[tuple[Held, list[int]]]) -> torch.Tensor:
        """One pass computing each segment's tokens after what its ``Held`` holds
        (their slots are in the table already); (B, V) logits after each segment's
        last token. Appends the tokens to what each ``Held`` holds."""
        starts = [len(held.token_ids) for held, _ in segments]
        lens = [len(tokens) for _, tokens in segments]
        slots = [
            self._table.read(held.row, start + n)[start:]
            for (held, _), start, n in zip(segments, starts, lens)
        ]
        positions = [torch.arange(start, start + n) for start, n in zip(starts, lens)]
        input_ids = [t for _, tokens in segments for t in tokens]
        host = (
            torch.tensor([held.row for held, _ in segments], dtype=torch.long),
            torch.tensor(starts, dtype=torch.long),
            torch.tensor(lens, dtype=torch.long),
            torch.cat(slots),
            torch.tensor(lens, dtype=torch.long).cumsum(0) - 1,  # (B,) flat index of each end
            torch.tensor(input_ids, dtype=torch.long),
            torch.cat(positions),
        )
        rows, prefix_lens, extend_lens, slots_at, last, ids, at = to_device_packed(
            host, self._device
        )  # the pass's one copy
        attn = AttentionInputs(rows, prefix_lens, extend_lens, slots_at, max(lens))
        metadata = self._backend.prepare(attn)
        hidden = self._model(ids, at, metadata, last)  # (B, hidden)
        for held, tokens in segments:
            held.token_ids.extend(tokens)
        return self._model.compute_logits(hidden)  # (B, V) float32

    def _draw(self, q: torch.Tensor, rows: list[SamplingRow]) -> list[int]:
        """x_i ~ q[i] for each row: greedy rows take the argmax (q is one-hot), seeded
        rows race on their own stream, the others share the draft's generator. The
        tokens are read back in one ``to_host``."""
        tokens = q.argmax(dim=-1)  # (B,)
        sampled = [i for i, r in enumerate(rows) if not r.params.is_greedy]
        if sampled:
            self._draw_sampled(q, rows, sampled, tokens)
        (host,) = to_host(tokens)  # the draw's one wait
        return host.tolist()

    def _draw_sampled(
        self, q: torch.Tensor, rows: list[SamplingRow], sampled: list[int], tokens: torch.Tensor
    ) -> None:
        """Writes the draws of rows ``sampled`` into ``tokens``; their indices cross in
        one copy."""
        shared = [i for i in sampled if rows[i].params.seed is None]
        seeded = [i for i in sampled if rows[i].params.seed is not None]
        host = (torch.tensor(shared, dtype=torch.long), torch.tensor(seeded, dtype=torch.long))
        shared_at, seeded_at = to_device_packed(host, q.device)
        if shared:
            u = torch.rand(
                len(shared), generator=self._generator, dtype=torch.float64, device=q.device
            )
            tokens[shared_at] = draw(q.index_select(0, shared_at), u)
        if seeded:
            tokens[seeded_at] = torch.stack([self._race(q[i], rows[i]) for i in seeded])

    def _race(self, weights: torch.Tensor, row: SamplingRow) -> torch.Tensor:
        """The winner of an exponential race over (V,) ``weights`` on the row's own
        seeded stream (a 0-d tensor on their device)."""
        assert row.params.seed is not None
        step = len(row.output_ids)  # includes the tokens drafted so far
        seed = mix_seed(mix_seed(row.params.seed, step), _DRAFT_STREAM)
        gen = torch.Generator(device=weights.device).manual_seed(seed)
        u = torch.rand(weights.shape[0], generator=gen, dtype=torch.float64, device=weights.device)
        score = torch.where(weights > 0, weights.double() / u.log_().neg_(), -1.0)
        return score.argmax()

    def _check_rows(self, rows: Sequence[DraftRow]) -> None:
        seen: set[str] = set()
        for row in rows:
            if row.rid in seen:
                raise DraftRowError(f"request id {row.rid!r} appears twice in one propose call")
            seen.add(row.rid)
            if not row.token_ids:
                raise DraftRowError(f"row {row.rid!r} has no tokens")
            if row.num_tokens < 1:
                raise DraftRowError(
                    f"row {row.rid!r}: num_tokens must be >= 1, got {row.num_tokens}"
                )
            if not all(0 <= t < self.vocab_size for t in row.token_ids):
                raise DraftRowError(
                    f"row {row.rid!r}: token ids must lie in [0, {self.vocab_size})"
                )


def _drafted_row(row: SamplingRow, drafted: list[int]) -> SamplingRow:
    """The sampling row as if the tokens drafted so far were emitted (penalties,
    min_new_tokens and the seeded stream's step see them)."""
    if not drafted:
        return row
    outputs = row.output_ids
    if isinstance(outputs, torch.Tensor):  # a host tensor, as the scheduler keeps it
        more = torch.tensor(drafted, dtype=outputs.dtype)
        return dataclasses.replace(row, output_ids=torch.cat([outputs, more]))
    return dataclasses.replace(row, output_ids=[*outputs, *drafted])
