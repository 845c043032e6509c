"""``Runtime``: DSL programs on radixlm's engine, in this process.

SGLang's ``sgl.Runtime()`` launches a server process and talks HTTP to it; ours
runs the engine in-process (its loop thread batches every program's requests), so
``Runtime(**engine_options)`` takes ``Engine``'s options (``model_path``, ``dtype``,
``max_total_tokens``, ...). The HTTP backend comes with the server.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

from radixlm.backends.scoring import score_choices_by_tokens
from radixlm.choices import ChoiceScores
from radixlm.runtime.errors import InvalidRequestError
from radixlm.runtime.io.chat_template import (
    ChatTemplate,
    adds_special_tokens,
    chat_template_from_tokenizer,
)
from radixlm.runtime.io.messages import GenerateOutput, GenerateRequest, StreamChunk
from radixlm.runtime.io.sampling_params import SamplingParams

__all__ = ["Runtime"]


class Runtime:
    """The in-process backend: an ``Engine`` plus the model's chat template.

    Args: ``Engine``'s options; or ``engine=`` an engine already built (shared, not
    shut down by ``shutdown``).
    """

    def __init__(self, engine: Any = None, **engine_options: Any) -> None:
        from radixlm.runtime.entrypoints.engine import Engine

        self._owns_engine = engine is None
        self.engine = Engine(**engine_options) if engine is None else engine
        self.tokenizer = self.engine.tokenizer
        self._chat_template = chat_template_from_tokenizer(self.tokenizer)
        self._bos = self.tokenizer.bos_token

    @property
    def chat_template(self) -> ChatTemplate:
        return self._chat_template

    @property
    def is_multimodal(self) -> bool:
        return False  # radixlm's models are text-only

    def tokenize(self, text: str) -> list[int]:
        add_special = adds_special_tokens(text, self._bos)
        return self.tokenizer(text, add_special_tokens=add_special)["input_ids"]

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=False)

    def generate(self, requests: Sequence[GenerateRequest]) -> list[GenerateOutput]:
        return self.engine.generate_requests(list(requests))

    def stream(self, request: GenerateRequest) -> Iterator[StreamChunk]:
        return self.engine.stream_requests([dataclasses.replace(request, stream=True)])

    def score_choices(self, text: str, choices: Sequence[str], unconditional: bool) -> ChoiceScores:
        return score_choices_by_tokens(self, text, choices, unconditional)

    def cache_prefix(self, token_ids: Sequence[int]) -> None:
        # Without a radix cache the KV would be computed only to be thrown away.
        if token_ids and not self.engine.config.cache.disable_radix_cache:
            request = GenerateRequest(
                input_ids=tuple(token_ids), sampling_params=SamplingParams(max_new_tokens=0)
            )
            self.engine.generate_requests([request])

    def flush_cache(self) -> bool:
        try:
            self.engine.flush_cache()
        except InvalidRequestError:
            return False
        return True

    def get_server_info(self) -> dict[str, Any]:
        stats = self.engine.get_stats()
        return {
            "model_path": str(self.engine.config.model.model_path or "default"),
            "context_length": self.engine.context_length,
            "chat_template": self._chat_template.name,
            "stats": dataclasses.asdict(stats),
        }

    def shutdown(self) -> None:
        if self._owns_engine:
            self.engine.shutdown()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
