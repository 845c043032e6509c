"""RequestBuilder's checks of a prompt, on a real engine's tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from radixlm.runtime.entrypoints.engine import Engine
from radixlm.runtime.errors import InvalidRequestError
from radixlm.runtime.models import write_random_model

CONFIG = {
    "architectures": ["Qwen2ForCausalLM"],
    "vocab_size": 128,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 64,
}


def test_a_prompt_that_encodes_to_no_tokens_is_refused(tmp_path: Path) -> None:
    """A Qwen2 random tokenizer adds no BOS and drops words it does not know: such a
    prompt has no token to compute from (it once stalled the scheduler for good)."""
    model = write_random_model(tmp_path, CONFIG, torch.float32)
    with Engine(model_path=str(model), max_total_tokens=256, dtype="float32") as engine:
        assert engine.tokenizer("w9 w10")["input_ids"] == []
        with pytest.raises(InvalidRequestError, match="encodes to no tokens"):
            engine.generate("w9 w10", {"max_new_tokens": 2})
        # the engine still serves the next request
        out = engine.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 2})
        assert len(out["output_ids"]) == 2
