"""radixlm vs Hugging Face transformers `generate` on the default model, same run, same dtype.

Workloads (issue: engine core):
  (a) single stream: greedy decode of 128 new tokens, tok/s
  (b) batch: 64 requests, prompts 20-400 tokens, outputs 8-128 tokens (fixed seed), all
      submitted at once to radixlm; transformers in padded batches of 32. Output tok/s
      counts each request's own output tokens on both sides.
  (c) prefill: a 1,000-token prompt, 1 new token, prompt tok/s

Sides: radixlm (eager), radixlm_compile (``enable_torch_compile=True``: compiled
decode steps; its start-up compile is not timed) and transformers, each in its own
process.

With ``--against REV`` the sides are radixlm as checked out and ``radixlm@REV``, the
same engine at another commit (installed into a temporary directory and imported from
there by its child process), and the ratios are this checkout's over REV's: a check
that a change slowed nothing down.

Usage: .venv/bin/python benchmarks/bench_engine.py [--dtypes float32 bfloat16] [--repeats 3]
           [--workloads single_stream_tok_s batch_out_tok_s prefill_tok_s]
           [--sides radixlm radixlm_compile transformers] [--against REV]
Prints a table of medians, the ratio of the medians and the median of the per-repeat
ratios (each repeat runs the sides back to back), and writes benchmarks/results/engine.json
(engine_vs_REV.json with --against).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

import radixlm  # noqa: E402
from radixlm.runtime.model_store import pull_default_model  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "engine.json"


def make_workload(seed: int = 0) -> list[tuple[list[int], int]]:
    """64 (prompt ids, output length) pairs; ids drawn from ordinary (non-special) tokens."""
    rng = random.Random(seed)
    return [
        ([rng.randrange(100, 40000) for _ in range(rng.randint(20, 400))], rng.randint(8, 128))
        for _ in range(64)
    ]


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class RadixSide:
    """radixlm with its radix cache on, flushed before every run: transformers has no
    prefix cache, and repeated runs of the same prompts must not be served from ours."""

    compile = False

    def __init__(self, model_dir: Path, dtype: str) -> None:
        self.engine = radixlm.Engine(
            model_path=str(model_dir), dtype=dtype, enable_torch_compile=self.compile
        )

    def reset(self) -> None:
        self.engine.flush_cache()

    def single(self, prompt: list[int], n: int) -> None:
        out = self.engine.generate(input_ids=prompt, sampling_params=_greedy(n))
        assert out["meta_info"]["completion_tokens"] == n

    def batch(self, workload: list[tuple[list[int], int]]) -> None:
        self.engine.generate(
            input_ids=[p for p, _ in workload], sampling_params=[_greedy(n) for _, n in workload]
        )

    def close(self) -> None:
        self.engine.shutdown()


class CompiledRadixSide(RadixSide):
    """radixlm with ``enable_torch_compile=True`` (compiled decode steps)."""

    compile = True


class HFSide:
    def __init__(self, model_dir: Path, dtype: str) -> None:
        self.model = AutoModelForCausalLM.from_pretrained(
            str(model_dir), dtype=getattr(torch, dtype)
        ).eval()

    @torch.inference_mode()
    def single(self, prompt: list[int], n: int) -> None:
        self._generate([prompt], n)

    @torch.inference_mode()
    def batch(self, workload: list[tuple[list[int], int]]) -> None:
        for i in range(0, len(workload), 32):
            chunk = workload[i : i + 32]
            self._generate([p for p, _ in chunk], max(n for _, n in chunk))

    def _generate(self, prompts: list[list[int]], n: int) -> None:
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])  # left padding
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        self.model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,
        )

    def reset(self) -> None:
        pass

    def close(self) -> None:
        del self.model


def _greedy(n: int) -> dict:
    return {"temperature": 0, "max_new_tokens": n, "ignore_eos": True}


WORKLOADS = ("single_stream_tok_s", "batch_out_tok_s", "prefill_tok_s")


def serve_side(side: str, dtype: str) -> None:
    """Child process: loads one side, then runs the workload named on each stdin line
    and answers with its throughput on stdout."""
    runner = SIDES[side](pull_default_model(progress=False), dtype)
    rng = random.Random(1)
    single_prompt = [rng.randrange(100, 40000) for _ in range(16)]
    long_prompt = [rng.randrange(100, 40000) for _ in range(1000)]
    workload = make_workload()
    num_out = sum(n for _, n in workload)
    runs = {
        "single_stream_tok_s": lambda: 128 / timed(lambda: runner.single(single_prompt, 128)),
        "batch_out_tok_s": lambda: num_out / timed(lambda: runner.batch(workload)),
        "prefill_tok_s": lambda: 1000 / timed(lambda: runner.single(long_prompt, 1)),
    }
    runner.single(single_prompt, 4)  # warm-up
    print("ready", flush=True)
    for line in sys.stdin:
        runner.reset()
        print(json.dumps(runs[line.strip()]()), flush=True)
    runner.close()


class SideProcess:
    """One side in its own process: two libraries' OpenMP thread teams in one process
    slow each other down on a small machine, which would skew the comparison.

    ``import_path``: a directory put first on the child's ``sys.path`` (another
    commit's installed radixlm), or None for the radixlm this script sees."""

    def __init__(self, side: str, dtype: str, import_path: Path | None = None) -> None:
        cmd = [sys.executable, __file__, "--side", side, "--dtypes", dtype]
        env = dict(os.environ)
        if import_path is not None:
            env["PYTHONPATH"] = os.pathsep.join(
                filter(None, [str(import_path), env.get("PYTHONPATH")])
            )
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready"

    def run(self, workload: str) -> float:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(workload + "\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()


Runs = dict[str, dict[str, list[float]]]  # side -> workload -> one value per repeat


def install_commit(rev: str, into: Path) -> Path:
    """Installs radixlm as of commit ``rev`` (no dependencies: this venv's serve) into
    ``into``/site and returns that directory, for a child's ``sys.path``."""
    repo = Path(__file__).resolve().parents[1]
    source, site = into / "source", into / "site"
    source.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", rev], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--target", str(site), str(source)],
        check=True,
    )  # fmt: skip
    # Commits before the restructure listed only *.cpp as package data: bring the
    # kernels' headers along too, as the build includes them.
    for header in (source / "kernels").rglob("*.h"):
        dest = site / "radixlm" / "kernels" / header.relative_to(source / "kernels")
        if not dest.exists():
            shutil.copy(header, dest)
    return site


