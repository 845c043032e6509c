"""Random-weight checkpoints of every family: radixlm loads each, transformers loads
each with no tensor missing or left over, and both compute the same logits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from radixlm.runtime.models import SUPPORTED_ARCHITECTURES, ArchConfig, write_random_model
from tests.runtime.models.helpers import KVHarness, assert_like_transformers, exact_twin, hf_logits

BASE: dict[str, Any] = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-5,
}
EXPERTS = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16}
FAMILY: dict[str, dict[str, Any]] = {
    "Gemma2ForCausalLM": {"head_dim": 8, "query_pre_attn_scalar": 8},
    "Gemma3ForCausalLM": {"head_dim": 8},
    "Qwen3MoeForCausalLM": EXPERTS,
    "Qwen2MoeForCausalLM": {**EXPERTS, "shared_expert_intermediate_size": 24},
    "MixtralForCausalLM": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "OlmoeForCausalLM": {"num_experts": 4, "num_experts_per_tok": 2},
}


@pytest.mark.parametrize("architecture", SUPPORTED_ARCHITECTURES)
def test_every_family_is_written_as_its_checkpoints_are(architecture: str, tmp_path: Path) -> None:
    config = {"architectures": [architecture], **BASE, **FAMILY.get(architecture, {})}
    path = write_random_model(tmp_path, config, torch.float32, seed=1)
    assert len(list(path.glob("model-*.safetensors"))) == 3  # a shard per layer, and the rest
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(
        path, output_loading_info=True, attn_implementation="eager"
    )
    assert not any(info.values()), info
    hf.eval()
    harness = KVHarness(ArchConfig.from_model_dir(path))
    model = harness.load(path)
    ids = torch.randint(3, 64, (17,), generator=torch.Generator().manual_seed(2)).tolist()
    (ours,) = harness.run(model, [("a", ids)])
    assert_like_transformers([ours], hf, exact_twin(hf), [ids])
    assert hf_logits(hf, ids).std() > 0.1  # not a model that says nothing
