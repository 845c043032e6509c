"""The host's share of an engine step, and what a step copies and waits for.

The engine's own scheduler, batch builder, KV budget, radix cache, model runner, sampler
and output processing run around a model that returns prepared logits at once (a
512-token vocabulary, so the "device" work of the sampler's argmax is negligible too):
what is timed is the host's work alone. Figures, each side:

  decode b1/b64/b256  host time of one decode step (schedule -> run -> process_output) of
                      B running requests; median over the timed steps ("after" times
                      them outside the seam's counting, then counts one more step)
  admit64             64 requests on a cached 2,000-token prefix (+ 24 tokens of their own,
                      greedy): host time of every step from their arrival until each has
                      its first token; median over the repeats
  per step            host -> device copies, device -> host copies and synchronisations
                      of a decode step, and over the admission

Both sides in one run. "after" is this tree; "before" is the commit ``--before`` names,
exported with ``git archive`` into a temporary directory and imported
from a folder that maps ``radixlm`` -> lang, ``radixlm.runtime`` -> runtime and
``radixlm.kernels`` -> kernels, as pyproject's package-dir does (a copy of ``lang`` with
two symlinks). Each side runs this file's worker (``--side``) in a subprocess of its own,
the two sides in turns, ``--rounds`` times (this 2-core machine is shared: a run beside
someone else's job is much slower), and each figure is the median over the rounds.

Counting. "after" counts through the runtime's seam (``radixlm.runtime.device``:
``count_traffic``), with the KV table built as on a GPU (``host_mirror=True``: the device
table and its host copy are two tensors), so the CPU run takes the GPU's code path and
every crossing it would make is counted. "before" has no seam; the worker counts what its
GPU path does at the same places: ``ReqToTokenTable.write`` one host -> device copy,
``write_positions`` three, ``read`` one device -> host copy and one synchronisation,
``ForwardBatch.to`` one copy per tensor it moves, ``to_host`` one synchronisation and one
copy per tensor. Neither side counts the sampler's own small index tensors (a few per
step whatever the batch; ``benchmarks/gpu_check.py`` counts everything with torch.profiler).

Usage: .venv/bin/python benchmarks/bench_host_overhead.py [--steps 40] [--repeats 5]
           [--rounds 3] [--before 0f9346f] [--json benchmarks/results/host_overhead.json]
Prints medians and ratios and writes the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "host_overhead.json"
BEFORE = "0f9346f"
VOCAB = 512
EOS = 2
BATCH_SIZES = (1, 64, 256)
PREFIX_TOKENS, QUESTION_TOKENS, NUM_QUESTIONS = 2000, 24, 64


# ---- the worker: one side, in its own process ----------------------------------------


class _Detokenizer:
    """What the scheduler uses of an ``IncrementalDetokenizer``: no text at all."""

    def feed(self, token_ids):
        from radixlm.runtime.io.detokenizer import DetokenizeResult

        return DetokenizeResult("")

    def finish(self) -> str:
        return ""


class _PreparedLogits(torch.nn.Module):
    """A model whose pass is free: hidden states are row numbers, logits prepared rows."""

    def __init__(self, max_rows: int) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.logits = torch.randn(max_rows, VOCAB, generator=gen)
        self.logits[:, EOS] = float("-inf")  # nobody stops early: every step is full

    def forward(self, input_ids, positions, metadata, rows):
        return torch.zeros(rows.numel(), 1)  # (R, 1)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.logits[: hidden.shape[0]]  # (R, V)


class _NoAttention:
    """The attention backend's place in a pass; the prepared model reads nothing."""

    def prepare(self, inputs):
        return None


class _Counts:
    def __init__(self) -> None:
        self.copies_to_device = self.copies_to_host = self.syncs = 0


def _count_before(counts: _Counts) -> None:
    """Counts what the old code's GPU path copies and waits for (see the docstring)."""
    from radixlm.runtime.executor import forward_batch, model_runner
    from radixlm.runtime.mem_cache import kv_pool

    table = kv_pool.ReqToTokenTable
    write, write_positions, read = table.write, table.write_positions, table.read

    def counted_write(self, row, start, slots):
        counts.copies_to_device += 1
        return write(self, row, start, slots)

    def counted_write_positions(self, rows, positions, slots):
        counts.copies_to_device += 3
        return write_positions(self, rows, positions, slots)

    def counted_read(self, row, num_tokens):
        counts.copies_to_host += 1
        counts.syncs += 1
        return read(self, row, num_tokens)

    to = forward_batch.ForwardBatch.to

    def counted_to(self, device):
        moved = [self.input_ids, self.positions, self.sample_indices]
        moved += [self.prompt_logprob_indices, self.prompt_logprob_targets]
        moved += [self.grammar_bitmask, self.grammar_rows]
        counts.copies_to_device += 4 + sum(t is not None for t in moved)  # 4: attention's
        return to(self, device)

    to_host = model_runner.to_host

    def counted_to_host(*tensors):
        counts.syncs += 1
        counts.copies_to_host += len(tensors)
        return to_host(*tensors)

    table.write, table.write_positions, table.read = (
        counted_write,
        counted_write_positions,
        counted_read,
    )
    forward_batch.ForwardBatch.to = counted_to
    model_runner.to_host = counted_to_host