def compare(
    dtype: str,
    repeats: int,
    workloads: list[str],
    names: list[str],
    import_paths: dict[str, Path] | None = None,
) -> Runs:
    """The sides loaded side by side and measured alternately, so that drift in the
    machine's speed during the run hits them all equally. ``import_paths``: the
    sides that import radixlm from elsewhere (``--against``), by name."""
    paths = import_paths or {}
    sides = {name: SideProcess(name.split("@")[0], dtype, paths.get(name)) for name in names}
    runs: Runs = {name: {w: [] for w in workloads} for name in names}
    # One unmeasured round first: a side's start may leave work running behind it
    # (a grammar compile worker starting, first-use allocations) that would slow
    # whichever side is measured first.
    for workload in workloads:
        for proc in sides.values():
            proc.run(workload)
    for _ in range(repeats):
        for workload in workloads:
            for name, proc in sides.items():
                runs[name][workload].append(proc.run(workload))
    for proc in sides.values():
        proc.close()
    print(f"{dtype}: {json.dumps(runs)}", flush=True)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the JSON")
    parser.add_argument(
        "--against", metavar="REV", help="compare with radixlm at this git commit instead"
    )
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # child process
    args = parser.parse_args()
    if args.side:
        print(f"{args.side}: radixlm from {Path(radixlm.__file__).parent}", file=sys.stderr)
        serve_side(args.side, args.dtypes[0])
        return
    if args.against:
        against_commit(args)
        return
    report: dict = {
        "threads": torch.get_num_threads(),
        "repeats": args.repeats,
        "results": {},
        "runs": {},
    }
    for dtype in args.dtypes:
        runs = compare(dtype, args.repeats, args.workloads, args.sides)
        report["runs"][dtype] = runs
        report["results"][dtype] = {
            side: {w: statistics.median(v) for w, v in by_workload.items()}
            for side, by_workload in runs.items()
        }
    report["paired_ratios"] = {dtype: paired_ratios(runs) for dtype, runs in report["runs"].items()}
    print_table(report["results"], report["paired_ratios"])
    args.out.parent.mkdir(exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


SIDES = {"radixlm": RadixSide, "radixlm_compile": CompiledRadixSide, "transformers": HFSide}


def against_commit(args: argparse.Namespace) -> None:
    """This checkout's radixlm vs the same engine at commit ``args.against``: per dtype
    and workload the medians and the median per-repeat ratio (new / old)."""
    rev = subprocess.run(
        ["git", "rev-parse", "--short", args.against], check=True, capture_output=True, text=True
    ).stdout.strip()
    old = f"radixlm@{rev}"
    tmp = Path(tempfile.mkdtemp(prefix="radixlm-bench-"))
    try:
        paths = {old: install_commit(rev, tmp)}
        report: dict = {"against": rev, "repeats": args.repeats, "runs": {}, "paired_ratios": {}}
        for dtype in args.dtypes:
            runs = compare(dtype, args.repeats, args.workloads, ["radixlm", old], paths)
            report["runs"][dtype] = runs
            report["paired_ratios"][dtype] = {
                w: statistics.median(n / o for n, o in zip(runs["radixlm"][w], runs[old][w]))
                for w in args.workloads
            }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{'dtype':<9} {'metric':<22} {'new':>10} {old:>16} paired new/old")
    for dtype, runs in report["runs"].items():
        for w in args.workloads:
            new, base = statistics.median(runs["radixlm"][w]), statistics.median(runs[old][w])
            ratio = report["paired_ratios"][dtype][w]
            print(f"{dtype:<9} {w:<22} {new:>10.1f} {base:>16.1f} {ratio:>6.3f}x")
    out = args.out if args.out != RESULTS else RESULTS.with_name(f"engine_vs_{rev}.json")
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"wrote {out}")


