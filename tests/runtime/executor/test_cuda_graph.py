"""CUDA-graph decode (``DecodeGraphs``) on the CPU: the same buffers, padding, ladder and
runner choice as on a GPU, with ``EagerReplay`` in place of the recording. The
Triton backend runs through Triton's interpreter (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from radixlm.runtime.attention import AttentionInputs, TorchAttentionBackend
from radixlm.runtime.attention.triton import TritonAttentionBackend
from radixlm.runtime.executor.cuda_graph import DecodeGraphs, EagerReplay, graph_batch_sizes
from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.io.sampling_params import SamplingParams
from radixlm.runtime.mem_cache.kv_pool import PAD_SLOT, KVPool, ReqToTokenTable
from radixlm.runtime.models import ArchConfig, load_model, write_random_model
from radixlm.runtime.sampling.sampler import Sampler, SamplingRow
from tests.runtime.models.helpers import TINY

CONFIG = TINY  # head dim 16
PROMPTS = [[5, 9, 14], [7, 3, 3, 8, 20, 1], [11], [4, 4, 30, 2, 6]]


def test_the_ladder() -> None:
    assert graph_batch_sizes(1) == (1,)
    assert graph_batch_sizes(6) == (1, 2, 4, 6)
    assert graph_batch_sizes(32) == (1, 2, 4, 8, 16, 24, 32)
    assert graph_batch_sizes(36) == (1, 2, 4, 8, 16, 24, 32, 36)
    assert graph_batch_sizes(256)[-3:] == (240, 248, 256)
    assert graph_batch_sizes(300)[-6:] == (240, 248, 256, 272, 288, 300)
    sizes = graph_batch_sizes(512)
    assert len(sizes) == 4 + 31 + 16 and sizes[-1] == 512
    gaps = [b - a for a, b in zip(sizes, sizes[1:], strict=False)]
    assert max(gaps[: sizes.index(256)]) == 8 and max(gaps) == 16
    with pytest.raises(ValueError, match="max_batch_size"):
        graph_batch_sizes(0)


class _Harness:
    """A tiny random model on the Triton backend, with ``PROMPTS`` prefilled."""

    def __init__(self, model_dir: Path) -> None:
        arch = ArchConfig.from_model_dir(model_dir)
        self.pool = KVPool(arch.num_layers, 128, arch.num_kv_heads, arch.head_dim, torch.float32)
        self.pool.k[:, 1:].zero_()  # defined contents: pools are compared bit for bit
        self.pool.v[:, 1:].zero_()
        self.table = ReqToTokenTable(len(PROMPTS), 64)
        self.backend = TritonAttentionBackend(self.pool, self.table, arch.attention_scale)
        self.model = load_model(model_dir, self.backend, torch.float32, config=arch)
        self.next_slot = 1
        self.lens: list[int] = []
        ids, positions, slots = [], [], []
        for row, prompt in enumerate(PROMPTS):
            new = self._slots(row, 0, len(prompt))
            ids += prompt
            positions += range(len(prompt))
            slots.append(new)
            self.lens.append(len(prompt))
        inputs = AttentionInputs(
            torch.arange(len(PROMPTS)),
            torch.zeros(len(PROMPTS), dtype=torch.int64),
            torch.tensor([len(p) for p in PROMPTS]),
            torch.cat(slots),
        )
        with torch.inference_mode():
            self.model(torch.tensor(ids), torch.tensor(positions), self.backend.prepare(inputs))

    def _slots(self, row: int, start: int, n: int) -> torch.Tensor:
        slots = torch.arange(self.next_slot, self.next_slot + n)
        self.next_slot += n
        self.table.write(row, start, slots)
        return slots

    def decode_batch(self, rows: list[int]) -> ForwardBatch:
        """The next decode pass of ``rows`` (token id 10 + row each)."""
        slots = torch.cat([self._slots(r, self.lens[r], 1) for r in rows])
        prefix = torch.tensor([self.lens[r] for r in rows])
        for r in rows:
            self.lens[r] += 1
        inputs = AttentionInputs(
            torch.tensor(rows), prefix, torch.ones(len(rows), dtype=torch.int64), slots, 1
        )
        none = torch.zeros(0, dtype=torch.int64)
        ids = torch.tensor([10 + r for r in rows])
        return ForwardBatch(
            ids, prefix.clone(), inputs, torch.arange(len(rows)), (), False, none, none, 0
        )

    def eager(self, batch: ForwardBatch) -> torch.Tensor:
        with torch.inference_mode():
            metadata = self.backend.prepare(batch.attn)
            return self.model(batch.input_ids, batch.positions, metadata)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_random_model(tmp_path_factory.mktemp("tiny"), CONFIG, torch.float32)


def _padded(batch: ForwardBatch, size: int) -> ForwardBatch:
    """``batch`` with padding rows up to ``size``, laid out as DecodeGraphs pads."""
    pad = size - batch.attn.rows.numel()

    def extend(t: torch.Tensor, value: int) -> torch.Tensor:
        return torch.cat((t, torch.full((pad,), value, dtype=t.dtype)))

    attn = batch.attn
    inputs = AttentionInputs(
        extend(attn.rows, 0),
        extend(attn.prefix_lens, 0),
        extend(attn.extend_lens, 1),
        extend(attn.out_cache_loc, PAD_SLOT),
        1,
    )
    none = batch.prompt_logprob_indices
    return ForwardBatch(
        extend(batch.input_ids, 0),
        extend(batch.positions, 0),
        inputs,
        none,
        (),
        False,
        none,
        none,
        0,
    )


@pytest.mark.parametrize("rows", [[1, 3], [0, 1, 2]], ids=["a captured size", "padded 3 -> 4"])
def test_a_replay_computes_what_the_eager_pass_of_its_padded_batch_does(model_dir, rows) -> None:
    """Same hidden states for the real rows, same pool afterwards: the real rows'
    K/V in their slots, the padding rows' in the padding slot alone."""
    h = _Harness(model_dir)
    graphs = DecodeGraphs(h.model, h.backend, (1, 2, 4), EagerReplay())
    before = h.pool.k.clone(), h.pool.v.clone()
    graphs.capture_all()
    captured = h.pool.k.clone(), h.pool.v.clone()
    assert torch.equal(captured[0][:, 1:], before[0][:, 1:])  # capture wrote the pad slot alone
    batch = h.decode_batch(rows)
    assert graphs.accepts(batch)
    with torch.inference_mode():
        hidden = graphs.run(batch)
    replayed = h.pool.k.clone(), h.pool.v.clone()
    h.pool.k.copy_(captured[0])
    h.pool.v.copy_(captured[1])
    size = 4 if len(rows) == 3 else len(rows)
    eager = h.eager(_padded(batch, size))
    assert hidden.shape == (len(rows), CONFIG["hidden_size"])
    assert torch.equal(hidden, eager[: len(rows)])
    assert torch.equal(replayed[0], h.pool.k) and torch.equal(replayed[1], h.pool.v)
    assert graphs.passes == 1


