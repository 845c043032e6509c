"""The C++ few-row kernels against their plain-torch references."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from radixlm.kernels.cpu.decode_attention import KernelShapeError, decode_attention_reference
from radixlm.kernels.cpu.native import KernelTarget
from radixlm.kernels.cpu.small_batch import (
    MAX_ROWS,
    DecoderLayerWeights,
    DecodeStepWeights,
    SmallBatchKernels,
    attention_in_reference,
    load_small_batch_kernels,
    mlp_reference,
)
from radixlm.runtime.layers.linear import packed_bf16_available
from radixlm.runtime.mem_cache.kv_quant import KVFormat, dequantize, kv_format, quantize
from radixlm.runtime.model_store import cache_root
from tests import numerics as num
from tests.kernels.cpu.quantized_kv import scale_ties
from tests.numerics import Bounded


@pytest.fixture(scope="module")
def kernels(kernel_target_and_native: KernelTarget) -> SmallBatchKernels:
    """Every ISA build and the native one, whose bfloat16 products may run on
    AVX512-BF16 dot products (``bf16_dot_products``)."""
    return load_small_batch_kernels(cache_root() / "kernels", kernel_target_and_native)


def _weight(out_features: int, in_features: int, gen: torch.Generator) -> torch.Tensor:
    """A contiguous (out, in) matrix, as ``Linear.prepare`` lays float32 out."""
    return torch.randn(out_features, in_features, generator=gen) * in_features**-0.5


def _rounds(kernels: SmallBatchKernels, dtype: torch.dtype) -> torch.dtype | None:
    """What the kernels round a product's inputs to for weights of ``dtype``: bfloat16
    where bfloat16 weights take AVX512-BF16 dot products, else nothing."""
    return torch.bfloat16 if dtype == torch.bfloat16 and kernels.bf16_dot_products else None


def _layer(
    bias: bool, qk_norm: bool, heads: int = 4, kv_heads: int = 2, head_dim: int = 24, seed: int = 0
) -> DecoderLayerWeights:
    gen = torch.Generator().manual_seed(seed)
    hidden, inter = 80, 136  # neither a multiple of 16: every column block and tail runs
    qkv_rows = (heads + 2 * kv_heads) * head_dim

    def vector(n: int) -> torch.Tensor:
        return torch.randn(n, generator=gen) * 0.3 + 1

    def maybe_bias(n: int) -> torch.Tensor | None:
        return torch.randn(n, generator=gen) * 0.3 if bias else None

    return DecoderLayerWeights(
        input_norm=vector(hidden),
        qkv=_weight(qkv_rows, hidden, gen),
        qkv_bias=maybe_bias(qkv_rows),
        q_norm=vector(head_dim) if qk_norm else None,
        k_norm=vector(head_dim) if qk_norm else None,
        o=_weight(hidden, heads * head_dim, gen),
        o_bias=maybe_bias(hidden),
        post_norm=vector(hidden),
        gate_up=_weight(2 * inter, hidden, gen),
        gate_up_bias=maybe_bias(2 * inter),
        down=_weight(hidden, inter, gen),
        down_bias=maybe_bias(hidden),
        eps=1e-5,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
    )


@pytest.mark.parametrize(
    ("out_features", "in_features"),
    [(576, 576), (192, 576), (1536, 576), (576, 1536), (200, 40), (17, 33), (3, 5), (49152, 64)],
)
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 11])
def test_linear_matches_f_linear(kernels, out_features: int, in_features: int, rows: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    w = _weight(out_features, in_features, gen)
    bias = torch.randn(out_features, generator=gen)
    x = torch.randn(rows, in_features, generator=gen)
    for b in (bias, None):
        bound = num.between_two(num.linear(num.exact(x), w, b))
        num.assert_within(
            kernels.linear(x, w, b), F.linear(x, w, b), bound, f"bias={b is not None}"
        )


@pytest.mark.parametrize("rows", [1, 5, 11])
def test_linear_reads_bfloat16_weights(kernels, rows: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    w = _weight(200, 72, gen).to(torch.bfloat16)
    bias = torch.randn(200, generator=gen).to(torch.bfloat16)
    x = torch.randn(rows, 72, generator=gen)
    got = kernels.linear(x, w, bias)
    assert got.dtype == torch.float32
    rounds = _rounds(kernels, torch.bfloat16)
    # bf16 weights: exact in float32; the inputs rounded to bf16 where the products do
    bound = num.between_two(num.linear(num.round_to(num.exact(x), rounds), w, bias))
    inputs = x if rounds is None else x.to(rounds).float()
    num.assert_within(got, F.linear(inputs, w.float(), bias.float()), bound)
    with pytest.raises(KernelShapeError, match="bias"):
        kernels.linear(x, w, bias.float())  # one dtype for weight and bias


def test_linear_rows_are_batch_and_thread_invariant(kernels) -> None:
    """A row's result is bit-identical alone, in any batch, and on 1 or 2 threads:
    each output column is one lane summing its inputs in order."""
    gen = torch.Generator().manual_seed(0)
    w, x = _weight(1000, 576, gen), torch.randn(MAX_ROWS + 3, 576, generator=gen)
    together = kernels.linear(x, w)
    for i in range(x.shape[0]):
        assert torch.equal(kernels.linear(x[i : i + 1], w), together[i : i + 1])
    assert torch.equal(kernels.linear(x[2:7], w), together[2:7])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = kernels.linear(x, w)
        torch.set_num_threads(2)
        assert torch.equal(kernels.linear(x, w), alone)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(alone, together)


def test_linear_of_no_rows(kernels) -> None:
    w = _weight(32, 16, torch.Generator().manual_seed(0))
    assert kernels.linear(torch.empty(0, 16), w).shape == (0, 32)


@pytest.mark.parametrize(
    ("x", "w", "bias", "message"),
    [
        (torch.randn(2, 16), torch.randn(16, 32).t(), None, "contiguous .out, in. matrix"),
        (torch.randn(2, 16), torch.randn(32, 16).double(), None, "float32"),
        (torch.randn(2, 8), torch.randn(32, 16), None, "16 columns"),
        (torch.randn(16, 2).t(), torch.randn(32, 16), None, "x must be"),
        (torch.randn(2, 16).half(), torch.randn(32, 16), None, "x must be"),
        (torch.randn(2, 16), torch.randn(32, 16), torch.randn(31), "bias"),
    ],
)
def test_linear_refuses_what_it_cannot_read(kernels, x, w, bias, message: str) -> None:
    with pytest.raises(KernelShapeError, match=message):
        kernels.linear(x, w, bias)


def _attention_in_bounds(
    w: DecoderLayerWeights,
    residual: Bounded,
    hidden: Bounded | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rounds: torch.dtype | None = None,
) -> tuple[Bounded, Bounded]:
    """``attention_in_reference``'s computation under tests.numerics: (qkv, residual);
    rounds: the dtype the product's inputs are rounded to, if any."""
    if hidden is not None:
        residual = num.add(residual, hidden)
    x = num.round_to(num.rms_norm(residual, w.input_norm, w.eps), rounds)
    qkv = num.linear(x, w.qkv, w.qkv_bias)
    rows, d = qkv.value.shape[0], w.head_dim
    width = (w.heads + w.kv_heads) * d
    qk = qkv.map(lambda t: t[:, :width].reshape(rows, -1, d))
    if w.q_norm is not None and w.k_norm is not None:
        weight = torch.cat((w.q_norm.expand(w.heads, d), w.k_norm.expand(w.kv_heads, d)))
        qk = num.rms_norm(qk, weight, w.eps)
    rotated = num.rope(qk, cos[:, None], sin[:, None]).map(lambda t: t.reshape(rows, -1))
    return num.cat([rotated, qkv.map(lambda t: t[:, width:])], dim=1), residual


