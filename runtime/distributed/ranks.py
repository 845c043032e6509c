"""The tensor-parallel ranks as processes: rank 0 (the engine) drives, the others follow.

    rank 0 (the engine's loop thread)             rank r > 0 (a process of its own)
    ---------------------------------             ----------------------------------
    scheduler -> ForwardBatch                     serve_passes():
    ModelRunner: send(PassMessage) ---------->      receive a PassMessage
      (token ids, positions, attention inputs,      replay its req_to_token writes
       req_to_token writes since the last pass)     the same model call on its shard
    model(...) on its shard  <== all-reduces ==>    model(...)
    logits (gathered) -> sampler                    logits (its slice, gathered)
    close(): send(StopRanks) ---------------->      return; the process exits 0

Only rank 0 schedules, samples and holds the radix cache; the others hold their
shard, a KV pool whose slots mirror rank 0's, and a copy of ``req_to_token``.

Failure: every rank's death is seen by the others at once (gloo reports the closed
connection; a collective then raises ``RankFailedError``), and rank 0 also watches
the processes it started, so a rank that dies while the engine idles stops the engine
too (``TensorParallelRanks.watch``). A rank whose parent dies exits. Nothing waits
forever on a dead peer.

``serve_node`` runs the ranks of a node other than node 0 (``--nnodes``,
``--node-rank``): no engine and no server there, only the ranks.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from radixlm.runtime.attention import AttentionInputs
from radixlm.runtime.child_process import python_module_command
from radixlm.runtime.config import EngineConfig
from radixlm.runtime.distributed.group import TensorParallelGroup
from radixlm.runtime.errors import RankFailedError
from radixlm.runtime.executor.cpu_threads import configure_cpu
from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.executor.model_shard import ModelShard, build_model_shard
from radixlm.runtime.mem_cache.kv_pool import ReqToTokenTable, TableWrites
from radixlm.runtime.models.build import resolve_model
from radixlm.runtime.models.config import ArchConfig

__all__ = ["PassMessage", "StopRanks", "TensorParallelRanks", "serve_node", "serve_passes"]

logger = logging.getLogger(__name__)

JOIN_TIMEOUT_S = 10.0  # how long a stopping rank may take before it is killed
_PARENT_CHECK_S = 1.0
_WATCH_S = 0.5  # how often rank 0 looks at its rank processes


@dataclass(frozen=True)
class PassMessage:
    """One model pass, as rank 0 runs it (CPU tensors).

    rows: the pass's rows whose hidden states get logits (sampling rows, then prompt
    logprob rows); logit_rows: how many of them rank 0 projects in its first
    ``compute_logits`` call and in its second (0: no call), which every rank repeats,
    as each gathers the vocabulary's slices; table_writes: ``req_to_token``'s writes
    since the last pass."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    attn: AttentionInputs
    rows: torch.Tensor
    logit_rows: tuple[int, int]
    table_writes: tuple[TableWrites, ...]


@dataclass(frozen=True)
class StopRanks:
    """Rank 0 stops: the other ranks leave the group and exit."""


