"""A user-written choices method, as an SGLang program would write one (a subclass of
``ChoicesSamplingMethod`` called with keywords), shared by the tests of every backend."""

from __future__ import annotations

from radixlm.choices import ChoicesDecision, ChoicesSamplingMethod


class LeastLikely(ChoicesSamplingMethod):
    """The choice with the lowest mean logprob (the opposite of the default, so a test
    sees that this method decided), and what it was called with as the meta info."""

    def __init__(self, unconditional: bool = False) -> None:
        self.unconditional = unconditional

    @property
    def requires_unconditional_logprobs(self) -> bool:
        return self.unconditional

    def __call__(
        self,
        *,
        choices,
        normalized_prompt_logprobs,
        input_token_logprobs,
        output_token_logprobs,
        unconditional_token_logprobs=None,
    ):
        worst = normalized_prompt_logprobs.index(min(normalized_prompt_logprobs))
        meta = {
            "normalized": normalized_prompt_logprobs,
            "input": input_token_logprobs,
            "output": output_token_logprobs,
            "unconditional": unconditional_token_logprobs,
        }
        return ChoicesDecision(choices[worst], meta)
