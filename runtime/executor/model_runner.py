"""Runs one ``ForwardBatch`` through the model and samples the next tokens.

The runner never sees a queue or a request: it gets tensors and sampling rows
from the scheduler and returns plain results.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixlm.runtime.attention import AttentionBackend
from radixlm.runtime.device import start_to_host, to_host
from radixlm.runtime.errors import RankFailedError
from radixlm.runtime.executor.compiled_decode import CompiledDecode
from radixlm.runtime.executor.cpu_threads import release_free_memory
from radixlm.runtime.executor.cuda_graph import DecodeGraphs
from radixlm.runtime.executor.forward_batch import ForwardBatch, ModelOutput, TokenLogprob
from radixlm.runtime.executor.small_batch import SmallBatchForward
from radixlm.runtime.sampling.sampler import Sampler
from radixlm.runtime.sampling.verify import Verifier, VerifyRow

if TYPE_CHECKING:
    from radixlm.runtime.distributed.ranks import TensorParallelRanks

__all__ = ["ModelRunner", "PassCounts", "PendingOutput"]


@dataclass(frozen=True)
class PassCounts:
    """How many model passes took each forward path since the engine started.

    few_rows: through the C++ few-row kernels (``cpu_layer_kernels``), of which
        few_rows_whole_step were decode passes run whole in one C++ call;
    graphed: replayed from a captured CUDA graph (decode passes on a GPU);
    compiled: through the compiled decode step (``enable_torch_compile``);
    eager: through the eager model (every other pass).
    """

    few_rows: int = 0
    few_rows_whole_step: int = 0
    graphed: int = 0
    compiled: int = 0
    eager: int = 0


class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        attn_backend: AttentionBackend,
        sampler: Sampler,
        compiled_decode: CompiledDecode | None = None,
        small_batch: SmallBatchForward | None = None,
        decode_graphs: DecodeGraphs | None = None,
        tensor_parallel: TensorParallelRanks | None = None,
    ):
        """Each pass takes the first of these that accepts it, else the eager model:
        small_batch: the passes of a few tokens (C++ kernels, CPU);
        decode_graphs: decode passes replayed from CUDA graphs (GPU);
        compiled_decode: decode passes through ``torch.compile`` (``enable_torch_compile``).

        tensor_parallel: ``model`` is rank 0's shard; each pass (eager: the others are
        off under tensor parallelism) is sent to the other ranks first, and any failure
        of a pass is a ``RankFailedError`` (the ranks may be out of step)."""
        self.model = model
        self.attn_backend = attn_backend
        self.sampler = sampler
        self.verifier = Verifier(sampler)  # passes with proposals (speculative decoding)
        self.compiled_decode = compiled_decode
        self.small_batch = small_batch
        self.decode_graphs = decode_graphs
        self.tensor_parallel = tensor_parallel
        self.device = _device_of(model)
        self.num_eager_passes = 0
        self._closed_counts: PassCounts | None = None  # set by close

    def run(self, batch: ForwardBatch) -> ModelOutput:
        """Runs a pass and waits for its results."""
        return self.launch(batch).result()

    @torch.inference_mode()
    def launch(self, batch: ForwardBatch, previous: PendingOutput | None = None) -> PendingOutput:
        """Starts a pass: on a GPU its kernels and the copies of its results are queued
        and the host may go on (``PendingOutput.result`` waits); on the CPU it runs now.

        previous: the pass launched before this one, whose sampled ids on the device
            fill the input tokens this one carries (``ForwardBatch.carried_positions``).
        """
        previous_ids = None if previous is None else previous.next_token_ids
        # the one place a pass moves to the model's device
        batch = batch.to(self.device).with_carried(previous_ids)
        try:
            hidden = self._forward(batch)  # (S+P, hidden)
            num_sampled = batch.sample_indices.numel()
            if batch.proposals is not None:  # verified now: speculation never runs ahead
                output = self._verified(hidden, num_sampled, batch)
                return PendingOutput(None, lambda: output)
            sampled = self._sample(hidden[:num_sampled], batch)
            prompt = self._prompt_logprobs(hidden[num_sampled:], batch)
            # the step's results cross to the host together: one wait on a GPU
            copy = start_to_host(*sampled, *prompt)
            nums = [r.top_logprobs_num for r in batch.sampling_rows]
            top_k = batch.prompt_top_k
            return PendingOutput(
                sampled[0] if sampled else None,
                lambda: _read_output(copy.wait(), len(sampled), nums, top_k),
            )
        except RankFailedError:
            raise
        except Exception as exc:
            if self.tensor_parallel is not None:  # the ranks may be out of step now
                raise RankFailedError(f"tensor parallel: a pass failed on rank 0: {exc!r}") from exc
            raise
        finally:  # a failed pass too hands the grammar matchers back only once filled
            batch.settle_grammar()

    def _verified(self, hidden: torch.Tensor, num_sampled: int, batch: ForwardBatch) -> ModelOutput:
        """A pass with proposals, verified; its results on the host."""
        next_ids, logprobs, *accepted = self._verify(hidden[:num_sampled], batch)
        prompt = self._prompt_logprobs(hidden[num_sampled:], batch)
        prompt_logprobs = _prompt_entries(to_host(*prompt), batch.prompt_top_k) if prompt else []
        return ModelOutput(next_ids, logprobs, prompt_logprobs, *accepted)

    def _forward(self, batch: ForwardBatch) -> torch.Tensor:
        """The hidden states of the rows that get logits: the sampling ones, then the
        prompt-logprob ones."""
        rows = batch.sample_indices
        if batch.prompt_logprob_indices.numel():
            rows = torch.cat((rows, batch.prompt_logprob_indices))
        small, graphs, compiled = self.small_batch, self.decode_graphs, self.compiled_decode
        if small is not None and small.accepts(batch):
            return small.run(batch)[rows]
        if graphs is not None and graphs.accepts(batch):
            return graphs.run(batch)[rows]
        if compiled is not None and compiled.accepts(batch):
            return compiled.run(batch)[rows]
        if self.tensor_parallel is not None:  # the same pass on every rank
            num_sampled = batch.sample_indices.numel() if batch.sampling_rows else 0
            logit_rows = (num_sampled, batch.prompt_logprob_indices.numel())
            self.tensor_parallel.send_pass(batch, rows, logit_rows)
        metadata = self.attn_backend.prepare(batch.attn)
        self.num_eager_passes += 1
        return self.model(batch.input_ids, batch.positions, metadata, rows)

    def close(self) -> None:
        """Drops the model, its attention backend (the KV pool) and the forward paths
        and hands their memory back now: no pass runs after this; the pass counts
        stay. Not whenever the collector finds them (the runtime's parts refer to each
        other), and not kept by the allocator (the C heap keeps freed memory:
        cpu_threads; CUDA's caching allocator keeps its blocks)."""
        self._closed_counts = self.pass_counts()
        if self.tensor_parallel is not None:
            self.tensor_parallel.stop()
        self.model = self.attn_backend = None  # type: ignore[assignment]
        self.compiled_decode = self.small_batch = self.decode_graphs = None
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        else:
            release_free_memory()

    def pass_counts(self) -> PassCounts:
        if self._closed_counts is not None:
            return self._closed_counts
        small, graphs, compiled = self.small_batch, self.decode_graphs, self.compiled_decode
        return PassCounts(
            few_rows=small.passes if small else 0,
            few_rows_whole_step=small.whole_steps if small else 0,
            graphed=graphs.passes if graphs else 0,
            compiled=compiled.passes if compiled else 0,
            eager=self.num_eager_passes,
        )

    def _sample(self, hidden: torch.Tensor, batch: ForwardBatch) -> tuple[torch.Tensor, ...]:
        """hidden: (S, hidden), the sampling rows'. The results on the device: (ids,),
        or (ids, logprobs, *top) when a row wants logprobs; () without sampling rows."""
        if not batch.sampling_rows:
            return ()
        logits = self.model.compute_logits(hidden)  # (S, V) float32
        out = self.sampler.sample(
            logits,
            batch.sampling_rows,
            batch.return_logprobs,
            grammar_bitmask=batch.grammar_mask(),  # waits for a fill beside the pass
            grammar_rows=batch.grammar_rows,
        )
        if out.logprobs is None:
            return (out.next_token_ids,)
        return (out.next_token_ids, out.logprobs, *(out.top_logprobs or ()))

    def _verify(
        self, hidden: torch.Tensor, batch: ForwardBatch
    ) -> tuple[list[int], list, list[list[int]], list[list]]:
        """hidden: (N, hidden), every position of every sampling row's verify block.
        Returns each row's next token and its logprob entry, then its accepted
        proposals and theirs."""
        assert batch.proposals is not None
        logits = self.model.compute_logits(hidden)  # (N, V) float32
        draft_probs = batch.draft_probs or (None,) * len(batch.proposals)
        rows = [
            VerifyRow(r, p, q)
            for r, p, q in zip(batch.sampling_rows, batch.proposals, draft_probs, strict=True)
        ]
        out = self.verifier.verify(
            logits,
            rows,
            batch.return_logprobs,
            grammar_bitmask=batch.grammar_mask(),  # waits for a fill beside the pass
            grammar_rows=batch.grammar_rows,
        )
        next_ids = [ids[-1] for ids in out.token_ids]
        accepted = [ids[:-1] for ids in out.token_ids]
        if out.logprobs is None:
            return next_ids, [], accepted, []
        nums = [
            r.top_logprobs_num for r, ids in zip(batch.sampling_rows, out.token_ids) for _ in ids
        ]
        logprobs_out = out.logprobs
        top = logprobs_out.top_logprobs or ()
        assert logprobs_out.logprobs is not None
        flat = _logprob_entries(
            to_host(logprobs_out.next_token_ids, logprobs_out.logprobs, *top), nums
        )
        logprobs, accepted_logprobs, start = [], [], 0
        for ids in out.token_ids:
            entries = flat[start : start + len(ids)]
            start += len(ids)
            logprobs.append(entries[-1])
            accepted_logprobs.append(entries[:-1])
        return next_ids, logprobs, accepted, accepted_logprobs

    def _prompt_logprobs(
        self, hidden: torch.Tensor, batch: ForwardBatch
    ) -> tuple[torch.Tensor, ...]:
        """hidden: (P, hidden), the prompt-logprob rows'. On the device: (chosen
        logprobs, targets, *top), () when no prompt logprob is wanted."""
        if batch.prompt_logprob_indices.numel() == 0:
            return ()
        logits = self.model.compute_logits(hidden)  # (P, V)
        logprobs = torch.log_softmax(logits, dim=-1)
        targets = batch.prompt_logprob_targets
        k = batch.prompt_top_k
        top = torch.topk(logprobs, k, dim=-1) if k else ()
        return (logprobs.gather(1, targets[:, None])[:, 0], targets, *top)


class PendingOutput:
    """A launched pass: its sampled ids on the device (what the next pass may carry,
    None for a pass that samples nothing or verifies proposals) and its results on
    their way to the host (``result`` waits for them, once)."""

    def __init__(self, next_token_ids: torch.Tensor | None, read: Callable[[], ModelOutput]):
        self.next_token_ids = next_token_ids
        self._read: Callable[[], ModelOutput] | None = read
        self._output: ModelOutput | None = None

    def result(self) -> ModelOutput:
        if self._output is None:
            assert self._read is not None
            self._output, self._read = self._read(), None
        return self._output


def _read_output(
    host: tuple[torch.Tensor, ...], num_sampled: int, nums: list[int], top_k: int
) -> ModelOutput:
    """A pass's results from its host tensors: the first ``num_sampled`` are the
    sampling rows' (ids, then logprobs and top pairs when asked), the rest the prompt
    logprobs' (``nums``: top pairs each sampling row keeps)."""
    sampled, prompt = host[:num_sampled], host[num_sampled:]
    prompt_logprobs = _prompt_entries(prompt, top_k) if prompt else []
    if not sampled:
        return ModelOutput([], [], prompt_logprobs)
    if len(sampled) == 1:
        return ModelOutput(sampled[0].tolist(), [], prompt_logprobs)
    entries = _logprob_entries(sampled, nums)
    return ModelOutput([token for _, token, _ in entries], entries, prompt_logprobs)


def _prompt_entries(host: tuple[torch.Tensor, ...], top_k: int) -> list[TokenLogprob]:
    """(chosen logprob, target, top pairs) per prompt position, from
    ``_prompt_logprobs``' tensors on the host."""
    chosen, targets, *top = host
    tops = _top_pairs((top[0], top[1]) if top else None, [top_k] * chosen.numel())
    return list(zip(chosen.tolist(), targets.tolist(), tops))


def _logprob_entries(host: tuple[torch.Tensor, ...], nums: list[int]) -> list[TokenLogprob]:
    """(logprob, token id, top pairs) of each row of a sampling result with logprobs
    on the host ((ids, logprobs, *top)), row i keeping ``nums[i]`` top pairs."""
    ids, logprobs, *top = host
    tops = _top_pairs((top[0], top[1]) if top else None, nums)
    return list(zip(logprobs.tolist(), ids.tolist(), tops))


def _device_of(model: torch.nn.Module) -> torch.device:
    """The device of the model's weights (the CPU for a model without any)."""
    weight = next(model.parameters(), None)
    return torch.device("cpu") if weight is None else weight.device


def _top_pairs(
    top: tuple[torch.Tensor, torch.Tensor] | None, nums: list[int]
) -> list[list[tuple[float, int]]]:
    """Per row, the first ``nums[i]`` (logprob, token id) pairs of a (B, K) top-k result."""
    if top is None:
        return [[] for _ in nums]
    values, ids = top[0].tolist(), top[1].tolist()
    return [list(zip(v[:n], i[:n])) for v, i, n in zip(values, ids, nums)]