def test_replays_follow_the_buffers_from_pass_to_pass(model_dir) -> None:
    """Successive passes of other sizes and rows through the same graphs match eager
    passes over a twin harness, step after step."""
    graphed, eager = _Harness(model_dir), _Harness(model_dir)
    graphs = DecodeGraphs(graphed.model, graphed.backend, (1, 2, 4), EagerReplay())
    graphs.capture_all()
    for rows in ([0, 1, 2, 3], [2], [1, 3], [0, 2, 3]):
        with torch.inference_mode():
            got = graphs.run(graphed.decode_batch(rows))
        size = next(s for s in graphs.batch_sizes if s >= len(rows))  # the one it pads to
        want = eager.eager(_padded(eager.decode_batch(rows), size))
        assert torch.equal(got, want[: len(rows)]), rows
    assert graphs.passes == 4


def test_what_graphs_accept(model_dir) -> None:
    h = _Harness(model_dir)
    graphs = DecodeGraphs(h.model, h.backend, (1, 2), EagerReplay())
    batch = h.decode_batch([0, 1])
    assert not graphs.accepts(batch)  # nothing captured yet
    graphs.capture_all()
    assert graphs.accepts(batch)
    assert not graphs.accepts(h.decode_batch([0, 1, 2]))  # past the largest size
    attn = batch.attn
    extend = AttentionInputs(
        attn.rows, attn.prefix_lens, attn.extend_lens + 1, attn.out_cache_loc, 2
    )
    assert not graphs.accepts(
        ForwardBatch(
            batch.input_ids,
            batch.positions,
            extend,
            batch.sample_indices,
            (),
            False,
            batch.prompt_logprob_indices,
            batch.prompt_logprob_targets,
            0,
        )
    )


def test_a_backend_that_cannot_be_captured_is_refused(model_dir) -> None:
    h = _Harness(model_dir)
    torch_backend = TorchAttentionBackend(h.pool, h.table, 0.25)
    with pytest.raises(ValueError, match="'torch' cannot be captured"):
        DecodeGraphs(h.model, torch_backend, (1,), EagerReplay())


def test_the_runner_replays_decode_passes_and_runs_the_rest_eager(model_dir) -> None:
    h = _Harness(model_dir)
    graphs = DecodeGraphs(h.model, h.backend, (1, 2, 4), EagerReplay())
    graphs.capture_all()
    runner = ModelRunner(h.model, h.backend, Sampler(CONFIG["vocab_size"]), decode_graphs=graphs)
    greedy = SamplingRow(SamplingParams(temperature=0.0), [], frozenset())
    batch = h.decode_batch([0, 2, 3])
    batch = ForwardBatch(
        batch.input_ids,
        batch.positions,
        batch.attn,
        batch.sample_indices,
        (greedy,) * 3,
        False,
        batch.prompt_logprob_indices,
        batch.prompt_logprob_targets,
        0,
    )
    want = h.model.compute_logits(h.eager(_padded(batch, 4))[:3]).argmax(-1).tolist()
    out = runner.run(batch)  # the same pass again: its K/V rewritten with the same values
    assert out.next_token_ids == want
    assert runner.pass_counts().graphed == 1 and runner.pass_counts().eager == 0
    prefill = ForwardBatch(
        torch.tensor([1, 2]),
        torch.tensor([0, 1]),
        AttentionInputs(
            torch.tensor([1]), torch.tensor([0]), torch.tensor([2]), torch.tensor([90, 91]), 2
        ),
        torch.tensor([1]),
        (greedy,),
        False,
        batch.prompt_logprob_indices,
        batch.prompt_logprob_targets,
        0,
    )
    runner.run(prefill)
    assert runner.pass_counts().graphed == 1 and runner.pass_counts().eager == 1
