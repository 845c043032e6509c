"""Few-row forward kernels on CPU: a decoder layer in two calls, a decode step
in one; float32 or bfloat16 weights (or quantized ones, for the decode step),
float32 activations.

``SmallBatchKernels`` wraps ``small_batch_cpu.cpp`` (built by
``radixlm.kernels.cpu.native``): a matrix product for a few rows, the two halves of
a Llama-family decoder layer around attention, each one C++ call (one OpenMP
region) instead of a dozen torch ops, and a whole decode step:

- ``linear``: x W^T + b.
- ``attention_in``: residual += hidden; x = rmsnorm(residual); qkv = x Wqkv^T + b;
  per-head q/k rmsnorm (Qwen3); RoPE on q and k. Returns qkv.
- ``mlp``: residual += attn Wo^T + b; x = rmsnorm(residual);
  returns (silu(x Wg^T) * x Wu^T) Wd^T (biases where the model has them).
- ``decode_step``: every layer of a pass of decode rows (attention_in, the new
  K/V into the pool, the decode attention kernel of ``cpu_attention``, mlp)
  and the final norm; over quantized mixture-of-experts layers
  (``MoeLayerWeights``) the MLP is o_proj, the norm, the router, each token's
  route and its experts (``moe``). A quantized pool (int8 or fp8 codes and bfloat16 scales,
  ``radixlm.runtime.mem_cache.kv_quant``) gets the new K/V quantized per head in
  C++, bit for bit as ``kv_quant.quantize`` would (``quantize_heads`` is that
  step alone), and its attention reads the codes.

Quantized weights (``QuantizedMatrix``: int4 codes in torch's packed CPU layout,
int8 codes in groups or per row) take ``small_batch_quant_cpu.cpp``'s products:
``quant_linear`` alone, ``decode_step`` for layers whose four matrices are all
quantized (norms, biases and the pool in the model's float dtype), and ``moe``: a
mixture-of-experts layer's chosen experts for a few tokens in one call. Where the
build has AVX512-VNNI (and VBMI, for int4) their products run on int8 dot products
of the inputs rounded to int8 per 32 (``dot_products``; docs/cpu.md). So do bfloat16
weights in oneDNN's blocked layout (``BlockedMatrix``: the copy ``Linear.prepare``
keeps for oneDNN's matmul, read as it is, on AVX512-BF16 builds), for
``decode_step``: in that layout a line of weights serves every input row, and a
decode step of a few rows reads the weights faster than from the plain matrices
(benchmarks/README.md, "CPU paths and kernels").

The ``*_reference`` functions are the same computations in plain torch, which
the tests hold the kernels to. Weights are the ``Linear`` layer's layout:
contiguous ``(out, in)`` matrices, every tensor of a
layer in one dtype (float32, or bfloat16 read as float32); with bfloat16 the
decode step's KV pool is bfloat16 too.

The few-row product reads each weight row as a stream: faster than oneDNN's
blocked products at one or two rows, and on the default model's matrices up to
~16; a single-stream decode step in ``decode_step`` is faster than the compiled
and the eager model (benchmarks/README.md, "CPU paths and kernels"). Bfloat16
weights take AVX512-BF16 dot products of the inputs rounded to bfloat16 where the
build has them (``bf16_dot_products``; the references' ``round_inputs``).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from radixlm.kernels.cpu.decode_attention import CODE_DTYPES, KernelShapeError, raise_for_status
from radixlm.kernels.cpu.native import NATIVE, KernelTarget, load_library

__all__ = [
    "BF16_BLOCKED",
    "BLOCKED_ROWS",
    "BlockedMatrix",
    "DecodeStepWeights",
    "DecoderLayerWeights",
    "ExpertTable",
    "INT4",
    "INT8",
    "LINEAR_MAX_ROWS",
    "MAX_ROWS",
    "MoeLayerWeights",
    "QuantizedMatrix",
    "SmallBatchKernels",
    "StoredMatrix",
    "attention_in_reference",
    "load_small_batch_kernels",
    "mlp_reference",
]

SOURCE = Path(__file__).with_name("small_batch_cpu.cpp")
# The decode step over a quantized pool: a library of its own (see the file).
CODES_SOURCE = Path(__file__).with_name("small_batch_codes_cpu.cpp")
# The products and decode step over quantized weights: a library of its own too.
QUANT_SOURCE = Path(__file__).with_name("small_batch_quant_cpu.cpp")
_SUFFIXES = {torch.float32: "f32", torch.bfloat16: "bf16"}  # weight dtype -> C entry point

# Rows of the passes the runtime runs here at most (the measured table, cpu_paths,
# may say fewer). The product takes a chunk of input rows at a time (8; 6 on
# bfloat16 dot products: more would spill its accumulators from the registers)
# against a block of weight rows, every chunk over a block while it is cached, so
# the weights come from memory once a pass (benchmarks/README.md, "CPU paths and
# kernels").
MAX_ROWS = 64
# Rows up to which a standalone product (the LM head, whose thread shares do not
# stay cached between its reads) beats MKL clearly; past them the two meet.
LINEAR_MAX_ROWS = 16


# QuantizedMatrix kinds (small_batch_quant_cpu.cpp's kInt4 and kInt8), and
# BlockedMatrix's (kBf16Blocked).
INT4 = 1
INT8 = 2
BF16_BLOCKED = 3
# Output rows of a BlockedMatrix's blocks, and what its inputs are padded to a multiple of.
BLOCKED_ROWS = 64
BLOCKED_INPUTS = 32


@dataclass(frozen=True)
class QuantizedMatrix:
    """A quantized weight (out, in) as ``small_batch_quant_cpu.cpp`` reads it.

    INT4: w = (code - 8) * scale + zero per group of ``group`` inputs; ``codes`` the
    packed nibbles in torch's CPU layout (``torch._convert_weight_to_int4pack_for_cpu``,
    rows in blocks of ``block``), ``scales`` bfloat16 (in / group, out, 2) (scale,
    zero) pairs, ``zeros`` None.
    INT8: w = code * scale + zero; ``codes`` int8 (out, in), ``scales`` and ``zeros``
    float32 (out, in / group) (``zeros`` None when all are 0); ``block`` 0.

    The tensors are held here, so the addresses ``fields`` gives stay valid.
    """

    kind: int
    codes: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None
    group: int
    block: int
    shape: tuple[int, int]  # (out, in)

    def fields(self) -> list[int]:
        """The kernel's ``QMatrix``: kind, codes, scales, zeros (0: none), group, block."""
        zeros = 0 if self.zeros is None else self.zeros.data_ptr()
        return [self.kind, self.codes.data_ptr(), self.scales.data_ptr(), zeros, self.group,
                self.block]  # fmt: skip

    @functools.cached_property
    def table(self) -> torch.Tensor:
        """``fields`` as the int64 tensor a product call points at (made once)."""
        return torch.tensor(self.fields(), dtype=torch.int64)

    def problems(self, name: str, lanes: int) -> list[str]:
        """What keeps a build of ``lanes`` floats a vector from reading it."""
        out_features, in_features = self.shape
        problems = []
        if self.codes.device.type != "cpu" or not self.codes.is_contiguous():
            problems.append(f"{name} codes must be a contiguous CPU tensor")
        if self.group <= 0 or in_features % self.group:
            problems.append(f"{name} group {self.group} must divide its {in_features} inputs")
        groups = in_features // max(self.group, 1)
        if self.kind == INT4:
            if self.block <= 0 or self.block % (2 * lanes) or self.block // (2 * lanes) not in (
                1, 2, 4,
            ):  # fmt: skip
                problems.append(f"{name} int4 blocks of {self.block} rows do not suit this build")
            if self.codes.numel() * 2 != out_features * in_features or in_features % 2:
                problems.append(f"{name} must hold {out_features} x {in_features} packed codes")
            expected = (groups, out_features, 2)
            if self.scales.dtype != torch.bfloat16 or tuple(self.scales.shape) != expected:
                problems.append(f"{name} scales must be bfloat16 {expected}")
        elif self.kind == INT8:
            if self.group % lanes:
                problems.append(f"{name} int8 groups of {self.group} are no multiple of {lanes}")
            if self.codes.dtype != torch.int8 or tuple(self.codes.shape) != self.shape:
                problems.append(f"{name} codes must be int8 {self.shape}")
            for part, t in (("scales", self.scales), ("zeros", self.zeros)):
                if t is not None and (
                    t.dtype != torch.float32
                    or tuple(t.shape) != (out_features, groups)
                    or not t.is_contiguous()
                ):
                    problems.append(f"{name} {part} must be float32 ({out_features}, {groups})")
        else:
            problems.append(f"{name} has an unknown kind {self.kind}")
        if not self.scales.is_contiguous():
            problems.append(f"{name} scales must be contiguous")
        return problems