def paired_ratios(runs: Runs) -> dict[str, dict[str, float]]:
    """Per radixlm side and workload, the median over repeats of its value over
    transformers' in the same repeat. The sides of a repeat run back to back, so
    this follows the machine's drift better than the ratio of the two medians,
    which can come from different phases of a long run (a shared VM's speed
    wanders by tens of percent within minutes)."""
    theirs = runs.get("transformers")
    if theirs is None:
        return {}
    return {
        side: {
            w: statistics.median(o / t for o, t in zip(values, theirs[w], strict=True))
            for w, values in by_workload.items()
        }
        for side, by_workload in runs.items()
        if side != "transformers"
    }


def print_table(results: dict[str, dict], paired: dict[str, dict]) -> None:
    """One row per radixlm side, dtype and workload: its median, transformers', the
    ratio of the medians and the median of the per-repeat ratios."""
    print(
        f"{'dtype':<9} {'side':<16} {'metric':<22} {'radixlm':>10} {'transformers':>13} "
        "ratio paired"
    )
    for dtype, sides in results.items():
        theirs = sides.get("transformers", {})
        for side, by_metric in sides.items():
            if side == "transformers":
                continue
            for metric, ours in by_metric.items():
                base = theirs.get(metric)
                ratio = f"{ours / base:>5.2f}x" if base else "    -"
                pair = paired.get(dtype, {}).get(side, {}).get(metric)
                pair_text = f"{pair:>5.2f}x" if pair else "    -"
                base_text = f"{base:>13.1f}" if base else f"{'-':>13}"
                print(
                    f"{dtype:<9} {side:<16} {metric:<22} {ours:>10.1f} {base_text} {ratio}"
                    f" {pair_text}"
                )


if __name__ == "__main__":
    main()
