"""Architecture config of a decoder-only model, parsed from a HF ``config.json``.

Both config layouts are read: transformers 4.x (``rope_theta`` + ``rope_scaling``
at top level, ``torch_dtype``) and 5.x (``rope_parameters`` holding both, ``dtype``).

Every supported architecture is a pre-norm decoder (embedding, layers of attention
and MLP each around a residual, final norm, LM head) plus switches read from its
config and its family's traits (``_ArchTraits``):

- Llama, Mistral, Qwen2 (q/k/v bias), Qwen3 (per-head q/k RMSNorm);
- Phi-3 / Phi-4 (fused QKV and gate-up tensors, LongRoPE, partial rotary dims);
- Gemma 2 / Gemma 3 (GeGLU, norms around both sublayers and of the form
  ``x * (1 + w)``, scaled embeddings, attention and final logit soft-capping,
  ``query_pre_attn_scalar``, sliding and global layers, Gemma 3's own RoPE base
  for its sliding layers);
- mixture-of-experts: Qwen3-MoE, Qwen2-MoE (shared expert), Mixtral, OLMoE
  (q/k RMSNorm over the whole projection): ``MoEConfig``.

Sliding windows: a layer with window W lets the token at position p attend the
keys at positions p - W + 1 .. p (transformers' ``sliding_window`` meaning);
``layer_windows`` holds each layer's W or None (full attention).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radixlm.runtime.errors import ModelLoadError, ModelNotFoundError, UnsupportedArchitectureError

__all__ = [
    "ArchConfig",
    "MoEConfig",
    "RopeScaling",
    "REFUSED_ARCHITECTURES",
    "SUPPORTED_ARCHITECTURES",
    "ROPE_TYPES",
    "architecture_features",
]

ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")
ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}


@dataclass(frozen=True)
class _ArchTraits:
    """What distinguishes one architecture from plain Llama.

    qkv_bias: True/False forces the q/k/v bias; None reads ``attention_bias``.
    o_bias_follows_config: o_proj has a bias iff ``attention_bias`` (Llama, Qwen3).
    qk_norm: "head" (RMSNorm per head, Qwen3, Gemma 3), "full" (over the whole q and k
        projections, OLMoE) or None.
    sliding_window_flag: config key that switches the sliding window on; None
        means a set ``sliding_window`` is always used (Mistral); "" means never.
    gemma: Gemma's layer (see the module doc).
    moe: the family's experts: "qwen" (Qwen2/3-MoE, OLMoE keys), "mixtral", or None.
    features: what a user is told it brings (``radixlm models``).
    defaults: config.json keys transformers' config class of the family fills in when
        the file lacks them, where its value differs from what radixlm would assume.
    """

    qkv_bias: bool | None = None
    o_bias_follows_config: bool = True
    qk_norm: str | None = None
    sliding_window_flag: str | None = ""
    gemma: bool = False
    moe: str | None = None
    features: str = ""
    defaults: tuple[tuple[str, Any], ...] = ()


_ARCHITECTURES: dict[str, _ArchTraits] = {
    "LlamaForCausalLM": _ArchTraits(features="Llama 2/3, SmolLM2: RoPE scaling of every type"),
    "MistralForCausalLM": _ArchTraits(
        qkv_bias=False,
        o_bias_follows_config=False,
        sliding_window_flag=None,
        features="sliding-window attention",
        defaults=(("sliding_window", 4096),),
    ),
    "Qwen2ForCausalLM": _ArchTraits(
        qkv_bias=True,
        o_bias_follows_config=False,
        sliding_window_flag="use_sliding_window",
        features="q/k/v bias",
    ),
    "Qwen3ForCausalLM": _ArchTraits(
        qk_norm="head",
        sliding_window_flag="use_sliding_window",
        features="per-head q/k norm",
        defaults=(("head_dim", 128),),
    ),
    "Phi3ForCausalLM": _ArchTraits(
        qkv_bias=False,
        o_bias_follows_config=False,
        sliding_window_flag=None,
        features="Phi-3/Phi-4: fused QKV and gate-up, LongRoPE, partial rotary, sliding window",
        defaults=(("rms_norm_eps", 1e-5),),
    ),
    "Gemma2ForCausalLM": _ArchTraits(
        gemma=True,
        sliding_window_flag=None,
        features="GeGLU, sandwich norms, attention and logit soft-capping, "
        "alternating sliding/global layers",
        defaults=(
            ("head_dim", 256),
            ("hidden_activation", "gelu_pytorch_tanh"),
            ("query_pre_attn_scalar", 256),
            ("attn_logit_softcapping", 50.0),
            ("final_logit_softcapping", 30.0),
            ("sliding_window", 4096),
        ),
    ),
    "Gemma3ForCausalLM": _ArchTraits(
        gemma=True,
        qk_norm="head",
        sliding_window_flag=None,
        features="Gemma 2's layer with q/k norm, 5 sliding : 1 global layers, per-layer-type RoPE",
        defaults=(
            ("head_dim", 256),
            ("hidden_activation", "gelu_pytorch_tanh"),
            ("query_pre_attn_scalar", 256),
            ("sliding_window", 4096),
            ("sliding_window_pattern", 6),
            ("rope_theta", 1_000_000.0),
            ("rope_local_base_freq", 10_000.0),
        ),
    ),
    "Qwen3MoeForCausalLM": _ArchTraits(
        qk_norm="head",
        sliding_window_flag="use_sliding_window",
        moe="qwen",
        features="mixture-of-experts: softmax top-k routing",
    ),
    "Qwen2MoeForCausalLM": _ArchTraits(
        qkv_bias=True,
        o_bias_follows_config=False,
        sliding_window_flag="use_sliding_window",
        moe="qwen",
        features="mixture-of-experts with a gated shared expert",
    ),
    "MixtralForCausalLM": _ArchTraits(
        qkv_bias=False,
        o_bias_follows_config=False,
        sliding_window_flag=None,
        moe="mixtral",
        features="mixture-of-experts: top-k routing, weights renormalised",
        defaults=(("rope_theta", 1_000_000.0), ("rms_norm_eps", 1e-5)),
    ),
    "OlmoeForCausalLM": _ArchTraits(
        qk_norm="full",
        moe="qwen",
        features="mixture-of-experts, q/k norm over the projection",
        defaults=(("rms_norm_eps", 1e-5),),
    ),
}
SUPPORTED_ARCHITECTURES = tuple(_ARCHITECTURES)
_NULLABLE = ("attn_logit_softcapping", "final_logit_softcapping", "sliding_window")

# Architectures users try that radixlm refuses, and the piece each lacks (the
# refusal names it; ``radixlm models`` lists them).
REFUSED_ARCHITECTURES: dict[str, str] = {
    "Gemma3ForConditionalGeneration": "Gemma 3's vision tower (serve the text model: a "
    "config.json naming Gemma3ForCausalLM)",
    "Phi3VForCausalLM": "Phi-3-vision's image encoder",
    "PhiMoEForCausalLM": "Phi-3.5-MoE's sparsemixer routing",
    "GemmaForCausalLM": "Gemma 1 (its config's hidden_act and norms differ from Gemma 2's)",
    "DeepseekV2ForCausalLM": "multi-head latent attention",
    "DeepseekV3ForCausalLM": "multi-head latent attention and grouped top-k routing",
    "Qwen3NextForCausalLM": "linear-attention (gated delta net) layers",
    "GptOssForCausalLM": "attention sinks and its expert biases",
    "Llama4ForConditionalGeneration": "chunked attention and the vision tower",
}


def architecture_features() -> dict[str, str]:
    """Each supported architecture and what it brings (``radixlm models``)."""
    return {name: traits.features for name, traits in _ARCHITECTURES.items()}


@dataclass(frozen=True)
class MoEConfig:
    """A mixture-of-experts MLP: each token's ``top_k`` experts by router softmax.

    num_experts, top_k: experts per layer, and how many each token uses.
    intermediate_size: each expert's SwiGLU width.
    normalize_top_k: the chosen experts' weights are divided by their sum (Mixtral
        always; Qwen-MoE and OLMoE when ``norm_topk_prob``).
    sparse_layers: the layers whose MLP is the experts (the others are dense, of
        ``ArchConfig.intermediate_size``).
    shared_expert_size: width of an expert every token uses, its output scaled by
        sigmoid(a learned gate) (Qwen2-MoE); None: no shared expert.
    """

    num_experts: int
    top_k: int
    intermediate_size: int
    normalize_top_k: bool
    sparse_layers: tuple[int, ...]
    shared_expert_size: int | None = None

    def __post_init__(self) -> None:
        if not 0 < self.top_k <= self.num_experts:
            raise ModelLoadError(
                f"num_experts_per_tok ({self.top_k}) must be between 1 and the number of "
                f"experts ({self.num_experts})"
            )
        if self.intermediate_size <= 0:
            raise ModelLoadError(
                f"the experts' intermediate size must be positive, got {self.intermediate_size}"
            )


@dataclass(frozen=True)
class RopeScaling:
    """RoPE scaling parameters (HF ``rope_scaling`` / ``rope_parameters``).

    Fields a type does not use keep their defaults. ``original_max_position_embeddings``
    falls back to the model's ``max_position_embeddings`` for llama3/yarn, like HF.
    """

    rope_type: str = "default"
    factor: float = 1.0
    original_max_position_embeddings: int | None = None
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    mscale: float | None = None  # yarn
    mscale_all_dim: float | None = None  # yarn
    attention_factor: float | None = None  # yarn: overrides the mscale-derived factor
    truncate: bool = True  # yarn: round the correction range to whole dims
    short_factor: tuple[float, ...] = ()  # longrope: per-frequency divisors within the original
    long_factor: tuple[float, ...] = ()  # longrope: ... and beyond it

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise UnsupportedArchitectureError(
                f"rope scaling type {self.rope_type!r} is not supported; "
                f"supported: {', '.join(ROPE_TYPES)}"
            )
        if self.rope_type != "default" and self.factor < 1.0:
            raise ModelLoadError(f"rope scaling factor must be >= 1, got {self.factor}")
        if self.rope_type == "longrope" and not (self.short_factor and self.long_factor):
            raise ModelLoadError("longrope scaling needs both short_factor and long_factor")

    @classmethod
    def from_dict(
        cls,
        d: dict[str, Any] | None,
        max_position_embeddings: int,
        original_max_position_embeddings: int | None = None,
    ) -> RopeScaling:
        """Parses an HF rope dict; None or an empty dict means no scaling.

        original_max_position_embeddings: the config's top-level key of that name (Phi-3
        keeps it there), used where the rope dict has none."""
        if not d:
            return cls()
        rope_type = d.get("rope_type", d.get("type", "default"))
        if rope_type == "su":  # Phi-3's first name for longrope
            rope_type = "longrope"
        original = d.get("original_max_position_embeddings", original_max_position_embeddings)
        if original is None and rope_type in ("llama3", "yarn", "longrope"):
            original = max_position_embeddings
        factor = d.get("factor")
        if factor is None and rope_type in ("yarn", "longrope"):
            factor = max_position_embeddings / original  # HF's fallback
        if rope_type == "longrope":
            return cls(
                rope_type=rope_type,
                factor=max(float(factor), 1.0),
                original_max_position_embeddings=original,
                attention_factor=d.get("attention_factor"),
                short_factor=tuple(float(x) for x in d.get("short_factor") or ()),
                long_factor=tuple(float(x) for x in d.get("long_factor") or ()),
            )
        optional = {
            k: d[k]
            for k in (
                "low_freq_factor",
                "high_freq_factor",
                "mscale",
                "mscale_all_dim",
                "attention_factor",
                "truncate",
            )
            if d.get(k) is not None
        }
        # HF treats beta_fast/beta_slow == 0 or None as "use the default".
        optional.update({k: float(d[k]) for k in ("beta_fast", "beta_slow") if d.get(k)})
        return cls(
            rope_type=rope_type,
            factor=float(factor or 1.0),
            original_max_position_embeddings=original,
            **optional,
        )


@dataclass(frozen=True)
class ArchConfig:
    """Shape and switches of a decoder-only model. Validated on construction.

    Raises ``UnsupportedArchitectureError`` for an architecture or feature radixlm
    does not implement, ``ModelLoadError`` for inconsistent values.

    Beyond Llama's fields:
      hidden_act: the MLP's gate activation, "silu" (SwiGLU) or "gelu_tanh" (GeGLU).
      qk_norm: "head", "full" or None (see ``_ArchTraits``).
      clip_qkv: q, k and v are clamped to [-clip_qkv, clip_qkv] (OLMoE); None: not.
      rotary_dim: the leading dims of each head RoPE rotates (Phi-4-mini: 3/4 of them).
      layer_windows: each layer's sliding window, None for full attention; empty: every
          layer full.
      attn_logit_softcap: attention scores s become c * tanh(s / c) (Gemma 2).
      final_logit_softcap: the same on the LM head's logits.
      query_pre_attn_scalar: the softmax scale is its inverse square root (Gemma),
          else head_dim's.
      gemma_norms: norms after each sublayer as well as before (Gemma), every norm
          computing ``x * (1 + w)``, and embeddings scaled by sqrt(hidden_size).
      local_rope_theta: RoPE base of the sliding layers, unscaled (Gemma 3); None:
          every layer uses ``rope_theta`` and ``rope_scaling``.
      moe: the mixture-of-experts MLP (``MoEConfig``); None: dense.
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = RopeScaling()
    max_position_embeddings: int = 2048
    attention_bias: bool = False  # bias on q/k/v
    o_proj_bias: bool = False
    mlp_bias: bool = False
    qk_norm: str | None = None
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    torch_dtype: str | None = None  # the checkpoint's dtype name, e.g. "bfloat16"
    hidden_act: str = "silu"
    clip_qkv: float | None = None
    rotary_dim: int | None = None
    layer_windows: tuple[int | None, ...] = ()
    attn_logit_softcap: float | None = None
    final_logit_softcap: float | None = None
    query_pre_attn_scalar: float | None = None
    gemma_norms: bool = False
    local_rope_theta: float | None = None
    moe: MoEConfig | None = None

    def __post_init__(self) -> None:
        if self.architecture not in _ARCHITECTURES:
            raise UnsupportedArchitectureError(_unsupported_message(self.architecture))
        positive = (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "max_position_embeddings",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ModelLoadError(f"config {name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(
                f"num_attention_heads ({self.num_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ModelLoadError(f"RoPE needs an even head_dim, got {self.head_dim}")
        if self.rotary_dim is not None and (
            self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.head_dim
        ):
            raise ModelLoadError(
                f"the rotary dims ({self.rotary_dim}) must be even and at most head_dim "
                f"({self.head_dim})"
            )
        if self.hidden_act not in ACTIVATIONS.values():
            raise UnsupportedArchitectureError(
                f"hidden_act {self.hidden_act!r} is not supported; supported: "
                f"{', '.join(sorted(ACTIVATIONS))}"
            )
        if self.layer_windows and len(self.layer_windows) != self.num_layers:
            raise ModelLoadError(
                f"layer_types names {len(self.layer_windows)} layers, the model has "
                f"{self.num_layers}"
            )
        for window in self.layer_windows:
            if window is not None and window <= 0:
                raise ModelLoadError(f"sliding_window must be positive, got {window}")
        for name in ("attn_logit_softcap", "final_logit_softcap", "clip_qkv"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ModelLoadError(f"config {name} must be positive, got {value}")
        if self.moe is not None and any(
            not 0 <= i < self.num_layers for i in self.moe.sparse_layers
        ):
            raise ModelLoadError("a mixture-of-experts layer index is out of range")

    @property
    def rope_context_len(self) -> int:
        """Positions RoPE must cover. Dynamic NTK is computed once for its extended
        length, ``max_position_embeddings * factor`` (see ``rope.py``)."""
        if self.rope_scaling.rope_type == "dynamic":
            return int(self.max_position_embeddings * self.rope_scaling.factor)
        return self.max_position_embeddings

    @property
    def max_context_len(self) -> int:
        """Longest sequence radixlm serves: the RoPE length."""
        return self.rope_context_len

    @property
    def sliding_window(self) -> int | None:
        """The widest sliding window of any layer; None when every layer attends fully."""
        windows = [w for w in self.layer_windows if w is not None]
        return max(windows) if windows else None

    def window_of(self, layer: int) -> int | None:
        """Layer ``layer``'s sliding window, None for full attention."""
        return self.layer_windows[layer] if self.layer_windows else None

    @property
    def rotary_dims(self) -> int:
        """The leading dims of each head that RoPE rotates."""
        return self.rotary_dim or self.head_dim

    @property
    def attention_scale(self) -> float:
        """Softmax scale the attention backend must use."""
        if self.query_pre_attn_scalar is not None:
            return self.query_pre_attn_scalar**-0.5
        return self.head_dim**-0.5

    @property
    def llama_layers(self) -> bool:
        """Whether every layer is exactly a Llama layer (norm, attention with full
        rotary dims and at most per-head q/k norm, norm, SwiGLU MLP; no window, cap,
        clip or experts): what radixlm's C++ decoder-layer kernels compute."""
        return self.llama_attention and self.moe is None

    @property
    def llama_attention(self) -> bool:
        """Whether every layer is a Llama layer but for its MLP, which may be a
        mixture of SwiGLU experts (``moe``): what the C++ decode step computes over
        quantized experts."""
        return (
            self.hidden_act == "silu"
            and self.qk_norm in (None, "head")
            and self.clip_qkv is None
            and self.rotary_dims == self.head_dim
            and self.sliding_window is None
            and self.attn_logit_softcap is None
            and self.final_logit_softcap is None
            and not self.gemma_norms
        )

    def is_sparse(self, layer: int) -> bool:
        """Whether layer ``layer``'s MLP is the mixture of experts."""
        return self.moe is not None and layer in self.moe.sparse_layers

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ArchConfig:
        """Parses a HF ``config.json`` dict.

        Raises:
            UnsupportedArchitectureError: unknown architecture, activation or rope type.
            ModelLoadError: a required key is missing or a value is inconsistent.
        """
        architecture = _architecture(d)
        traits = _ARCHITECTURES[architecture]
        # an explicit null keeps its meaning where null means "off"
        d = dict(traits.defaults) | {k: v for k, v in d.items() if v is not None or k in _NULLABLE}
        _check_supported_features(d)
        try:
            return cls(architecture=architecture, **_fields(d, traits))
        except KeyError as e:
            raise ModelLoadError(f"config.json of {architecture} lacks key {e.args[0]!r}") from e

    @classmethod
    def from_model_dir(cls, model_dir: str | Path) -> ArchConfig:
        """Reads ``model_dir/config.json``.

        Raises:
            ModelNotFoundError: the directory or its config.json does not exist.
            ModelLoadError: config.json is not valid JSON (and see ``from_dict``).
        """
        path = Path(model_dir) / "config.json"
        if not Path(model_dir).is_dir():
            raise ModelNotFoundError(f"model directory {str(model_dir)!r} does not exist")
        if not path.is_file():
            raise ModelNotFoundError(f"model directory {str(model_dir)!r} has no config.json")
        try:
            return cls.from_dict(json.loads(path.read_text()))
        except json.JSONDecodeError as e:
            raise ModelLoadError(f"{str(path)!r} is not valid JSON: {e}") from e


def _unsupported_message(architecture: str) -> str:
    missing = REFUSED_ARCHITECTURES.get(architecture)
    reason = f" (it needs {missing}, which radixlm does not implement)" if missing else ""
    return (
        f"architecture {architecture!r} is not supported{reason}; "
        f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
    )


def _architecture(d: dict[str, Any]) -> str:
    architectures = d.get("architectures") or []
    if len(architectures) != 1:
        raise UnsupportedArchitectureError(
            f"config.json must name exactly one architecture, got {architectures!r}; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    if architectures[0] not in _ARCHITECTURES:
        raise UnsupportedArchitectureError(_unsupported_message(architectures[0]))
    return architectures[0]


def _check_supported_features(d: dict[str, Any]) -> None:
    act = _activation_key(d)
    if act not in ACTIVATIONS:
        raise UnsupportedArchitectureError(
            f"hidden_act {act!r} is not supported; supported: {', '.join(sorted(ACTIVATIONS))}"
        )
    if d.get("use_bidirectional_attention"):
        raise UnsupportedArchitectureError(
            "use_bidirectional_attention (an encoder) is not supported; radixlm serves decoders"
        )


def _activation_key(d: dict[str, Any]) -> str:
    return d.get("hidden_activation") or d.get("hidden_act") or "silu"


def _fields(d: dict[str, Any], traits: _ArchTraits) -> dict[str, Any]:
    """Maps config.json keys to ArchConfig fields (KeyError on a missing required key)."""
    hidden, num_heads = d["hidden_size"], d["num_attention_heads"]
    num_layers = d["num_hidden_layers"]
    max_pos = d.get("max_position_embeddings", 2048)
    head_dim = d.get("head_dim") or hidden // num_heads
    rope, local_rope = _rope_dicts(d)
    partial = float(d.get("partial_rotary_factor", rope.get("partial_rotary_factor", 1.0)))
    rotary_dim = int(head_dim * partial)
    bias = bool(d.get("attention_bias", False))
    original = d.get("original_max_position_embeddings")
    return {
        "vocab_size": d["vocab_size"],
        "hidden_size": hidden,
        "intermediate_size": d["intermediate_size"],
        "num_layers": num_layers,
        "num_heads": num_heads,
        "num_kv_heads": d.get("num_key_value_heads") or num_heads,
        "head_dim": head_dim,
        "rms_norm_eps": float(d.get("rms_norm_eps", 1e-6)),
        "rope_theta": float(rope.get("rope_theta", d.get("rope_theta", 10000.0))),
        "rope_scaling": RopeScaling.from_dict(_scaling_only(rope), max_pos, original),
        "max_position_embeddings": max_pos,
        "attention_bias": bias if traits.qkv_bias is None else traits.qkv_bias,
        "o_proj_bias": bias and traits.o_bias_follows_config,
        "mlp_bias": bool(d.get("mlp_bias", False)),
        "qk_norm": traits.qk_norm,
        "tie_word_embeddings": bool(d.get("tie_word_embeddings", traits.gemma)),
        "bos_token_id": d.get("bos_token_id"),
        "eos_token_ids": _eos_ids(d.get("eos_token_id")),
        "torch_dtype": d.get("dtype") or d.get("torch_dtype"),
        "hidden_act": ACTIVATIONS[_activation_key(d)],
        "clip_qkv": d.get("clip_qkv"),
        "rotary_dim": None if rotary_dim == head_dim else rotary_dim,
        "layer_windows": _layer_windows(d, traits, num_layers),
        "attn_logit_softcap": d.get("attn_logit_softcapping") if traits.gemma else None,
        "final_logit_softcap": d.get("final_logit_softcapping") if traits.gemma else None,
        "query_pre_attn_scalar": d.get("query_pre_attn_scalar") if traits.gemma else None,
        "gemma_norms": traits.gemma,
        "local_rope_theta": local_rope,
        "moe": _moe(d, traits, num_layers),
    }


def _rope_dicts(d: dict[str, Any]) -> tuple[dict[str, Any], float | None]:
    """(the rope dict of the full-attention layers, the sliding layers' own RoPE base).

    transformers 5.x folds rope_theta into rope_parameters, per layer type where the
    types differ (Gemma 3); 4.x keeps it top-level with ``rope_local_base_freq``."""
    rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
    if "full_attention" in rope or "sliding_attention" in rope:
        full, local = rope.get("full_attention") or {}, rope.get("sliding_attention") or {}
        if _scaling_only(local).get("rope_type", "default") != "default":
            raise UnsupportedArchitectureError("RoPE scaling on sliding layers is not supported")
        theta = local.get("rope_theta")
        return full, None if theta is None else float(theta)
    local_theta = d.get("rope_local_base_freq")
    return rope, None if local_theta is None else float(local_theta)


def _scaling_only(rope: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in rope.items() if k not in ("rope_theta", "partial_rotary_factor")}


def _eos_ids(eos: int | list[int] | None) -> tuple[int, ...]:
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (eos,)


def _layer_windows(
    d: dict[str, Any], traits: _ArchTraits, num_layers: int
) -> tuple[int | None, ...]:
    """Each layer's sliding window (None: full attention); () when every layer is full.

    ``layer_types`` (transformers 5.x, and Gemma 3 and Qwen2 in 4.x) names each layer
    "sliding_attention" or "full_attention"; without it, Gemma 2 alternates sliding
    and global layers, Gemma 3 has ``sliding_window_pattern`` - 1 sliding layers per
    global one, and every other family slides every layer when its switch is on."""
    window = d.get("sliding_window")
    if window is None or traits.sliding_window_flag == "":
        return ()
    if traits.sliding_window_flag is not None and not d.get(traits.sliding_window_flag):
        return ()
    window = int(window)
    types = d.get("layer_types")
    if types is None and traits.gemma:
        pattern = d.get("sliding_window_pattern") or d.get("_sliding_window_pattern") or 2
        types = [
            "full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
            for i in range(num_layers)
        ]
    if types is None and traits.sliding_window_flag == "use_sliding_window":
        # Qwen 4.x: the layers from max_window_layers on slide
        start = d.get("max_window_layers", 0)
        types = ["sliding_attention" if i >= start else "full_attention" for i in range(num_layers)]
    if types is None:
        return (window,) * num_layers
    unknown = set(types) - {"sliding_attention", "full_attention"}
    if unknown:
        raise UnsupportedArchitectureError(f"layer types {sorted(unknown)} are not supported")
    windows = tuple(window if t == "sliding_attention" else None for t in types)
    return windows if any(w is not None for w in windows) else ()


def _moe(d: dict[str, Any], traits: _ArchTraits, num_layers: int) -> MoEConfig | None:
    if traits.moe is None:
        return None
    if traits.moe == "mixtral":
        experts, normalize = d["num_local_experts"], True
        sparse = tuple(range(num_layers))
        inter = d["intermediate_size"]
    else:
        experts = d.get("num_experts") or d["num_local_experts"]
        normalize = bool(d.get("norm_topk_prob", False))
        step = d.get("decoder_sparse_step", 1) or 1
        dense = set(d.get("mlp_only_layers") or ())
        sparse = tuple(i for i in range(num_layers) if i not in dense and (i + 1) % step == 0)
        inter = d.get("moe_intermediate_size") or d["intermediate_size"]
    shared = d.get("shared_expert_intermediate_size") or None
    return MoEConfig(
        num_experts=experts,
        top_k=d["num_experts_per_tok"],
        intermediate_size=inter,
        normalize_top_k=normalize,
        sparse_layers=sparse,
        shared_expert_size=shared,
    )
