"""Architecture config of a Llama-family decoder, parsed from a HF ``config.json``.

Both config layouts are read: transformers 4.x (``rope_theta`` + ``rope_scaling``
at top level, ``torch_dtype``) and 5.x (``rope_parameters`` holding both, ``dtype``).

Every supported architecture is a Llama decoder plus a few switches
(``_ArchTraits``): Qwen2 always has a q/k/v bias, Qwen3 normalises q and k per
head, Mistral has no biases and a sliding window.

Sliding windows: radixlm always runs full causal attention. A model trained with
a sliding window W attends exactly like full attention while a sequence is at most
W tokens long, so ``max_context_len`` is capped at W and the two agree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radixlm.runtime.errors import ModelLoadError, ModelNotFoundError, UnsupportedArchitectureError

__all__ = ["ArchConfig", "RopeScaling", "SUPPORTED_ARCHITECTURES", "ROPE_TYPES"]

ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")


@dataclass(frozen=True)
class _ArchTraits:
    """What distinguishes one architecture from plain Llama.

    qkv_bias: True/False forces the q/k/v bias; None reads ``attention_bias``.
    o_bias_follows_config: o_proj has a bias iff ``attention_bias`` (Llama, Qwen3).
    qk_norm: per-head RMSNorm on q and k before RoPE (Qwen3).
    sliding_window_flag: config key that switches the sliding window on; None
        means a set ``sliding_window`` is always used (Mistral); "" means never.
    """

    qkv_bias: bool | None = None
    o_bias_follows_config: bool = True
    qk_norm: bool = False
    sliding_window_flag: str | None = ""


_ARCHITECTURES: dict[str, _ArchTraits] = {
    "LlamaForCausalLM": _ArchTraits(),
    "MistralForCausalLM": _ArchTraits(
        qkv_bias=False, o_bias_follows_config=False, sliding_window_flag=None
    ),
    "Qwen2ForCausalLM": _ArchTraits(
        qkv_bias=True, o_bias_follows_config=False, sliding_window_flag="use_sliding_window"
    ),
    "Qwen3ForCausalLM": _ArchTraits(qk_norm=True, sliding_window_flag="use_sliding_window"),
}
SUPPORTED_ARCHITECTURES = tuple(_ARCHITECTURES)


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

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise UnsupportedArchitectureError(
                f"rope scaling type {self.rope_type!r} is not supported; "
                f"supported: {', '.join(ROPE_TYPES)}"
            )
        if self.rope_type != "default" and self.factor < 1.0:
            raise ModelLoadError(f"rope scaling factor must be >= 1, got {self.factor}")

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None, max_position_embeddings: int) -> RopeScaling:
        """Parses an HF rope dict; None or an empty dict means no scaling."""
        if not d:
            return cls()
        rope_type = d.get("rope_type", d.get("type", "default"))
        original = d.get("original_max_position_embeddings")
        if original is None and rope_type in ("llama3", "yarn"):
            original = max_position_embeddings
        factor = d.get("factor")
        if factor is None and rope_type == "yarn":
            factor = max_position_embeddings / original  # HF's fallback for yarn
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
    """Shape and switches of a Llama-family decoder. Validated on construction.

    Raises ``UnsupportedArchitectureError`` for an architecture or feature radixlm
    does not implement, ``ModelLoadError`` for inconsistent values.
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
    qk_norm: bool = False
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    sliding_window: int | None = None  # None: not used (see the module docstring)
    torch_dtype: str | None = None  # the checkpoint's dtype name, e.g. "bfloat16"

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
        if self.sliding_window is not None and self.sliding_window <= 0:
            raise ModelLoadError(f"sliding_window must be positive, got {self.sliding_window}")

    @property
    def rope_context_len(self) -> int:
        """Positions RoPE must cover. Dynamic NTK is computed once for its extended
        length, ``max_position_embeddings * factor`` (see ``rope.py``)."""
        if self.rope_scaling.rope_type == "dynamic":
            return int(self.max_position_embeddings * self.rope_scaling.factor)
        return self.max_position_embeddings

    @property
    def max_context_len(self) -> int:
        """Longest sequence radixlm serves: the RoPE length, capped at the sliding
        window because radixlm runs full attention (see the module docstring)."""
        if self.sliding_window is not None:
            return min(self.rope_context_len, self.sliding_window)
        return self.rope_context_len

    @property
    def attention_scale(self) -> float:
        """Softmax scale the attention backend must use."""
        return self.head_dim**-0.5

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ArchConfig:
        """Parses a HF ``config.json`` dict.

        Raises:
            UnsupportedArchitectureError: unknown architecture, activation or rope type.
            ModelLoadError: a required key is missing or a value is inconsistent.
        """
        architecture = _architecture(d)
        traits = _ARCHITECTURES[architecture]
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
    return (
        f"architecture {architecture!r} is not supported; "
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
    act = d.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedArchitectureError(f"hidden_act {act!r} is not supported; only 'silu'")
    rope = d.get("rope_parameters") or {}
    partial = d.get("partial_rotary_factor", rope.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise UnsupportedArchitectureError(f"partial_rotary_factor {partial} is not supported")


def _fields(d: dict[str, Any], traits: _ArchTraits) -> dict[str, Any]:
    """Maps config.json keys to ArchConfig fields (KeyError on a missing required key)."""
    hidden, num_heads = d["hidden_size"], d["num_attention_heads"]
    max_pos = d.get("max_position_embeddings", 2048)
    # transformers 5.x folds rope_theta into rope_parameters; 4.x keeps it top-level.
    rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
    bias = bool(d.get("attention_bias", False))
    return {
        "vocab_size": d["vocab_size"],
        "hidden_size": hidden,
        "intermediate_size": d["intermediate_size"],
        "num_layers": d["num_hidden_layers"],
        "num_heads": num_heads,
        "num_kv_heads": d.get("num_key_value_heads") or num_heads,
        "head_dim": d.get("head_dim") or hidden // num_heads,
        "rms_norm_eps": float(d.get("rms_norm_eps", 1e-6)),
        "rope_theta": float(rope.get("rope_theta", d.get("rope_theta", 10000.0))),
        "rope_scaling": RopeScaling.from_dict(_scaling_only(rope), max_pos),
        "max_position_embeddings": max_pos,
        "attention_bias": bias if traits.qkv_bias is None else traits.qkv_bias,
        "o_proj_bias": bias and traits.o_bias_follows_config,
        "mlp_bias": bool(d.get("mlp_bias", False)),
        "qk_norm": traits.qk_norm,
        "tie_word_embeddings": bool(d.get("tie_word_embeddings", False)),
        "bos_token_id": d.get("bos_token_id"),
        "eos_token_ids": _eos_ids(d.get("eos_token_id")),
        "sliding_window": _sliding_window(d, traits),
        "torch_dtype": d.get("dtype") or d.get("torch_dtype"),
    }


def _scaling_only(rope: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in rope.items() if k != "rope_theta"}


def _eos_ids(eos: int | list[int] | None) -> tuple[int, ...]:
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (eos,)


def _sliding_window(d: dict[str, Any], traits: _ArchTraits) -> int | None:
    window = d.get("sliding_window")
    if window is None or traits.sliding_window_flag == "":
        return None
    if traits.sliding_window_flag is not None and not d.get(traits.sliding_window_flag):
        return None
    return int(window)