def _mlp_bounds(
    w: DecoderLayerWeights, attn: Bounded, residual: Bounded, rounds: torch.dtype | None = None
) -> tuple[Bounded, Bounded]:
    """``mlp_reference``'s computation under tests.numerics: (output, residual);
    rounds: the dtype each product's inputs are rounded to, if any."""
    residual = num.add(residual, num.linear(num.round_to(attn, rounds), w.o, w.o_bias))
    x = num.round_to(num.rms_norm(residual, w.post_norm, w.eps), rounds)
    gate_up = num.linear(x, w.gate_up, w.gate_up_bias)
    gate, up = (gate_up.map(lambda t, c=c: t.chunk(2, dim=-1)[c]) for c in (0, 1))
    down_in = num.round_to(num.silu_mul(gate, up), rounds)
    return num.linear(down_in, w.down, w.down_bias), residual


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("rows", [1, 3, 8, 11])
def test_layer_halves_match_the_reference(
    kernels, bias: bool, qk_norm: bool, rows: int, dtype: torch.dtype
) -> None:
    """float32 or bfloat16 weights, float32 arithmetic: the reference upcasts them
    (and rounds the products' inputs to bfloat16 where the build's products do)."""
    w = _layer(bias, qk_norm)
    w = w.to(dtype)
    kernels.check_layer(w)
    rounds = _rounds(kernels, dtype)
    gen = torch.Generator().manual_seed(rows)
    residual = torch.randn(rows, w.hidden_size, generator=gen)
    hidden = torch.randn(rows, w.hidden_size, generator=gen)
    angles = torch.rand(rows, w.head_dim // 2, generator=gen) * 6
    cos, sin = angles.cos(), angles.sin()
    ours, ref = residual.clone(), residual.clone()
    for h in (hidden, None):  # a later layer, then the first (nothing to add)
        added = None if h is None else num.exact(h)
        expected, _ = _attention_in_bounds(w, num.exact(ref), added, cos, sin, rounds)
        qkv = kernels.attention_in(w, ours, h, cos, sin)
        want = attention_in_reference(w, ref, h, cos, sin, rounds is not None)
        num.assert_within(qkv, want, num.between_two(expected), "qkv")
        assert torch.equal(ours, ref)  # residual += hidden: one rounding of each sum, both sides
    attn = torch.randn(rows, w.heads * w.head_dim, generator=gen)
    expected, expected_residual = _mlp_bounds(w, num.exact(attn), num.exact(ref), rounds)
    out = kernels.mlp(w, attn, ours)
    want = mlp_reference(w, attn, ref, rounds is not None)
    num.assert_within(out, want, num.between_two(expected), "mlp")
    num.assert_within(ours, ref, num.between_two(expected_residual), "residual")


def test_first_layer_adds_nothing(kernels) -> None:
    w = _layer(bias=False, qk_norm=False)
    residual = torch.randn(2, w.hidden_size)
    kept = residual.clone()
    angles = torch.zeros(2, w.head_dim // 2)
    kernels.attention_in(w, residual, None, angles.cos(), angles.sin())
    assert torch.equal(residual, kept)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"qkv": torch.randn(80, 192).t()}, "qkv must be a contiguous"),
        ({"o": torch.randn(80, 96).double()}, "o must be a CPU float32 or"),
        ({"down": torch.randn(81, 136)}, r"down must have shape \(80, 136\)"),
        ({"gate_up_bias": torch.randn(5)}, "gate_up bias"),
        ({"input_norm": torch.randn(81)}, "input_norm"),
        ({"q_norm": torch.randn(24)}, "come together"),
        ({"head_dim": 23}, "even"),
    ],
)
def test_check_layer_names_what_is_wrong(kernels, change: dict, message: str) -> None:
    w = dataclasses.replace(_layer(bias=False, qk_norm=False), **change)
    with pytest.raises(KernelShapeError, match=message):
        kernels.check_layer(w)