class TensorParallelRanks:
    """Rank 0's side: the group, this node's other rank processes, and the passes sent."""

    def __init__(self, group: TensorParallelGroup, processes: list[RankProcess]) -> None:
        self.group = group
        self.processes = processes
        self._table: ReqToTokenTable | None = None  # see bind_table
        self._stopping = threading.Event()
        self._failure: RankFailedError | None = None
        self._on_failure: Callable[[RankFailedError], None] | None = None
        self._lock = threading.Lock()
        self._watcher = threading.Thread(target=self._watch, name="radixlm-tp-watch", daemon=True)

    @classmethod
    def start(cls, config: EngineConfig, arch: ArchConfig, device: str) -> TensorParallelRanks:
        """Starts ranks 1 .. ``ranks_per_node - 1`` of node 0 and joins the group as
        rank 0 (waiting for every rank, other nodes' included)."""
        parallel = config.parallel
        init_addr = parallel.dist_init_addr or f"127.0.0.1:{_free_port()}"
        processes = _spawn(config, range(1, parallel.ranks_per_node), init_addr)
        try:
            group = TensorParallelGroup.join(parallel, 0, arch, device, init_addr)
        except BaseException:
            _end(processes)
            raise
        ranks = cls(group, processes)
        ranks._watcher.start()
        return ranks

    def bind_table(self, table: ReqToTokenTable) -> None:
        """The table whose writes every pass carries (rank 0's, recording from now on)."""
        table.record_writes()
        self._table = table

    def watch(self, on_failure: Callable[[RankFailedError], None]) -> None:
        """Calls ``on_failure`` (from a thread of its own) once a rank process dies
        while the engine runs; at once if one already has."""
        with self._lock:
            self._on_failure = on_failure
            failure = self._failure
        if failure is not None:
            on_failure(failure)

    def send_pass(
        self, batch: ForwardBatch, rows: torch.Tensor, logit_rows: tuple[int, int]
    ) -> None:
        """Sends the pass rank 0 is about to run to the other ranks."""
        assert self._table is not None, "bind_table() was not called"
        cpu = torch.device("cpu")
        self.group.send(
            PassMessage(
                batch.input_ids.to(cpu),
                batch.positions.to(cpu),
                batch.attn.to(cpu),
                rows.to(cpu),
                logit_rows,
                self._table.take_writes(),
            )
        )

    def stop(self) -> None:
        """Stops the other ranks (killing those that do not exit in time) and leaves the
        group. Call once no pass runs."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        if self._failure is None:
            try:
                self.group.send(StopRanks())
            except RankFailedError as e:
                logger.warning("%s", e)
        _end(self.processes)
        self.group.close()

    def _watch(self) -> None:
        while not self._stopping.wait(_WATCH_S):
            dead = next((p for p in self.processes if p.popen.poll() is not None), None)
            if dead is None:
                continue
            failure = RankFailedError(
                f"tensor parallel: rank {dead.rank}'s process exited with code "
                f"{dead.popen.returncode}; the engine stops"
            )
            logger.error("%s", failure)
            with self._lock:
                self._failure = failure
                callback = self._on_failure
            if callback is not None:
                callback(failure)
            return


def serve_passes(group: TensorParallelGroup, shard: ModelShard) -> None:
    """A rank other than 0: runs each pass rank 0 sends until it sends ``StopRanks``."""
    with torch.inference_mode():
        while True:
            message = group.receive()
            if isinstance(message, StopRanks):
                return
            run_pass(shard, message)


def run_pass(shard: ModelShard, message: PassMessage) -> None:
    """Rank 0's pass on this rank's shard: the same model call and logit projections
    (their collectives meet rank 0's), whose results only rank 0 uses."""
    shard.req_to_token.apply(message.table_writes)
    model, device = shard.model, shard.model.device
    metadata = shard.backend.prepare(message.attn.to(device))
    hidden = model(
        message.input_ids.to(device),
        message.positions.to(device),
        metadata,
        message.rows.to(device),
    )
    sampled, prompt = message.logit_rows
    if sampled:
        model.compute_logits(hidden[:sampled])
    if prompt:
        model.compute_logits(hidden[sampled : sampled + prompt])


def serve_node(config: EngineConfig) -> int:
    """``radixlm serve`` on a node other than node 0: runs its ranks until rank 0 stops
    them (exit 0) or one fails (the others are stopped; exit 1)."""
    parallel = config.parallel
    assert parallel.dist_init_addr is not None  # ParallelConfig requires it for nnodes > 1
    first = parallel.node_rank * parallel.ranks_per_node
    processes = _spawn(
        config, range(first, first + parallel.ranks_per_node), parallel.dist_init_addr
    )
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while not stop.wait(_WATCH_S):
            codes = [p.popen.poll() for p in processes]
            if any(code not in (None, 0) for code in codes):
                logger.error("a rank failed (exit codes %s); stopping this node's ranks", codes)
                break
            if all(code == 0 for code in codes):
                break
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _end(processes)
    return 0 if all(p.popen.returncode == 0 for p in processes) else 1


# ---- a rank process -------------------------------------------------------------------


@dataclass(frozen=True)
class RankProcess:
    """A rank's process (``python -m radixlm.runtime.distributed.ranks``)."""

    rank: int
    popen: subprocess.Popen


@dataclass(frozen=True)
class RankTask:
    """What a rank process is told on its stdin (pickled)."""

    config: EngineConfig
    rank: int
    init_addr: str


def _rank_main(config: EngineConfig, rank: int, init_addr: str) -> None:
    """The body of a rank process: join, build the shard, serve passes."""
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s %(levelname)s rank {rank} %(name)s: %(message)s"
    )
    _exit_with_parent()
    configure_cpu(config.resolved_num_threads)
    group = None
    try:
        source, arch, device = resolve_model(config)
        group = TensorParallelGroup.join(config.parallel, rank, arch, device, init_addr)
        shard = build_model_shard(config, source, arch, device, group)
        serve_passes(group, shard)
    except RankFailedError as e:
        logger.error("%s", e)
        sys.exit(1)
    except BaseException:
        logger.exception("rank %d failed", rank)
        sys.exit(1)
    finally:
        if group is not None:
            group.close()


def _exit_with_parent() -> None:
    """Exits this process once the process that started it is gone."""
    parent = os.getppid()

    def check() -> None:
        while True:
            time.sleep(_PARENT_CHECK_S)
            if os.getppid() != parent:
                logger.error("the process that started this rank is gone; exiting")
                os._exit(1)

    threading.Thread(target=check, name="radixlm-parent-watch", daemon=True).start()


def _spawn(config: EngineConfig, ranks: range, init_addr: str) -> list[RankProcess]:
    """A fresh interpreter per rank (not fork: this process runs threads; not
    multiprocessing's spawn: it imports the caller's ``__main__`` again)."""
    processes = []
    for rank in ranks:
        popen = subprocess.Popen(
            python_module_command("radixlm.runtime.distributed.ranks"), stdin=subprocess.PIPE
        )
        assert popen.stdin is not None
        popen.stdin.write(pickle.dumps(RankTask(config, rank, init_addr)))
        popen.stdin.close()
        processes.append(RankProcess(rank, popen))
    return processes


def _end(processes: list[RankProcess]) -> None:
    """Waits up to ``JOIN_TIMEOUT_S`` for the processes to exit, then kills the rest."""
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    for process in processes:
        try:
            process.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            logger.warning("rank %d's process did not exit; killing it", process.rank)
            process.popen.kill()
            process.popen.wait(timeout=JOIN_TIMEOUT_S)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    # the package's module, not this __main__ copy: its classes are the ones rank 0 sends
    from radixlm.runtime.distributed import ranks

    task = pickle.loads(sys.stdin.buffer.read())
    ranks._rank_main(task.config, task.rank, task.init_addr)
