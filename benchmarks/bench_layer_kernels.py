"""radixlm's C++ layer kernels against the torch code they replace, in one process.

The default model's real weights, sides alternating run by run, medians:

  product      all 120 layer matrices (425 MB in float32, so read from memory every
               run) at 1 to 128 rows: the few-row kernel (its C entry point) against
               ``F.linear`` on the same (out, in) storage and oneDNN's matmul on the
               layers' blocked copies (what the eager model runs); the LM head
               (113 MB) right after them, so also from memory. ``--dtype bfloat16``:
               the same over bfloat16 weights (``F.linear`` in bfloat16, oneDNN on
               its bf16 blocked copies; and, where the build has AVX512-BF16, the
               few-row kernel reading those copies: "blocked", ``BlockedMatrix``);
               ``--model llama-3.2-1b``: over Llama-3.2-1B's shape (random weights,
               bench_cpu_paths.py's)
  step         one decode pass of 1 to 16 rows over 64 cached tokens each: the whole
               step in one call (``SmallBatchForward``) against the eager model
               (backend ``prepare`` + ``forward``, torch elementwise ops), final hidden
               states only; float32 on the default model, and bfloat16 on any, where
               the step over the plain matrices is timed beside the one over oneDNN's
               blocked copies (``blocked_layers``, the engine's choice where it can)
  elementwise  one layer's elementwise steps over 1,000 rows in the model's dtype
               (two RMSNorms with their residual adds, RoPE on q and k, silu(gate) *
               up): the C++ passes against the torch ops

Usage: .venv/bin/python benchmarks/bench_layer_kernels.py [--repeats 9] [--dtype bfloat16]
    [--model PATH|llama-3.2-1b] [--out PATH]
Prints a table (kernel/blocked: the plain kernel's time over the blocked one's) and
writes benchmarks/results/layer_kernels.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from bench_cpu_paths import model_dir

from radixlm.kernels.cpu.small_batch import DecodeStepWeights
from radixlm.runtime.attention import AttentionInputs
from radixlm.runtime.config import EngineConfig
from radixlm.runtime.entrypoints.assembly import build_runtime
from radixlm.runtime.executor.cpu_threads import configure_cpu
from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.executor.small_batch import blocked_layers
from radixlm.runtime.models.decoder import MLP, Attention, RMSNorm
from radixlm.runtime.models.rope import apply_rope

RESULTS = Path(__file__).parent / "results" / "layer_kernels.json"
PRODUCT_ROWS = (1, 2, 4, 8, 16, 32, 64, 128)
STEP_ROWS = (1, 2, 4, 8, 16)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def compare(sides: dict, repeats: int) -> dict[str, float]:
    """Median seconds of each side, the sides alternating run by run."""
    runs: dict[str, list[float]] = {name: [] for name in sides}
    for fn in sides.values():  # warm-up
        fn()
    for _ in range(repeats):
        for name, fn in sides.items():
            runs[name].append(timed(fn))
    return {name: statistics.median(times) for name, times in runs.items()}


def product_cases(runtime, repeats: int) -> dict:
    model, small = runtime.runner.model, runtime.runner.small_batch
    kernels, dtype = small.kernels, model.dtype
    linears = [
        linear
        for layer in model.model.layers
        for linear in (layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                       layer.mlp.gate_up_proj, layer.mlp.down_proj)
    ]  # fmt: skip
    matrices = [linear.weight for linear in linears]
    head = model.lm_head.weight
    # the same matrices in the same order over oneDNN's copies, where this build reads them
    blocked = [
        m for w in blocked_layers(kernels, model) or () for m in (w.qkv, w.o, w.gate_up, w.down)
    ]
    quant = kernels.entry_point("quant_linear", torch.float32)
    results = {}
    for rows in PRODUCT_ROWS:
        xs = {n: torch.randn(rows, n) for n in {w.shape[1] for w in matrices}}
        ys = {n: torch.empty(rows, n) for n in {w.shape[0] for w in matrices}}
        product = kernels.entry_point("linear", dtype)
        xs_torch = {n: x.to(dtype) for n, x in xs.items()}  # torch's inputs: the weights' dtype

        def ours(rows=rows, xs=xs, ys=ys, product=product) -> None:
            # The C call itself, as the decode step makes it in C++ (the checked
            # Python wrapper, ``linear``, adds its checks to every call).
            for w in matrices:
                out, inp = w.shape
                x, y = xs[inp], ys[out]
                product(x.data_ptr(), w.data_ptr(), None, y.data_ptr(), rows, inp, out)

        def mkl(xs=xs_torch) -> None:
            for w in matrices:
                F.linear(xs[w.shape[1]], w)

        def onednn(xs=xs_torch) -> None:
            for linear in linears:
                x = xs[linear.weight.shape[1]]
                torch.ops.mkldnn._linear_pointwise(x, linear.packed, None, "none", [], "")

        def blocked_product(rows=rows, xs=xs, ys=ys) -> None:
            # The few-row kernel on oneDNN's blocked copies (``BlockedMatrix``), its C call.
            for matrix in blocked:
                out, inp = matrix.shape
                x, y = xs[inp], ys[out]
                quant(x.data_ptr(), matrix.table.data_ptr(), None, y.data_ptr(), rows, inp, out)

        sides = {"kernel": ours, "torch": mkl}
        if all(linear.packed is not None for linear in linears):
            sides["onednn"] = onednn
        if blocked:
            sides["blocked"] = blocked_product
        results[f"layers, {rows} row(s)"] = compare(sides, repeats)
    for rows in (1, 4):
        x = torch.randn(rows, head.shape[1])
        xs = {n: torch.randn(1, n, dtype=dtype) for n in {w.shape[1] for w in matrices}}
        times: dict[str, list[float]] = {"kernel": [], "torch": []}
        for _ in range(repeats):
            for name, fn, arg in (("kernel", kernels.linear, x), ("torch", F.linear, x.to(dtype))):
                for w in matrices:  # evicts the head from the caches
                    F.linear(xs[w.shape[1]], w)
                times[name].append(timed(lambda fn=fn, x=arg: fn(x, head)))
        results[f"LM head, {rows} row(s)"] = {n: statistics.median(t) for n, t in times.items()}
    return results


def step_cases(runtime, repeats: int) -> dict:
    runner = runtime.runner
    model, small, backend = runner.model, runner.small_batch, runner.attn_backend
    fused = [m for m in model.modules() if isinstance(m, RMSNorm | Attention | MLP)]
    elementwise = fused[0].elementwise
    backend.kv_pool.k.zero_()
    backend.kv_pool.v.zero_()
    engine_step = small.step
    plain = DecodeStepWeights.of(small.kernels, small.layers, model.model.norm.weight)
    layers = blocked_layers(small.kernels, model)
    blocked = None if layers is None else DecodeStepWeights.of(
        small.kernels, layers, model.model.norm.weight
    )  # fmt: skip
    results = {}
    for rows in STEP_ROWS:
        table = backend.req_to_token.table
        for r in range(rows):
            table[r, :64] = torch.arange(1 + 65 * r, 65 + 65 * r)
        inputs = AttentionInputs(
            rows=torch.arange(rows),
            prefix_lens=torch.full((rows,), 64),
            extend_lens=torch.ones(rows, dtype=torch.int64),
            out_cache_loc=torch.arange(rows) * 65 + 65,
        )
        none = torch.empty(0, dtype=torch.int64)
        ids, positions = torch.randint(100, 40000, (rows,)), torch.full((rows,), 64)
        batch = ForwardBatch(ids, positions, inputs, none, (), False, none, none, 0)

        def whole(batch=batch) -> None:
            small.step = plain
            small.run(batch)

        def whole_blocked(batch=batch) -> None:
            small.step = blocked
            small.run(batch)

        def eager(batch=batch) -> None:
            for m in fused:
                m.elementwise = None
            model(batch.input_ids, batch.positions, backend.prepare(batch.attn))
            for m in fused:
                m.elementwise = elementwise

        sides = {"kernel": whole, "torch": eager}
        if blocked is not None:
            sides["blocked"] = whole_blocked
        with torch.inference_mode():
            results[f"decode pass, {rows} row(s)"] = compare(sides, repeats)
    small.step = engine_step
    return results


def elementwise_cases(runtime, repeats: int) -> dict:
    model = runtime.runner.model
    kernels = model.model.norm.elementwise
    config = model.config
    rows, hidden, inter = 1000, config.hidden_size, config.intermediate_size
    h, hkv, d = config.num_heads, config.num_kv_heads, config.head_dim
    dtype = model.dtype  # the rows, weights and tables in the model's dtype, as it runs them
    weight = (torch.rand(hidden) + 0.5).to(dtype)
    residual, x = torch.randn(rows, hidden).to(dtype), torch.randn(rows, hidden).to(dtype)
    qkv = torch.randn(rows, h + 2 * hkv, d).to(dtype)
    angles = torch.rand(rows, d // 2)
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    gate_up = torch.randn(rows, 2 * inter).to(dtype)

    def ours() -> None:
        for _ in range(2):
            kernels.add_rms_norm(residual, x, weight, 1e-5)
        kernels.rope(qkv, h, hkv, cos, sin)
        kernels.silu_mul(gate_up)

    def torch_ops() -> None:
        for _ in range(2):
            residual.add_(x)
            F.rms_norm(residual, (hidden,), weight, 1e-5)
        apply_rope(qkv[:, : h + hkv], cos, sin)
        gate, up = gate_up.chunk(2, dim=-1)
        F.silu(gate, inplace=True).mul_(up)

    with torch.inference_mode():
        return {"one layer, 1,000 rows": compare({"kernel": ours, "torch": torch_ops}, repeats)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--model", help="a model directory, or llama-3.2-1b (random weights)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    model = model_dir(args.model)
    model_path = {"model_path": str(model)} if model is not None else {}
    config = EngineConfig.from_kwargs(dtype=args.dtype, max_total_tokens=4096, **model_path)
    configure_cpu(config.resolved_num_threads)
    runtime = build_runtime(config)
    if runtime.runner.small_batch is None:
        raise SystemExit("the C++ layer kernels are not available here (see the log)")
    results = {}
    cases = [product_cases]
    # the step case compares the default model's float32 code paths, and every
    # model's bfloat16 ones (the plain and the blocked step); the elementwise one the
    # default model's, in either dtype
    if args.dtype == "bfloat16" or model is None:
        cases += [step_cases]
    if model is None:
        cases += [elementwise_cases]
    for case in cases:
        results.update(case(runtime, args.repeats))
    print(
        f"{'case':32} {'kernel ms':>10} {'torch ms':>10} {'ratio':>7} {'oneDNN ms':>10}"
        f" {'blocked ms':>10} {'kernel/blocked':>14}"
    )
    for case, sides in results.items():
        kernel, baseline = sides["kernel"] * 1e3, sides["torch"] * 1e3
        onednn = f"{sides['onednn'] * 1e3:10.2f}" if "onednn" in sides else " " * 10
        blocked = ""
        if "blocked" in sides:
            ms = sides["blocked"] * 1e3
            blocked = f" {ms:10.2f} {kernel / ms:13.2f}x"
        ratio = baseline / kernel
        print(f"{case:32} {kernel:10.2f} {baseline:10.2f} {ratio:6.2f}x {onednn}{blocked}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "model": args.model or "default",
        "dtype": args.dtype,
        "repeats": args.repeats,
        "threads": torch.get_num_threads(),
        "seconds": results,
    }
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