def _pool_case(layers: int, rows: int, seed: int = 0):
    """A (layers, slots, Hkv, D) pool of random K/V and rows of scattered slots."""
    gen = torch.Generator().manual_seed(seed)
    w = _layer(bias=True, qk_norm=True, heads=4, kv_heads=2, head_dim=32, seed=seed)
    k_pool = torch.randn(layers, 300, w.kv_heads, w.head_dim, generator=gen)
    v_pool = torch.randn(layers, 300, w.kv_heads, w.head_dim, generator=gen)
    table = torch.randint(1, 250, (rows + 1, 64), generator=gen)
    prefix_lens = torch.tensor([0, 1, 63, 17, 40, 5, 33, 2, 50][:rows])
    out_loc = torch.arange(250, 250 + rows)
    return k_pool, v_pool, table, torch.arange(rows) + 1, prefix_lens, out_loc


def _blocked(kernels: SmallBatchKernels, w: DecoderLayerWeights) -> DecoderLayerWeights:
    """A bfloat16 layer with its four matrices as ``BlockedMatrix`` operands over
    oneDNN's copies (what ``SmallBatchForward``'s step reads where the build can)."""
    matrices = {}
    for name in ("qkv", "o", "gate_up", "down"):
        weight = getattr(w, name)
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, 1)
        matrices[name] = kernels.blocked_matrix(weight, packed)
    return dataclasses.replace(w, **matrices)


