"""Benchmark requests built from a seed: prompts are token ids of the model's own
vocabulary, sent as ids, so every prompt has exactly its stated length on any server
that serves the same tokenizer; every request is forced to its output length.

    random                   input / output lengths drawn uniformly from
                             [max(1, int(L * range_ratio)), L] (range_ratio 1: fixed)
    generated-shared-prefix  num_groups system prompts, each shared by
                             prompts_per_group questions; the order is shuffled so
                             groups interleave as independent users' requests would
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["BenchRequest", "random_requests", "shared_prefix_requests", "token_pool"]


@dataclass(frozen=True)
class BenchRequest:
    """One request: its prompt's token ids and how many tokens it must generate."""

    prompt_ids: tuple[int, ...]
    num_output_tokens: int

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)


def token_pool(vocab_size: int, special_ids: list[int] | set[int]) -> list[int]:
    """The ids a prompt may use: the vocabulary less its special tokens (a BOS or an
    end-of-turn id inside a prompt would change how the server treats it)."""
    special = set(special_ids)
    pool = [i for i in range(vocab_size) if i not in special]
    if not pool:
        raise ValueError(f"no ordinary token ids in a vocabulary of {vocab_size}")
    return pool


def _length(rng: random.Random, target: int, range_ratio: float) -> int:
    return rng.randint(max(1, int(target * range_ratio)), target)


def _ids(rng: random.Random, pool: list[int], n: int) -> tuple[int, ...]:
    return tuple(rng.choice(pool) for _ in range(n))


def random_requests(
    pool: list[int],
    num_prompts: int,
    input_len: int,
    output_len: int,
    range_ratio: float,
    seed: int,
) -> list[BenchRequest]:
    """``num_prompts`` prompts of random ids; lengths uniform in [L * range_ratio, L].

    Raises:
        ValueError: a non-positive count or length, or range_ratio outside [0, 1].
    """
    _check_positive(num_prompts=num_prompts, input_len=input_len, output_len=output_len)
    if not 0.0 <= range_ratio <= 1.0:
        raise ValueError(f"range_ratio must be in [0, 1], got {range_ratio}")
    rng = random.Random(seed)
    out = []
    for _ in range(num_prompts):
        num_in = _length(rng, input_len, range_ratio)
        num_out = _length(rng, output_len, range_ratio)
        out.append(BenchRequest(_ids(rng, pool, num_in), num_out))
    return out


def shared_prefix_requests(
    pool: list[int],
    num_groups: int,
    prompts_per_group: int,
    system_prompt_len: int,
    question_len: int,
    output_len: int,
    seed: int,
) -> list[BenchRequest]:
    """``num_groups * prompts_per_group`` prompts: a group's system prompt, then a
    question of its own; shuffled (with the seed) so groups interleave.

    Raises:
        ValueError: a non-positive count or length.
    """
    _check_positive(
        num_groups=num_groups,
        prompts_per_group=prompts_per_group,
        system_prompt_len=system_prompt_len,
        question_len=question_len,
        output_len=output_len,
    )
    rng = random.Random(seed)
    out = []
    for _ in range(num_groups):
        system = _ids(rng, pool, system_prompt_len)
        for _ in range(prompts_per_group):
            out.append(BenchRequest(system + _ids(rng, pool, question_len), output_len))
    rng.shuffle(out)
    return out


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