@dataclass(frozen=True)
class BlockedMatrix:
    """A bfloat16 weight (out, in) in the layout oneDNN's matmul reads on a CPU with
    AVX512-BF16 (``Linear.prepare``'s packed copy), which ``small_batch_quant_cpu.cpp``
    reads too: the inputs padded with zeros to a multiple of ``BLOCKED_INPUTS``
    (``padded_in``), output rows in blocks of ``BLOCKED_ROWS`` (the last one padded
    with zero rows), each block (padded_in / 2, 64, 2): two adjacent inputs of a row
    side by side.

    A few-row product reads it faster than the plain (out, in) weight: each 64-byte
    line serves every input row against one broadcast input pair (benchmarks/README.md,
    "CPU paths and kernels"). Made by ``SmallBatchKernels.blocked_matrix``, which checks the
    copy's layout; ``packed`` (an opaque oneDNN tensor) is held here, so the address
    ``fields`` gives stays valid.
    """

    packed: torch.Tensor
    shape: tuple[int, int]  # (out, in)

    @property
    def padded_in(self) -> int:
        return -(-self.shape[1] // BLOCKED_INPUTS) * BLOCKED_INPUTS

    def fields(self) -> list[int]:
        """The kernel's ``QMatrix``: kind, the blocked values, no scales or zeros, the
        padded inputs as one group, the block's rows."""
        address = torch.ops.mkldnn.data_ptr(self.packed)
        return [BF16_BLOCKED, address, 0, 0, self.padded_in, BLOCKED_ROWS]

    @functools.cached_property
    def table(self) -> torch.Tensor:
        """``fields`` as the int64 tensor a product call points at (made once)."""
        return torch.tensor(self.fields(), dtype=torch.int64)

    def problems(self, name: str, lanes: int) -> list[str]:
        """What keeps the kernels from reading it: nothing once ``blocked_matrix`` made
        it (it checked the copy), but its values must be oneDNN's."""
        if not self.packed.is_mkldnn or tuple(self.packed.shape) != self.shape:
            return [f"{name} must be oneDNN's {self.shape} copy"]
        return []


# The matrix operands small_batch_quant_cpu.cpp reads (its QMatrix: six fields).
StoredMatrix = QuantizedMatrix | BlockedMatrix
Matrix = torch.Tensor | StoredMatrix


@dataclass(frozen=True)
class DecoderLayerWeights:
    """One decoder layer's tensors as the kernels read them (CPU; all float32 or
    all bfloat16; or the four matrices stored, for ``decode_step``: quantized, or
    bfloat16 in oneDNN's blocked layout).

    Projections are contiguous ``(out, in)`` matrices (or ``StoredMatrix``
    operands, all four alike); biases and norm weights are contiguous vectors.
    q_norm/k_norm: per-head RMSNorm weights (head_dim,), both or neither.
    """

    input_norm: torch.Tensor
    qkv: Matrix
    qkv_bias: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    o: Matrix
    o_bias: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up: Matrix
    gate_up_bias: torch.Tensor | None
    down: Matrix
    down_bias: torch.Tensor | None
    eps: float
    heads: int
    kv_heads: int
    head_dim: int

    @property
    def hidden_size(self) -> int:
        return self.qkv.shape[1]

    @property
    def intermediate_size(self) -> int:
        return self.down.shape[1]

    @property
    def dtype(self) -> torch.dtype:
        """The float dtype of its norms (and float matrices, biases, KV pool)."""
        return self.input_norm.dtype

    @property
    def stored(self) -> bool:
        """Whether its matrices are ``StoredMatrix`` operands (quantized, or bfloat16
        blocked), which ``decode_step`` reads through ``small_batch_quant_cpu.cpp``."""
        return isinstance(self.qkv, StoredMatrix)

    def to(self, dtype: torch.dtype) -> DecoderLayerWeights:
        """The layer with every tensor in ``dtype`` (``Tensor.to`` keeps the layout)."""
        tensors = {
            f.name: getattr(self, f.name).to(dtype)
            for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return dataclasses.replace(self, **tensors)

    def pointers(self) -> list[int]:
        """The tensors' addresses (0 for an absent one; a stored matrix's six
        fields), in the kernel's ``Layer`` order."""
        return _fields(
            self.input_norm, self.qkv, self.qkv_bias, self.q_norm, self.k_norm, self.o,
            self.o_bias, self.post_norm, self.gate_up, self.gate_up_bias, self.down,
            self.down_bias,
        )  # fmt: skip


@dataclass(frozen=True)
class MoeLayerWeights:
    """A mixture-of-experts decoder layer as ``decode_step`` reads it: the attention
    half as ``DecoderLayerWeights``' (its two matrices quantized), then a float router
    and the quantized experts (``ExpertTable``): each token's ``top_k`` experts by
    softmax over the router's logits, renormalised when ``normalize`` (Qwen3-MoE,
    Mixtral; no shared expert).

    router: the router's ``(E, hidden)`` weight, contiguous, in the norms' dtype.
    """

    input_norm: torch.Tensor
    qkv: QuantizedMatrix
    qkv_bias: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    o: QuantizedMatrix
    o_bias: torch.Tensor | None
    post_norm: torch.Tensor
    router: torch.Tensor
    experts: ExpertTable
    top_k: int
    normalize: bool
    eps: float
    heads: int
    kv_heads: int
    head_dim: int

    @property
    def hidden_size(self) -> int:
        return self.qkv.shape[1]

    @property
    def intermediate_size(self) -> int:
        """0: each expert's width is its table's (``decode_step`` ignores it)."""
        return 0

    @property
    def dtype(self) -> torch.dtype:
        return self.input_norm.dtype

    @property
    def stored(self) -> bool:
        return True

    def pointers(self) -> list[int]:
        """The kernel's ``MoeLayer`` fields: a quantized ``Layer``'s 32 (no gate_up
        or down: zeros), the router's and the expert table's addresses, E, k,
        normalize, each expert's width."""
        attention = _fields(
            self.input_norm, self.qkv, self.qkv_bias, self.q_norm, self.k_norm, self.o,
            self.o_bias, self.post_norm,
        )  # fmt: skip
        no_mlp = [0] * 14  # gate_up (6 fields), its bias, down (6), its bias
        return [
            *attention, *no_mlp, self.router.data_ptr(), self.experts.fields.data_ptr(),
            len(self.experts.experts), self.top_k, int(self.normalize), self.experts.inter,
        ]  # fmt: skip


def _fields(*tensors: Matrix | None) -> list[int]:
    """The tensors' addresses in order (0 for an absent one; a stored matrix's six
    fields)."""
    fields = []
    for t in tensors:
        if isinstance(t, StoredMatrix):
            fields += t.fields()
        else:
            fields.append(0 if t is None else t.data_ptr())
    return fields


class SmallBatchKernels:
    """The built kernels; see the module doc."""

    def __init__(
        self, library: ctypes.CDLL, code_library: ctypes.CDLL, quant_library: ctypes.CDLL
    ) -> None:
        """library: SOURCE built; code_library: CODES_SOURCE built; quant_library:
        QUANT_SOURCE built (the same target)."""
        i64, ptr, f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
        signatures = {
            "linear": [ptr, ptr, ptr, ptr, i64, i64, i64],
            "attention_in": [ptr, ptr, ptr, f32, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr]
            + [i64] * 5,
            "mlp": [ptr, ptr, ptr, ptr, ptr, f32, ptr, ptr, ptr, ptr, ptr, ptr, ptr] + [i64] * 4,
            "decode_step": [ptr, i64, ptr, f32, ptr, ptr, ptr, ptr, ptr, i64, ptr, i64]
            + [ptr, ptr, ptr, ptr]
            + [i64] * 6
            + [f32],
        }
        # (name, weight dtype) -> the C function for weights of that dtype
        self._functions = {}
        for name, argtypes in signatures.items():
            for dtype, suffix in _SUFFIXES.items():
                function = getattr(library, f"radixlm_small_{name}_{suffix}")
                function.argtypes, function.restype = argtypes, ctypes.c_int
                self._functions[name, dtype] = function
        # (weight dtype, code dtype) -> the decode step over a quantized pool, which
        # takes the scales too: k_scales, v_scales, their layer stride
        self._code_steps = {}
        for dtype, suffix in _SUFFIXES.items():
            for code, code_suffix in CODE_DTYPES.items():
                name = f"radixlm_small_decode_step_{suffix}_{code_suffix}"
                function = getattr(code_library, name)
                function.argtypes = [*signatures["decode_step"], ptr, ptr, i64]
                function.restype = ctypes.c_int
                self._code_steps[dtype, code] = function
        # (weight dtype, pool code dtype or None) -> the decode step over quantized
        # weights; its signature is the code steps' (float pools get null scales)
        self._quant_steps, self._moe_steps = {}, {}
        for dtype, suffix in _SUFFIXES.items():
            for code, code_suffix in ((None, ""), *CODE_DTYPES.items()):
                name = f"radixlm_quant_decode_step_{suffix}{code_suffix and '_' + code_suffix}"
                function = getattr(quant_library, name)
                function.argtypes = [*signatures["decode_step"], ptr, ptr, i64]
                function.restype = ctypes.c_int
                self._quant_steps[dtype, code] = function
                # the same over mixture-of-experts layers (MoeLayerWeights)
                name = name.replace("radixlm_quant_decode_step", "radixlm_quant_moe_decode_step")
                function = getattr(quant_library, name)
                function.argtypes = [*signatures["decode_step"], ptr, ptr, i64]
                function.restype = ctypes.c_int
                self._moe_steps[dtype, code] = function
        for dtype, suffix in _SUFFIXES.items():  # ("quant_linear", bias dtype)
            function = getattr(quant_library, f"radixlm_quant_linear_{suffix}")
            function.argtypes, function.restype = [ptr, ptr, ptr, ptr, i64, i64, i64], ctypes.c_int
            self._functions["quant_linear", dtype] = function
        quant_library.radixlm_quant_lanes.restype = ctypes.c_int
        # floats a vector of the build: what quantized groups and blocks must suit
        self.lanes: int = quant_library.radixlm_quant_lanes()
        quant_library.radixlm_quant_bf16_blocked.restype = ctypes.c_int
        # whether this build reads BlockedMatrix operands (AVX512-BF16 dot products)
        self.bf16_blocked: bool = bool(quant_library.radixlm_quant_bf16_blocked())
        self._blocked_matches = quant_library.radixlm_bf16_blocked_matches
        self._blocked_matches.argtypes = [ptr, ptr, i64, i64, i64]
        self._blocked_matches.restype = ctypes.c_int
        library.radixlm_small_bf16_dot.restype = ctypes.c_int
        # whether products of bfloat16 weights round their inputs to bfloat16 for
        # AVX512-BF16 dot products in this build (the references' round_inputs)
        self.bf16_dot_products: bool = bool(library.radixlm_small_bf16_dot())
        self._moe = quant_library.radixlm_quant_moe
        self._moe.argtypes = [ptr, i64, i64, i64, ptr, i64, ptr, ptr, i64, ptr]
        self._moe.restype = ctypes.c_int
        self._int8_dot = quant_library.radixlm_quant_int8_dot
        self._int8_dot.argtypes, self._int8_dot.restype = [i64, i64], ctypes.c_int
        self._int4_dot = quant_library.radixlm_quant_int4_dot
        self._int4_dot.argtypes, self._int4_dot.restype = [i64, i64, i64], ctypes.c_int
        self._quantize = {}  # code dtype -> radixlm_quantize_heads_<code>
        for code, code_suffix in CODE_DTYPES.items():
            function = getattr(code_library, f"radixlm_quantize_heads_{code_suffix}")
            function.argtypes, function.restype = [ptr, i64, i64, ptr, ptr], ctypes.c_int
            self._quantize[code] = function

    def expert_table(self, experts: list[tuple[QuantizedMatrix, QuantizedMatrix]]) -> ExpertTable:
        """The table ``moe`` reads: each expert's gate_up (2I, hidden; gate rows
        first) and down (hidden, I) matrices. Raises KernelShapeError for matrices
        this build cannot read or that disagree in shape."""
        problems = []
        first_up, first_down = experts[0]
        for e, (up, down) in enumerate(experts):
            problems += up.problems(f"expert {e} gate_up", self.lanes)
            problems += down.problems(f"expert {e} down", self.lanes)
            if (up.shape, down.shape) != (first_up.shape, first_down.shape):
                problems.append(f"expert {e} must have expert 0's shapes")
        hidden, inter = first_up.shape[1], first_down.shape[1]
        if first_up.shape[0] != 2 * inter or first_down.shape[0] != hidden:
            problems.append(f"gate_up must be (2 x {inter}, {hidden}), down ({hidden}, {inter})")
        if problems:
            raise KernelShapeError("quantized experts: " + "; ".join(problems))
        fields = torch.tensor([[up.fields(), down.fields()] for up, down in experts])
        return ExpertTable(tuple(experts), fields, hidden, inter)

    def moe(
        self, x: torch.Tensor, experts: ExpertTable, ids: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        """A mixture-of-experts MLP over quantized experts in one call: x (T, hidden)
        float32; ids (T, k) int64 and weights (T, k) float32 each token's experts.
        Returns (T, hidden) float32 = sum_j weights[t, j] down_e(silu(gate_e x_t) *
        up_e x_t), e = ids[t, j], summed in the order of j."""
        tokens, k = ids.shape
        problems = []
        if x.dtype != torch.float32 or x.dim() != 2 or not x.is_contiguous():
            problems.append("x must be a contiguous 2-D float32 tensor")
        elif x.shape != (tokens, experts.hidden):
            problems.append(f"x must be ({tokens}, {experts.hidden}): one row a token of ids")
        if ids.dtype != torch.int64 or weights.dtype != torch.float32 or weights.shape != ids.shape:
            problems.append("ids must be int64 and weights float32, both (T, k)")
        elif not (ids.is_contiguous() and weights.is_contiguous()):
            problems.append("ids and weights must be contiguous")
        if problems:
            raise KernelShapeError("quantized experts: " + "; ".join(problems))
        out = torch.empty_like(x)
        status = self._moe(
            x.data_ptr(), tokens, experts.hidden, experts.inter, experts.fields.data_ptr(),
            len(experts.experts), ids.data_ptr(), weights.data_ptr(), k, out.data_ptr(),
        )  # fmt: skip
        if status:
            raise KernelShapeError(f"quantized experts: an id outside [0, {len(experts.experts)})")
        return out

    def blocked_matrix(self, weight: torch.Tensor, packed: torch.Tensor) -> BlockedMatrix | None:
        """``weight`` (out, in) bfloat16 as a ``BlockedMatrix`` over ``packed``, its copy
        in oneDNN's layout (``Linear.prepare``), or None where this build cannot read it
        (no AVX512-BF16) or the copy is laid out otherwise (oneDNN picks its layout per
        CPU and shape): every value is compared with the weight's, once, here."""
        if not (
            self.bf16_blocked
            and weight.dtype == packed.dtype == torch.bfloat16
            and weight.device.type == "cpu"
            and weight.dim() == 2
            and weight.is_contiguous()
            and packed.is_mkldnn
            and tuple(packed.shape) == tuple(weight.shape)
        ):
            return None
        matrix = BlockedMatrix(packed, tuple(weight.shape))
        out_features, in_features = matrix.shape
        blocks = -(-out_features // BLOCKED_ROWS)
        if torch.ops.mkldnn._nbytes(packed) != blocks * BLOCKED_ROWS * matrix.padded_in * 2:
            return None
        address = torch.ops.mkldnn.data_ptr(packed)
        matches = self._blocked_matches(
            weight.data_ptr(), address, out_features, in_features, matrix.padded_in
        )
        return matrix if matches else None

    def dot_products(self, matrix: QuantizedMatrix) -> bool:
        """Whether the matrix's products run on VNNI dot products of its inputs
        rounded to int8 per 32 in this build (``int8_group.quantize_inputs_reference``:
        AVX512-VNNI, and AVX512-VBMI for int4) rather than in float32."""
        k = matrix.shape[1]
        if matrix.kind == INT8:
            return bool(self._int8_dot(k, matrix.group))
        return bool(self._int4_dot(k, matrix.group, matrix.block))

    def entry_point(self, name: str, dtype: torch.dtype) -> Callable[..., int]:
        """The C function ``radixlm_small_<name>`` for weights of ``dtype`` (and
        ``radixlm_quant_linear_<dtype>`` for "quant_linear", ``dtype`` its bias's),
        raw: no checks, pointers in (``benchmarks/bench_layer_kernels.py`` and
        ``bench_quant_kernels.py`` time them so)."""
        return self._functions[name, dtype]

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``F.linear(x, weight, bias)`` for x (N, in) float32 and a float32 or
        bfloat16 weight (out, in) as the module doc says; the result is float32.
        Any N works; it pays off up to ``MAX_ROWS``."""
        problems = _weight_problems("weight", weight, bias)
        if x.dtype != torch.float32 or x.device.type != "cpu" or x.dim() != 2:
            problems.append("x must be a 2-D CPU float32 tensor")
        elif not x.is_contiguous() or x.shape[1] != weight.shape[1]:
            problems.append(f"x must be contiguous with {weight.shape[1]} columns")
        if problems:
            raise KernelShapeError("small-batch linear: " + "; ".join(problems))
        rows, (out_features, in_features) = x.shape[0], weight.shape
        y = torch.empty((rows, out_features), dtype=torch.float32)
        self._functions["linear", weight.dtype](
            x.data_ptr(), weight.data_ptr(), _ptr(bias), y.data_ptr(), rows, in_features,
            out_features,
        )  # fmt: skip
        return y

    def quant_linear(
        self, x: torch.Tensor, matrix: StoredMatrix, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x (N, in) float32 @ the stored matrix's (out, in)^T (+ bias, float32 or
        bfloat16), float32: the products ``decode_step`` runs on stored weights."""
        out_features, in_features = matrix.shape
        problems = matrix.problems("weight", self.lanes)
        if x.dtype != torch.float32 or x.device.type != "cpu" or x.dim() != 2:
            problems.append("x must be a 2-D CPU float32 tensor")
        elif not x.is_contiguous() or x.shape[1] != in_features:
            problems.append(f"x must be contiguous with {in_features} columns")
        dtype = torch.float32 if bias is None else bias.dtype
        if bias is not None and not _is_vector(bias, out_features, dtype):
            problems.append(f"bias must be a contiguous CPU ({out_features},) tensor")
        if dtype not in _SUFFIXES:
            problems.append("bias must be float32 or bfloat16")
        if problems:
            raise KernelShapeError("quantized linear: " + "; ".join(problems))
        return self.quant_product(x, matrix, bias)

    def quant_product(
        self, x: torch.Tensor, matrix: StoredMatrix, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``quant_linear`` without its checks, for a matrix and bias that passed them
        once (``QuantizedLinear.use_small_batch``) and x a contiguous float32 (N, in)."""
        out_features, in_features = matrix.shape
        dtype = torch.float32 if bias is None else bias.dtype
        y = torch.empty((x.shape[0], out_features), dtype=torch.float32)
        status = self._functions["quant_linear", dtype](
            x.data_ptr(), matrix.table.data_ptr(), _ptr(bias), y.data_ptr(), x.shape[0],
            in_features, out_features,
        )  # fmt: skip
        raise_for_status(status, "quantized linear")
        return y

    @staticmethod
    def check_weight(weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        """Checks a weight (and bias) once for ``linear``: what ``Linear`` calls
        before it routes few rows here."""
        problems = _weight_problems("weight", weight, bias)
        if problems:
            raise KernelShapeError("small-batch linear: " + "; ".join(problems))

    def check_layer(self, w: DecoderLayerWeights | MoeLayerWeights) -> None:
        """Checks a layer's weights once, for ``attention_in``, ``mlp`` (float
        matrices) and ``decode_step``, which do not (a wrong layout through ctypes
        is a crash, not an exception). Its matrices are all float or all quantized."""
        hidden = w.hidden_size
        attn_dim = w.heads * w.head_dim
        qkv_rows = (w.heads + 2 * w.kv_heads) * w.head_dim
        problems, dtype = [], w.dtype
        if dtype not in _SUFFIXES:
            problems.append("norm weights must be float32 or bfloat16")
        matrices = [
            ("qkv", w.qkv, w.qkv_bias, (qkv_rows, hidden)),
            ("o", w.o, w.o_bias, (hidden, attn_dim)),
        ]
        if isinstance(w, MoeLayerWeights):
            problems += _router_problems(w)
        else:
            inter = w.intermediate_size
            matrices += [
                ("gate_up", w.gate_up, w.gate_up_bias, (2 * inter, hidden)),
                ("down", w.down, w.down_bias, (hidden, inter)),
            ]
        for name, weight, bias, shape in matrices:
            if isinstance(weight, StoredMatrix) != w.stored:
                problems.append(f"{name} must be stored as qkv is (quantized or blocked), or plain")
            elif w.stored:
                problems += weight.problems(name, self.lanes)
                if bias is not None and not _is_vector(bias, shape[0], dtype):
                    problems.append(f"{name} bias must be a contiguous CPU {dtype} vector")
            else:
                problems += _weight_problems(name, weight, bias, dtype)
            if tuple(weight.shape) != shape:
                problems.append(f"{name} must have shape {shape}")
        for name, vector, size in (
            ("input_norm", w.input_norm, hidden),
            ("post_norm", w.post_norm, hidden),
            ("q_norm", w.q_norm, w.head_dim),
            ("k_norm", w.k_norm, w.head_dim),
        ):
            if vector is not None and not _is_vector(vector, size, dtype):
                problems.append(f"{name} must be a contiguous CPU {dtype} ({size},) tensor")
        if (w.q_norm is None) != (w.k_norm is None):
            problems.append("q_norm and k_norm come together")
        if w.head_dim % 2:
            problems.append(f"head_dim must be even, not {w.head_dim}")
        if problems:
            raise KernelShapeError("small-batch decoder layer: " + "; ".join(problems))

    def attention_in(
        self,
        w: DecoderLayerWeights,
        residual: torch.Tensor,
        hidden: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
    ) -> torch.Tensor:
        """residual (T, hidden), updated in place (+= hidden unless None); cos/sin
        (T, D/2). Returns qkv (T, (H + 2 Hkv) * D) with q and k rotated.

        Unchecked: ``w`` must have passed ``check_layer``, and every tensor here
        be a contiguous CPU float32 tensor of the shape given.
        """
        rows, size = residual.shape
        normed = torch.empty_like(residual)
        qkv = torch.empty((rows, w.qkv.shape[0]), dtype=torch.float32)
        self._functions["attention_in", w.qkv.dtype](
            residual.data_ptr(), _ptr(hidden), w.input_norm.data_ptr(), w.eps,
            w.qkv.data_ptr(), _ptr(w.qkv_bias), _ptr(w.q_norm), _ptr(w.k_norm),
            cos.data_ptr(), sin.data_ptr(), normed.data_ptr(), qkv.data_ptr(),
            rows, size, w.heads, w.kv_heads, w.head_dim,
        )  # fmt: skip
        return qkv

    def mlp(
        self, w: DecoderLayerWeights, attn: torch.Tensor, residual: torch.Tensor
    ) -> torch.Tensor:
        """attn (T, H * D); residual (T, hidden), updated in place (+= o_proj(attn)).
        Returns the MLP's output (T, hidden). Unchecked, as ``attention_in``."""
        rows, size = residual.shape
        scratch = torch.empty_like(residual)
        gate_up = torch.empty((rows, w.gate_up.shape[0]), dtype=torch.float32)
        out = torch.empty_like(residual)
        self._functions["mlp", w.qkv.dtype](
            attn.data_ptr(), w.o.data_ptr(), _ptr(w.o_bias), residual.data_ptr(),
            w.post_norm.data_ptr(), w.eps, w.gate_up.data_ptr(), _ptr(w.gate_up_bias),
            w.down.data_ptr(), _ptr(w.down_bias), scratch.data_ptr(), gate_up.data_ptr(),
            out.data_ptr(), rows, size, attn.shape[1], w.intermediate_size,
        )  # fmt: skip
        return out

    def decode_step(
        self,
        step: DecodeStepWeights,
        residual: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        req_to_token: torch.Tensor,
        rows: torch.Tensor,
        prefix_lens: torch.Tensor,
        out_cache_loc: torch.Tensor,
        scale: float,
        k_scale: torch.Tensor | None = None,
        v_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Every layer of a pass of B decode rows, then the final norm, in one call.

        residual: (B, hidden) token embeddings, used up as the residual stream;
        cos/sin: (B, D/2); k_pool/v_pool: (layers, slots, Hkv, D); req_to_token,
        rows, prefix_lens: as ``DecodeAttention`` takes them; out_cache_loc: (B,)
        the slot each row's new K/V is written to; k_scale/v_scale: a quantized
        pool's (layers, slots, Hkv) bfloat16 scales (``KVPool.k_scale``), None for a
        float pool. Returns the final hidden states (B, hidden). Unchecked, as
        ``attention_in``, and the pool and table must have passed ``check_cache``
        (``radixlm.kernels.cpu.decode_attention``).
        """
        batch, size = residual.shape
        first = step.layers[0]
        dtype = first.dtype
        out = torch.empty_like(residual)
        args = (
            step.pointers.data_ptr(), len(step.layers), step.final_norm.data_ptr(), first.eps,
            residual.data_ptr(), cos.data_ptr(), sin.data_ptr(), k_pool.data_ptr(),
            v_pool.data_ptr(), k_pool.stride(0), req_to_token.data_ptr(), req_to_token.stride(0),
            rows.data_ptr(), prefix_lens.data_ptr(), out_cache_loc.data_ptr(), out.data_ptr(),
            batch, size, first.heads, first.kv_heads, first.head_dim, first.intermediate_size,
            scale,
        )  # fmt: skip
        coded = k_scale is not None and v_scale is not None
        if first.stored:
            steps = self._moe_steps if isinstance(first, MoeLayerWeights) else self._quant_steps
            function = steps[dtype, k_pool.dtype if coded else None]
            scales = (k_scale.data_ptr(), v_scale.data_ptr(), k_scale.stride(0)) if coded else (
                None, None, 0,
            )  # fmt: skip
            status = function(*args, *scales)
        elif not coded:
            status = self._functions["decode_step", dtype](*args)
        else:
            function = self._code_steps[dtype, k_pool.dtype]
            status = function(*args, k_scale.data_ptr(), v_scale.data_ptr(), k_scale.stride(0))
        raise_for_status(status, "small-batch decode step")
        return out

    def quantize_heads(
        self, x: torch.Tensor, code_dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x (n, D) float32 -> (codes (n, D) of ``code_dtype``, scales (n,) bfloat16):
        how ``decode_step`` quantizes each new K/V head for a quantized pool, alone
        (``kv_quant.quantize``'s result, bit for bit)."""
        if x.dtype != torch.float32 or x.dim() != 2 or not x.is_contiguous():
            raise KernelShapeError("quantize_heads: x must be a contiguous (n, D) float32 tensor")
        codes = torch.empty(x.shape, dtype=torch.uint8).view(code_dtype)
        scales = torch.empty(x.shape[0], dtype=torch.bfloat16)
        self._quantize[code_dtype](
            x.data_ptr(), x.shape[0], x.shape[1], codes.data_ptr(), scales.data_ptr()
        )
        return codes, scales


@dataclass(frozen=True)
class ExpertTable:
    """A mixture-of-experts layer's quantized experts for ``SmallBatchKernels.moe``:
    (gate_up, down) per expert, their fields as one (E, 2, 6) int64 table, and the
    shapes (the matrices hold their tensors alive)."""

    experts: tuple[tuple[QuantizedMatrix, QuantizedMatrix], ...]
    fields: torch.Tensor
    hidden: int
    inter: int


@dataclass(frozen=True)
class DecodeStepWeights:
    """A whole model's layers for ``SmallBatchKernels.decode_step``: the layers,
    their addresses as one int64 table (a row a layer: its ``pointers``), and the
    final norm's weight.

    The addresses are taken once: the layers hold the tensors alive, and weights
    laid out again afterwards (``Linear.prepare``) need a new ``of``.
    """

    layers: tuple[DecoderLayerWeights, ...] | tuple[MoeLayerWeights, ...]
    final_norm: torch.Tensor
    pointers: torch.Tensor

    @classmethod
    def of(
        cls,
        kernels: SmallBatchKernels,
        layers: tuple[DecoderLayerWeights, ...] | tuple[MoeLayerWeights, ...],
        final_norm: torch.Tensor,
    ) -> DecodeStepWeights:
        """Checks every layer (``check_layer``) and that they agree in shape and kind
        (all dense or all mixtures of experts)."""
        for layer in layers:
            kernels.check_layer(layer)
        first = layers[0]
        shape = (first.hidden_size, first.intermediate_size, first.heads, first.kv_heads)
        problems = []
        if any(
            (w.hidden_size, w.intermediate_size, w.heads, w.kv_heads) != shape
            or (w.head_dim, w.eps) != (first.head_dim, first.eps)
            for w in layers
        ):
            problems.append("every layer must have the first one's shape and eps")
        if any((w.dtype, w.stored) != (first.dtype, first.stored) for w in layers):
            problems.append("every layer must have the first one's dtype and kind of matrices")
        if any(type(w) is not type(first) for w in layers):
            problems.append("every layer must be the first one's kind, dense or experts")
        dtype = first.dtype
        if not _is_vector(final_norm, first.hidden_size, dtype):
            problems.append(f"final_norm must be a contiguous CPU {dtype} ({shape[0]},) tensor")
        if problems:
            raise KernelShapeError("small-batch decode step: " + "; ".join(problems))
        pointers = torch.tensor([w.pointers() for w in layers], dtype=torch.int64)
        return cls(layers, final_norm, pointers)


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _is_vector(t: torch.Tensor, size: int, dtype: torch.dtype) -> bool:
    return (
        t.dtype == dtype
        and t.device.type == "cpu"
        and tuple(t.shape) == (size,)
        and t.is_contiguous()
    )


def _weight_problems(
    name: str, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype | None = None
) -> list[str]:
    """What is wrong with a weight (and its bias) of ``dtype`` (None: either kind)."""
    dtype = dtype or weight.dtype
    problems = []
    if weight.dtype != dtype or dtype not in _SUFFIXES or weight.device.type != "cpu":
        problems.append(f"{name} must be a CPU float32 or bfloat16 tensor (all of one dtype)")
    elif weight.dim() != 2 or not weight.is_contiguous():
        problems.append(f"{name} must be a contiguous (out, in) matrix")
    if bias is not None and not _is_vector(bias, weight.shape[0], weight.dtype):
        problems.append(f"{name} bias must be a contiguous CPU ({weight.shape[0]},) tensor")
    return problems


def _router_problems(w: MoeLayerWeights) -> list[str]:
    experts = len(w.experts.experts)
    problems = _weight_problems("router", w.router, None, w.dtype)
    if tuple(w.router.shape) != (experts, w.hidden_size):
        problems.append(f"router must have shape ({experts}, {w.hidden_size})")
    if w.experts.hidden != w.hidden_size:
        problems.append(f"the experts must take {w.hidden_size} inputs, not {w.experts.hidden}")
    if not 0 < w.top_k <= experts:
        problems.append(f"top_k must be in [1, {experts}], not {w.top_k}")
    return problems


def _inputs(x: torch.Tensor, round_inputs: bool) -> torch.Tensor:
    """A product's float32 inputs, rounded to bfloat16 where the kernels' products
    of bfloat16 weights take them so (``SmallBatchKernels.bf16_dot_products``)."""
    return x.to(torch.bfloat16).float() if round_inputs else x


def attention_in_reference(
    w: DecoderLayerWeights,
    residual: torch.Tensor,
    hidden: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    round_inputs: bool = False,
) -> torch.Tensor:
    """``SmallBatchKernels.attention_in`` in plain torch (updates residual too);
    round_inputs: the product's inputs rounded to bfloat16 first."""
    w = w.to(torch.float32)  # the kernels' arithmetic
    if hidden is not None:
        residual += hidden
    x = F.rms_norm(residual, (w.hidden_size,), w.input_norm, w.eps)
    qkv = F.linear(_inputs(x, round_inputs), w.qkv, w.qkv_bias)
    rows, d, half = qkv.shape[0], w.head_dim, w.head_dim // 2
    qk = qkv[:, : (w.heads + w.kv_heads) * d].view(rows, -1, d)
    if w.q_norm is not None and w.k_norm is not None:
        weight = torch.cat((w.q_norm.expand(w.heads, d), w.k_norm.expand(w.kv_heads, d)))
        qk = F.rms_norm(qk, (d,), None, w.eps) * weight
    x1, x2 = qk[..., :half], qk[..., half:]
    c, s = cos[:, None], sin[:, None]
    rotated = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    return torch.cat((rotated.reshape(rows, -1), qkv[:, qk.shape[1] * d :]), dim=1)


def mlp_reference(
    w: DecoderLayerWeights, attn: torch.Tensor, residual: torch.Tensor, round_inputs: bool = False
) -> torch.Tensor:
    """``SmallBatchKernels.mlp`` in plain torch (updates residual too); round_inputs:
    each product's inputs rounded to bfloat16 first."""
    w = w.to(torch.float32)  # the kernels' arithmetic
    residual += F.linear(_inputs(attn, round_inputs), w.o, w.o_bias)
    x = F.rms_norm(residual, (w.hidden_size,), w.post_norm, w.eps)
    gate, up = F.linear(_inputs(x, round_inputs), w.gate_up, w.gate_up_bias).chunk(2, dim=-1)
    return F.linear(_inputs(F.silu(gate) * up, round_inputs), w.down, w.down_bias)


@functools.cache
def load_small_batch_kernels(build_dir: Path, target: KernelTarget = NATIVE) -> SmallBatchKernels:
    """The process's kernels built for ``target``, into ``build_dir`` the first time.

    Raises KernelBuildError (radixlm.kernels.cpu.native) when they cannot be built.
    """
    return SmallBatchKernels(
        load_library(SOURCE, build_dir, target),
        load_library(CODES_SOURCE, build_dir, target),
        load_library(QUANT_SOURCE, build_dir, target),
    )