@pytest.mark.parametrize(
    ("dtype", "blocked"),
    [(torch.float32, False), (torch.bfloat16, False), (torch.bfloat16, True)],
    ids=["float32", "bfloat16", "bfloat16-blocked"],
)
@pytest.mark.parametrize("rows", [1, 3, 5, 9])
def test_decode_step_is_the_layers_in_turn(
    kernels, rows: int, dtype: torch.dtype, blocked: bool
) -> None:
    """Every layer: attention_in, K/V into the pool, decode attention over the
    row's slots and its new token, mlp; then the final norm. With bfloat16
    weights the pool is bfloat16: q, k, v and the attention output are rounded
    to it, and the rest is float32. ``blocked``: the matrices in oneDNN's blocked
    layout (a build with AVX512-BF16 only), summed in another order."""
    if blocked and not (kernels.bf16_blocked and packed_bf16_available()):
        pytest.skip("this build or torch reads no bfloat16 blocked matrices")
    num_layers = 3
    layers = tuple(
        _layer(bias=True, qk_norm=True, heads=4, kv_heads=2, head_dim=32, seed=s)
        for s in range(num_layers)
    )
    final_norm = torch.rand(layers[0].hidden_size) + 0.5
    if dtype == torch.bfloat16:
        layers, final_norm = tuple(w.to(dtype) for w in layers), final_norm.to(dtype)
    step_layers = tuple(_blocked(kernels, w) for w in layers) if blocked else layers
    step = DecodeStepWeights.of(kernels, step_layers, final_norm)
    assert step.layers[0].stored == blocked
    rounds = _rounds(kernels, dtype) is not None
    k_pool, v_pool, table, row_ids, prefix_lens, out_loc = _pool_case(num_layers, rows)
    k_pool, v_pool = k_pool.to(dtype), v_pool.to(dtype)
    gen = torch.Generator().manual_seed(rows)
    embeddings = torch.randn(rows, layers[0].hidden_size, generator=gen)
    angles = torch.rand(rows, 16, generator=gen) * 6
    cos, sin = angles.cos(), angles.sin()
    scale = 32**-0.5

    ref_k, ref_v, residual, hidden = k_pool.clone(), v_pool.clone(), embeddings.clone(), None
    for i, w in enumerate(layers):
        qkv = attention_in_reference(w, residual, hidden, cos, sin, rounds)
        qkv = qkv.view(rows, 8, 32).to(dtype)  # what the pool and the attention kernel hold
        q, k, v = qkv[:, :4], qkv[:, 4:6], qkv[:, 6:]
        ref_k[i, out_loc], ref_v[i, out_loc] = k, v
        attn = decode_attention_reference(
            q, ref_k[i], ref_v[i], table, row_ids, prefix_lens, k, v, scale
        )
        hidden = mlp_reference(w, attn.reshape(rows, -1).float(), residual, rounds)
    norm = final_norm.float()
    want = F.rms_norm(residual + hidden, (residual.shape[1],), norm, layers[0].eps)

    truth, k_truth, v_truth = _decode_step_exact(
        layers, final_norm, embeddings, cos, sin, k_pool, v_pool, table, row_ids, prefix_lens,
        scale,
    )  # fmt: skip
    untouched = torch.ones(k_pool.shape[1], dtype=torch.bool)
    untouched[out_loc] = False

    got = kernels.decode_step(
        step, embeddings.clone(), cos, sin, k_pool, v_pool, table, row_ids, prefix_lens,
        out_loc, scale,
    )  # fmt: skip
    multiple = num.SAME_COMPUTATION if dtype == torch.float32 else num.SAME_ROUNDINGS
    num.assert_no_worse_than(got, want, truth, multiple, "hidden")
    num.assert_no_worse_than(k_pool[:, out_loc], ref_k[:, out_loc], k_truth, multiple, "k")
    num.assert_no_worse_than(v_pool[:, out_loc], ref_v[:, out_loc], v_truth, multiple, "v")
    assert torch.equal(k_pool[:, untouched], ref_k[:, untouched])  # other slots: never written
    assert torch.equal(v_pool[:, untouched], ref_v[:, untouched])


