"""A step's device traffic does not grow with its requests.

The scheduler, KV budget, radix cache, batch builder and the model runner with its
sampler run as on a GPU: the KV table keeps a device copy beside its host one
(``host_mirror=True``), and the runtime's device seam (``count_traffic``) counts every
host -> device copy and every synchronisation. The model returns prepared logits.
"""

from __future__ import annotations

import pytest
import torch

from radixlm.runtime.config import SchedulerConfig
from radixlm.runtime.device import DeviceTraffic, count_traffic
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.mem_cache.kv_pool import ReqToTokenTable, SlotAllocator
from radixlm.runtime.mem_cache.radix_cache import RadixCache
from radixlm.runtime.sampling.sampler import Sampler
from radixlm.runtime.scheduling.request import Request
from radixlm.runtime.scheduling.scheduler import Scheduler
from tests.runtime.scheduling.helpers import EOS, tokenized

VOCAB = 64
PREFIX = list(range(3, 43))  # 40 tokens several requests share


class PreparedLogits(torch.nn.Module):
    """Row i's logits are always the same (EOS never wins): every request runs on."""

    def __init__(self, rows: int) -> None:
        super().__init__()
        self.logits = torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(0))
        self.logits[:, EOS] = float("-inf")

    def forward(self, input_ids, positions, metadata, rows):
        return torch.zeros(rows.numel(), 1)  # (R, 1)

    def compute_logits(self, hidden):
        return self.logits[: hidden.shape[0]]


class NoAttention:
    def prepare(self, inputs):
        return None


class Engine:
    """The engine's step on prepared logits, over a mirrored (GPU-shaped) KV table."""

    def __init__(self, max_running: int = 64) -> None:
        config = SchedulerConfig(max_running_requests=max_running, chunked_prefill_size=4096)
        allocator = SlotAllocator(8192)
        self.table = ReqToTokenTable(max_running, 256, host_mirror=True)
        self.scheduler = Scheduler(config, allocator, self.table, RadixCache(allocator.free))
        self.runner = ModelRunner(PreparedLogits(max_running), NoAttention(), Sampler(VOCAB))
        self._count = 0

    def add(self, prompt: list[int], max_new: int = 50) -> Request:
        self._count += 1
        return self.scheduler.add_request(tokenized(f"r{self._count}", prompt, max_new))

    def step(self) -> DeviceTraffic:
        with count_traffic() as seen:
            batch = self.scheduler.schedule()
            assert batch is not None
            self.scheduler.process_output(batch, self.runner.run(batch.forward))
        return seen


def _own(i: int) -> list[int]:
    return [100 + i, 3 + i % 7, 50 + i % 11]


def _decoding(num_requests: int) -> Engine:
    """An engine whose next step decodes ``num_requests`` requests and does nothing else."""
    engine = Engine()
    reqs = [engine.add(PREFIX + _own(i)) for i in range(num_requests)]
    while not all(r.output_ids for r in reqs):  # (the shared prefix is computed once)
        engine.step()
    assert not engine.scheduler.waiting and all(r.num_pending_tokens == 1 for r in reqs)
    return engine


@pytest.mark.parametrize("num_requests", [1, 8, 32])
def test_a_decode_step_makes_one_synchronisation_and_the_same_copies_at_any_batch(
    num_requests,
) -> None:
    reference = _decoding(1).step()
    seen = _decoding(num_requests).step()
    assert seen.syncs == 1 and seen.copies_to_host == 1  # the sampled ids
    assert seen == reference


@pytest.mark.parametrize("num_requests", [1, 16])
def test_admitting_requests_on_a_cached_prefix_copies_the_same_at_any_count(
    num_requests,
) -> None:
    """Admission writes each request's cached prefix into its row, caching its prefill
    writes it again (the tree's slots): all of it reaches the device in one copy."""

    def admitting(n: int) -> tuple[DeviceTraffic, list[Request]]:
        engine = Engine()
        first = engine.add(PREFIX + [7], max_new=1)
        while not first.finished:
            engine.step()
        reqs = [engine.add(PREFIX + _own(i)) for i in range(n)]
        seen = engine.step()
        assert all(r.num_cached_tokens == len(PREFIX) for r in reqs)
        return seen, reqs

    one, _ = admitting(1)
    many, reqs = admitting(num_requests)
    assert all(r.output_ids for r in reqs)  # all admitted in the counted step
    assert many == one and many.syncs == 1


def test_finishing_and_releasing_requests_reads_nothing_back() -> None:
    """A step where 1 or 24 requests finish (their KV cached, rows released)."""

    def finishing(n: int) -> DeviceTraffic:
        engine = Engine()
        reqs = [engine.add(_own(i) * 10, max_new=2) for i in range(n)]
        engine.add(PREFIX, max_new=50)  # keeps running
        engine.step()  # every prompt (none shares a prefix) and each one's first token
        seen = engine.step()
        assert all(r.finished for r in reqs)
        return seen

    assert finishing(24) == finishing(1)


def test_retracting_requests_reads_nothing_back() -> None:
    engine = _decoding(12)
    with count_traffic() as seen:
        for req in list(engine.scheduler.running[4:]):
            engine.scheduler._retract(req)
    assert seen == DeviceTraffic()  # nothing crossed: the slots were read on the host
    assert engine.step().syncs == 1  # their readmission: one pass, one wait


def test_every_pass_sees_a_device_table_equal_to_the_host_one() -> None:
    engine = Engine()
    for i in range(6):
        engine.add(PREFIX + _own(i), max_new=3 + i)
    while engine.scheduler.has_work:
        batch = engine.scheduler.schedule()
        assert batch is not None
        with count_traffic() as seen:  # the step's writes were flushed: nothing is left
            device = engine.table.table
        assert seen.copies_to_device == 0
        assert torch.equal(device, engine.table.host)
        engine.scheduler.process_output(batch, engine.runner.run(batch.forward))
