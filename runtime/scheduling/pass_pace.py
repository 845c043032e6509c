"""How many prompt tokens a pass may take while requests decode, so that the decoding
requests' time per output token stays within ``target_tpot_ms``.

A decoding request gains one token per pass it is in (more when speculating), so the
time of each pass it shares is its time per output token. Prompt chunks in the same
pass lengthen it: on a 2-core CPU a pass of 1,000 prompt tokens takes ~0.75 s, 14
times a decode pass of 16 rows, and a request decoding beside a stream of such passes
misses any interactive pace. Under a target, a pass that carries decodes takes
only the prompt tokens the target leaves room for; a pass without decodes keeps the
whole chunk (no one waits on it token by token), and so does every pass without a
target.

A pass's time is fitted online, from the passes the engine ran::

    seconds = base + per_token * tokens    (tokens: decodes, proposals and prompt tokens)

by least squares over recent passes: each pass's weight shrinks by ``FORGET`` with every
later pass, so the fit follows the machine's load and the contexts' growth. Until
``WARMUP_PASSES`` passes are seen, there is no bound. While prompts
wait, a pass takes ``MIN_PROMPT_TOKENS`` of them at least, so the queue moves even when
the decodes alone fill the target (the target then cannot hold: the batch is too large
for it, and ``max_running_requests`` is the knob).
"""

from __future__ import annotations

__all__ = ["FORGET", "MIN_PROMPT_TOKENS", "WARMUP_PASSES", "PassPace"]

FORGET = 0.95  # a pass's weight in the fit after each later one (~20 passes' memory)
WARMUP_PASSES = 8
MIN_PROMPT_TOKENS = 64
# passes whose sizes vary less than this (variance over the squared mean) cannot tell
# base from per_token apart
_MIN_SPREAD = 0.01


class PassPace:
    """The fit of pass times and the prompt budget it gives (see the module docstring).

    Args:
        target_s: the time per output token to keep decoding requests within, in
            seconds; None: no bound (``prompt_budget`` always returns None).
    """

    def __init__(self, target_s: float | None) -> None:
        self.target_s = target_s
        self._passes = 0
        # weighted sums of 1, x, x^2, y, x*y (x: tokens, y: seconds)
        self._w = self._x = self._xx = self._y = self._xy = 0.0

    def observe(self, num_tokens: int, seconds: float) -> None:
        """Adds a pass that computed ``num_tokens`` tokens in ``seconds``."""
        if num_tokens <= 0 or seconds <= 0:
            return
        x, y = float(num_tokens), seconds
        self._w = FORGET * self._w + 1.0
        self._x = FORGET * self._x + x
        self._xx = FORGET * self._xx + x * x
        self._y = FORGET * self._y + y
        self._xy = FORGET * self._xy + x * y
        self._passes += 1

    def fit(self) -> tuple[float, float] | None:
        """(base, per_token) in seconds, both >= 0; None before the warm-up ends.

        Passes all of one size cannot tell the two apart: their time is then read as
        all per token (the larger, so the safer, estimate of a bigger pass)."""
        if self._passes < WARMUP_PASSES:
            return None
        spread = self._w * self._xx - self._x * self._x  # w^2 times the sizes' variance
        per_token = self._y / self._x
        if spread >= _MIN_SPREAD * self._x * self._x:
            slope = (self._w * self._xy - self._x * self._y) / spread
            if slope > 0:
                per_token = slope
        base = max(0.0, (self._y - per_token * self._x) / self._w)
        return base, per_token

    def prompt_budget(self, num_decode_tokens: int) -> int | None:
        """The most prompt tokens a pass with ``num_decode_tokens`` decode tokens may
        take (``MIN_PROMPT_TOKENS`` at least); None: no bound (no target, no decodes, or
        the fit is still warming up)."""
        if self.target_s is None or num_decode_tokens <= 0:
            return None
        fit = self.fit()
        if fit is None:
            return None
        base, per_token = fit
        room = (self.target_s - base) / per_token - num_decode_tokens
        return max(MIN_PROMPT_TOKENS, int(room))