def _decode_step_exact(
    layers: tuple[DecoderLayerWeights, ...],
    final_norm: torch.Tensor,
    embeddings: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    table: torch.Tensor,
    row_ids: torch.Tensor,
    prefix_lens: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The exact (float64, unrounded) result of the step the test's reference takes:
    the final hidden states and each layer's new k and v, (layers, rows, Hkv, D).

    Only the values of the tests.numerics chain are used: over several layers its
    worst-case bounds compound past use (see ``assert_no_worse_than``)."""
    rows = embeddings.shape[0]
    residual, hidden, ks, vs = num.exact(embeddings), None, [], []
    for i, w in enumerate(layers):
        qkv, residual = _attention_in_bounds(w, residual, hidden, cos, sin)
        qkv = qkv.map(lambda t, d=w.head_dim: t.view(rows, -1, d))
        q, k, v = (qkv[:, a:b] for a, b in ((0, 4), (4, 6), (6, 8)))  # q, k, v heads
        attn = num.decode_attention(
            q, k_pool[i], v_pool[i], table, row_ids, prefix_lens, k, v, scale
        )
        hidden, residual = _mlp_bounds(w, attn.map(lambda t: t.reshape(rows, -1)), residual)
        ks.append(k.value)
        vs.append(v.value)
    final = num.rms_norm(num.add(residual, hidden), final_norm, layers[0].eps)
    return final.value, torch.stack(ks), torch.stack(vs)


def test_decode_step_rows_are_batch_invariant(kernels) -> None:
    layers = tuple(_layer(bias=False, qk_norm=False, head_dim=32, seed=s) for s in range(2))
    step = DecodeStepWeights.of(kernels, layers, torch.ones(layers[0].hidden_size))
    k_pool, v_pool, table, row_ids, prefix_lens, out_loc = _pool_case(2, 4)
    embeddings = torch.randn(4, layers[0].hidden_size)
    cos, sin = torch.ones(4, 16), torch.zeros(4, 16)

    def run(idx: slice) -> torch.Tensor:
        return kernels.decode_step(
            step, embeddings[idx].clone(), cos[idx], sin[idx], k_pool, v_pool, table,
            row_ids[idx], prefix_lens[idx], out_loc[idx], 0.2,
        )  # fmt: skip

    together = run(slice(0, 4))
    for i in range(4):
        assert torch.equal(run(slice(i, i + 1)), together[i : i + 1])


def test_decode_step_weights_must_agree(kernels) -> None:
    small, large = _layer(False, False, heads=4), _layer(False, False, heads=6)
    with pytest.raises(KernelShapeError, match="first one's shape"):
        DecodeStepWeights.of(kernels, (small, large), torch.ones(small.hidden_size))
    with pytest.raises(KernelShapeError, match="final_norm"):
        DecodeStepWeights.of(kernels, (small,), torch.ones(small.hidden_size + 1))
    with pytest.raises(KernelShapeError, match="qkv must"):
        DecodeStepWeights.of(
            kernels, (dataclasses.replace(small, qkv=small.qkv.t().contiguous().t()),), None
        )


# A quantized pool: the step quantizes each new K/V head as kv_quant.quantize does.


def _ties(fmt: KVFormat) -> torch.Tensor:
    """Head vectors whose largest value is the format's largest code (scale 1, so
    x / scale is x): values halfway between two codes, normal and subnormal, which
    round to the even one, and signed zeros."""
    if fmt.code_dtype == torch.int8:
        ties = [0.5, 1.5, 2.5, -0.5, -2.5, 126.5, -126.5, -0.0]
    elif fmt.code_dtype == torch.float8_e4m3fn:  # 3 mantissa bits, subnormals 2^-9 apart
        ties = [1.0625, 1.1875, -1.1875, 2.0**-10, 3 * 2.0**-10, -(2.0**-10), 440.0, -0.0]
    else:  # e5m2: 2 mantissa bits, subnormals 2^-16 apart
        ties = [1.125, 1.375, -1.375, 2.0**-17, 3 * 2.0**-17, -(2.0**-17), 53248.0, -0.0]
    row = torch.tensor([fmt.max_code, *ties])
    return torch.cat((row, torch.zeros(32 - row.numel()))).expand(2, 32).contiguous()


@pytest.mark.parametrize("name", ["int8", "fp8_e4m3", "fp8_e5m2"])
def test_quantize_heads_is_kv_quant_quantize(kernels, name: str) -> None:
    """Codes and scales bit for bit: magnitudes from 1e-30 to 1e5 (subnormal codes
    included), ties, zero vectors (scale 0) and negative zeros."""
    fmt = kv_format(name, torch.float32)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(600, 32, generator=gen) * torch.logspace(-30, 5, 600)[:, None]
    x[7] = 0.0
    x[8] = -0.0
    x[9, :5] = -0.0
    x = torch.cat((x, _ties(fmt)))
    codes, scales = kernels.quantize_heads(x, fmt.code_dtype)
    want_codes, want_scales = quantize(x, fmt)
    assert codes.dtype == fmt.code_dtype
    assert torch.equal(codes.view(torch.uint8), want_codes.view(torch.uint8))
    assert torch.equal(scales.view(torch.int16), want_scales.view(torch.int16))


@pytest.mark.parametrize("name", ["int8", "fp8_e4m3", "fp8_e5m2"])
def test_quantize_heads_rounds_the_scale_to_bfloat16_as_kv_quant_quantize(
    kernels, name: str
) -> None:
    """Float32 scales at a bfloat16 rounding tie (to the even pattern, carrying into
    the exponent, subnormal) or a few units either side: the C++ rounding of the
    scale and the codes computed from the rounded one, bit for bit."""
    fmt = kv_format(name, torch.float32)
    x = scale_ties(fmt)
    codes, scales = kernels.quantize_heads(x, fmt.code_dtype)
    want_codes, want_scales = quantize(x, fmt)
    assert scales.dtype == torch.bfloat16
    assert torch.equal(scales.view(torch.int16), want_scales.view(torch.int16))
    assert torch.equal(codes.view(torch.uint8), want_codes.view(torch.uint8))


def _quantized_pool(name: str, layers: int, rows: int):
    """``_pool_case``'s pool quantized: (codes k, codes v, scales k, scales v, table,
    row ids, prefix lens, out_loc, format)."""
    k_pool, v_pool, table, row_ids, prefix_lens, out_loc = _pool_case(layers, rows)
    fmt = kv_format(name, torch.float32)
    (k_codes, k_scale), (v_codes, v_scale) = quantize(k_pool, fmt), quantize(v_pool, fmt)
    return k_codes, v_codes, k_scale, v_scale, table, row_ids, prefix_lens, out_loc, fmt


@pytest.mark.parametrize("name", ["int8", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_step_writes_new_kv_as_kv_quant(kernels, name: str, dtype: torch.dtype) -> None:
    """The step's new K/V in a quantized pool are ``kv_quant.quantize`` of the K/V
    it computes (attention_in's, rounded to the model dtype), bit for bit; every
    other slot is left as it was."""
    rows = 3
    layer = _layer(bias=True, qk_norm=True, heads=4, kv_heads=2, head_dim=32)
    final_norm = torch.ones(layer.hidden_size)
    if dtype == torch.bfloat16:
        layer, final_norm = layer.to(dtype), final_norm.to(dtype)
    step = DecodeStepWeights.of(kernels, (layer,), final_norm)
    k_codes, v_codes, k_scale, v_scale, table, row_ids, prefix_lens, out_loc, fmt = _quantized_pool(
        name, 1, rows
    )
    before = [t.clone() for t in (k_codes, v_codes, k_scale, v_scale)]
    gen = torch.Generator().manual_seed(1)
    embeddings = torch.randn(rows, layer.hidden_size, generator=gen)
    angles = torch.rand(rows, 16, generator=gen) * 6
    cos, sin = angles.cos(), angles.sin()
    qkv = kernels.attention_in(layer, embeddings.clone(), None, cos, sin)
    kv = qkv.to(dtype).view(rows, 8, 32)[:, 4:]  # what the step stores: k heads, then v heads
    kernels.decode_step(
        step, embeddings.clone(), cos, sin, k_codes, v_codes, table, row_ids, prefix_lens,
        out_loc, 32**-0.5, k_scale, v_scale,
    )  # fmt: skip
    untouched = torch.ones(k_codes.shape[1], dtype=torch.bool)
    untouched[out_loc] = False
    for i, (codes, scales) in enumerate(((k_codes, k_scale), (v_codes, v_scale))):
        want_codes, want_scales = quantize(kv[:, 2 * i : 2 * i + 2], fmt)
        got_codes = codes.view(torch.uint8)[0, out_loc]
        assert torch.equal(got_codes, want_codes.view(torch.uint8))
        assert torch.equal(scales[0, out_loc], want_scales)
        old_codes, old_scales = before[i], before[2 + i]
        assert torch.equal(
            codes.view(torch.uint8)[:, untouched], old_codes.view(torch.uint8)[:, untouched]
        )
        assert torch.equal(scales[:, untouched], old_scales[:, untouched])


@pytest.mark.parametrize("name", ["int8", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_step_over_a_quantized_pool_is_the_layers_in_turn(
    kernels, name: str, dtype: torch.dtype
) -> None:
    """As ``test_decode_step_is_the_layers_in_turn``, the cached K/V read from codes
    and scales and each row's new K/V attended as stored (quantized, then read back,
    as every backend's pass attends its own tokens): no worse than the torch
    reference (attention over the float32 dequantized pool, its new K/V through
    ``kv_quant``) against the float64 truth over the dequantized cached values (whose
    new tokens, exact, differ from both by one quantization of theirs)."""
    num_layers, rows = 3, 3
    layers = tuple(
        _layer(bias=True, qk_norm=True, heads=4, kv_heads=2, head_dim=32, seed=s)
        for s in range(num_layers)
    )
    final_norm = torch.rand(layers[0].hidden_size) + 0.5
    if dtype == torch.bfloat16:
        layers, final_norm = tuple(w.to(dtype) for w in layers), final_norm.to(dtype)
    step = DecodeStepWeights.of(kernels, layers, final_norm)
    rounds = _rounds(kernels, dtype) is not None
    k_codes, v_codes, k_scale, v_scale, table, row_ids, prefix_lens, out_loc, fmt = _quantized_pool(
        name, num_layers, rows
    )
    gen = torch.Generator().manual_seed(rows)
    embeddings = torch.randn(rows, layers[0].hidden_size, generator=gen)
    angles = torch.rand(rows, 16, generator=gen) * 6
    cos, sin = angles.cos(), angles.sin()
    scale = 32**-0.5

    residual, hidden = embeddings.clone(), None
    for i, w in enumerate(layers):
        qkv = attention_in_reference(w, residual, hidden, cos, sin, rounds)
        qkv = qkv.view(rows, 8, 32).to(dtype)
        q, k, v = qkv[:, :4], qkv[:, 4:6], qkv[:, 6:]
        k, v = (dequantize(*quantize(x, fmt), dtype) for x in (k, v))  # as stored
        attn = decode_attention_reference(
            q, k_codes[i], v_codes[i], table, row_ids, prefix_lens, k, v, scale,
            k_scale=k_scale[i], v_scale=v_scale[i],
        )  # fmt: skip
        hidden = mlp_reference(w, attn.reshape(rows, -1).float(), residual, rounds)
    norm = final_norm.float()
    want = F.rms_norm(residual + hidden, (residual.shape[1],), norm, layers[0].eps)
    # The rows read slots below 250 only, never another row's new one: the truth
    # needs the cached values alone, exact in float64.
    k_exact = k_codes.double() * k_scale.double()[..., None]
    v_exact = v_codes.double() * v_scale.double()[..., None]
    truth, _, _ = _decode_step_exact(
        layers, final_norm, embeddings, cos, sin, k_exact, v_exact, table, row_ids, prefix_lens,
        scale,
    )  # fmt: skip
    got = kernels.decode_step(
        step, embeddings.clone(), cos, sin, k_codes, v_codes, table, row_ids, prefix_lens,
        out_loc, scale, k_scale, v_scale,
    )  # fmt: skip
    multiple = num.SAME_COMPUTATION if dtype == torch.float32 else num.SAME_ROUNDINGS
    num.assert_no_worse_than(got, want, truth, multiple, "hidden")