class _Side:
    """One side's engine parts, built fresh for each measurement."""

    def __init__(self, counts: _Counts | None, max_running: int) -> None:
        from radixlm.runtime.config import SchedulerConfig
        from radixlm.runtime.executor.model_runner import ModelRunner
        from radixlm.runtime.mem_cache.kv_pool import ReqToTokenTable, SlotAllocator
        from radixlm.runtime.mem_cache.radix_cache import RadixCache
        from radixlm.runtime.sampling.sampler import Sampler
        from radixlm.runtime.scheduling.scheduler import Scheduler

        config = SchedulerConfig(max_running_requests=max_running)
        allocator = SlotAllocator(1 << 17)
        if counts is None:  # the seam's side: the GPU's table (device copy + host mirror)
            table = ReqToTokenTable(max_running, 4096, host_mirror=True)
        else:
            table = ReqToTokenTable(max_running, 4096)
        self.scheduler = Scheduler(config, allocator, table, RadixCache(allocator.free))
        self.runner = ModelRunner(_PreparedLogits(max_running), _NoAttention(), Sampler(VOCAB))
        self._num_requests = 0

    def add(self, prompt: list[int], max_new_tokens: int) -> object:
        from radixlm.runtime.io.messages import TokenizedRequest
        from radixlm.runtime.io.sampling_params import SamplingParams

        params = SamplingParams(temperature=0, max_new_tokens=max_new_tokens)
        rid = f"r{self._num_requests}"
        self._num_requests += 1
        tokenized = TokenizedRequest(
            rid, 0, tuple(prompt), params, frozenset({EOS}), _Detokenizer()
        )
        return self.scheduler.add_request(tokenized)

    def step(self) -> None:
        batch = self.scheduler.schedule()
        assert batch is not None
        output = self.runner.run(batch.forward)
        self.scheduler.process_output(batch, output)


def _prompt(seed: int, n: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (n,), generator=gen).tolist()


class _Meter:
    """Times and counts one side's steps (through the seam, or the old-code patches)."""

    def __init__(self, counts: _Counts | None) -> None:
        self._counts = counts

    def __call__(self, fn) -> tuple[float, dict[str, int]]:
        if self._counts is None:
            from radixlm.runtime.device import count_traffic

            with count_traffic() as seen:
                start = time.perf_counter()
                fn()
                elapsed = time.perf_counter() - start
            return elapsed, _as_dict(seen)
        before = dict(vars(self._counts))
        start = time.perf_counter()
        fn()
        elapsed = time.perf_counter() - start
        return elapsed, {k: v - before[k] for k, v in vars(self._counts).items()}


def _as_dict(seen) -> dict[str, int]:
    return {
        "copies_to_device": seen.copies_to_device,
        "copies_to_host": seen.copies_to_host,
        "syncs": seen.syncs,
    }


def _decode(counts: _Counts | None, batch: int, steps: int) -> dict:
    side, meter = _Side(counts, max(batch, 8)), _Meter(counts)
    reqs = [side.add(_prompt(i, 16), max_new_tokens=steps + 64) for i in range(batch)]
    while any(r.num_pending_tokens > 1 or not r.output_ids for r in reqs):
        side.step()  # prefills, untimed
    for _ in range(3):
        side.step()  # warm-up decodes
    times = []
    for _ in range(steps):  # timed without counting (the seam's counting costs a little)
        start = time.perf_counter()
        side.step()
        times.append(time.perf_counter() - start)
    _, traffic = meter(side.step)  # then one step counted
    return {"step_s": statistics.median(times), "traffic": traffic}


def _admit(counts: _Counts | None) -> dict:
    side, meter = _Side(counts, 128), _Meter(counts)
    prefix = _prompt(1000, PREFIX_TOKENS)
    first = side.add(prefix + _prompt(1001, QUESTION_TOKENS), max_new_tokens=1)
    while not first.finished:
        side.step()  # caches the prefix, untimed
    reqs = [
        side.add(prefix + _prompt(2000 + i, QUESTION_TOKENS), max_new_tokens=8)
        for i in range(NUM_QUESTIONS)
    ]

    def until_first_tokens() -> None:
        while not all(r.output_ids for r in reqs):
            side.step()

    steps_before = side.scheduler.stats.num_steps
    elapsed, seen = meter(until_first_tokens)
    cached = sum(r.num_cached_tokens for r in reqs)
    assert cached >= NUM_QUESTIONS * PREFIX_TOKENS, f"the prefix was not reused: {cached}"
    return {"seconds": elapsed, "steps": side.scheduler.stats.num_steps - steps_before, **seen}


