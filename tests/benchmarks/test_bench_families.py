"""bench_families.py's derived figures: the batch-8 decode step from batch_8 and its
prompt pass, the weights a step reads, and which way each workload's ratio points."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import bench_families as bench  # noqa: E402


def test_the_decode_step_is_what_the_later_tokens_add_to_the_prompt_pass() -> None:
    # 512 tokens at 128 tok/s: 4 s, of which 0.85 s is the prompt pass; 63 steps after
    runs = {"batch_8": [128.0, 256.0], "batch_8_prompt": [0.85, 0.425]}
    assert bench.decode_steps_ms(runs) == pytest.approx([50.0, 25.0])


def test_a_rate_ratio_points_up_and_a_time_ratio_down() -> None:
    assert bench.faster("batch_8", 110.0, 100.0) == pytest.approx(1.1)
    assert bench.faster("batch_8_prompt", 1.0, 1.1) == pytest.approx(1.1)
    assert bench.faster("few_shot_one_call", 2.0, 3.0) == pytest.approx(1.5)


def test_a_step_reads_every_weight_but_an_untied_embedding(monkeypatch) -> None:
    monkeypatch.setitem(
        bench.FAMILIES, "tied", {"vocab_size": 10, "hidden_size": 4, "tie_word_embeddings": True}
    )
    monkeypatch.setitem(
        bench.FAMILIES, "untied", {"vocab_size": 10, "hidden_size": 4, "tie_word_embeddings": False}
    )
    monkeypatch.setattr(bench, "parameters", lambda family: 1000)
    assert bench.step_bytes("tied") == 2000
    assert bench.step_bytes("untied") == 2 * (1000 - 40)