def worker(side: str, steps: int, repeats: int) -> dict:
    torch.set_num_threads(1)
    counts = None
    if side == "before":
        counts = _Counts()
        _count_before(counts)
    decode = {str(b): _decode(counts, b, steps) for b in BATCH_SIZES}
    admits = [_admit(counts) for _ in range(repeats)]
    admit = {
        "seconds": statistics.median(a["seconds"] for a in admits),
        "runs_s": [a["seconds"] for a in admits],
        **{k: admits[-1][k] for k in ("steps", "copies_to_device", "copies_to_host", "syncs")},
    }
    return {"decode": decode, "admit64": admit}


# ---- the driver: both sides, one table --------------------------------------------------


def _before_tree(commit: str, into: Path) -> Path:
    """The old tree at ``commit``, importable as ``radixlm`` from the returned folder."""
    src = into / "src"
    src.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    package = into / "pkg" / "radixlm"
    shutil.copytree(src / "lang", package)
    (package / "runtime").symlink_to(src / "runtime")
    (package / "kernels").symlink_to(src / "kernels")
    return into / "pkg"


def _run_side(side: str, args: argparse.Namespace, pythonpath: str | None) -> dict:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    cmd = [sys.executable, str(Path(__file__).resolve()), "--side", side]
    cmd += ["--steps", str(args.steps), "--repeats", str(args.repeats)]
    # outside the tree, so "before" cannot import this tree's radixlm by accident
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, cwd="/")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _check_imports(pythonpath: str) -> None:
    code = "import radixlm.runtime.device as d; print(d.__file__)"
    env = dict(os.environ, PYTHONPATH=pythonpath)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True, cwd="/"
    )
    assert out.stdout.startswith(pythonpath), f"before imports {out.stdout.strip()}"


def _median_of(rounds: list[dict]) -> dict:
    """One side's figures: each time the median over the rounds (the counts do not vary:
    the first round's), and every round's times under ``rounds_s``."""
    out = json.loads(json.dumps(rounds[0]))
    for b in BATCH_SIZES:
        times = [r["decode"][str(b)]["step_s"] for r in rounds]
        out["decode"][str(b)].update(step_s=statistics.median(times), rounds_s=times)
    times = [r["admit64"]["seconds"] for r in rounds]
    out["admit64"].update(seconds=statistics.median(times), rounds_s=times)
    return out


def _table(before: dict, after: dict) -> list[str]:
    lines = [
        f"{'figure':<14}{'before':>12}{'after':>12}{'after/before':>14}"
        f"   {'per step: to dev / to host / syncs (before -> after)'}"
    ]
    for b in BATCH_SIZES:
        x, y = before["decode"][str(b)], after["decode"][str(b)]
        tx, ty = x["traffic"], y["traffic"]
        lines.append(
            f"{'decode b' + str(b):<14}{x['step_s'] * 1e3:>10.3f}ms{y['step_s'] * 1e3:>10.3f}ms"
            f"{y['step_s'] / x['step_s']:>14.3f}   "
            f"{tx['copies_to_device']}/{tx['copies_to_host']}/{tx['syncs']} -> "
            f"{ty['copies_to_device']}/{ty['copies_to_host']}/{ty['syncs']}"
        )
    x, y = before["admit64"], after["admit64"]
    lines.append(
        f"{'admit64':<14}{x['seconds'] * 1e3:>10.1f}ms{y['seconds'] * 1e3:>10.1f}ms"
        f"{y['seconds'] / x['seconds']:>14.3f}   "
        f"{x['copies_to_device']}/{x['copies_to_host']}/{x['syncs']} in {x['steps']} steps -> "
        f"{y['copies_to_device']}/{y['copies_to_host']}/{y['syncs']} in {y['steps']} steps"
    )
    return lines


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", choices=("before", "after"), help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3, help="turns of the two sides")
    parser.add_argument("--before", default=BEFORE, help="the commit of the 'before' side")
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.side is not None:
        print(json.dumps(worker(args.side, args.steps, args.repeats)))
        return
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="bench_before_") as tmp:
        pythonpath = str(_before_tree(args.before, Path(tmp)))
        _check_imports(pythonpath)
        for _ in range(args.rounds):
            runs["before"].append(_run_side("before", args, pythonpath))
            runs["after"].append(_run_side("after", args, None))
    before, after = _median_of(runs["before"]), _median_of(runs["after"])
    lines = _table(before, after)
    print("\n".join(lines))
    x, y = before, after
    ratios = {
        **{
            f"decode_b{b}": y["decode"][str(b)]["step_s"] / x["decode"][str(b)]["step_s"]
            for b in BATCH_SIZES
        },
        "admit64": y["admit64"]["seconds"] / x["admit64"]["seconds"],
    }
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "before_commit": args.before,
        "steps": args.steps,
        "repeats": args.repeats,
        "rounds": args.rounds,
        "cpu": _cpu_name(),
        "torch_threads": 1,
        "before": before,
        "after": after,
        "after_over_before": ratios,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
