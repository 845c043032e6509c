"""``radixlm run NAME``: a chat in the terminal, as ``ollama run`` opens one.

A ``>>> `` prompt; each reply streams as it is generated; the whole conversation is
rendered under the model's chat template every turn, so the radix cache makes a turn's
prefill only its new message (the turns before are the cached prefix). ``/clear``
starts over, ``/bye`` (or Ctrl-D) leaves, Ctrl-C stops the reply being generated (the
request is aborted and its turn forgotten) and returns to the prompt.
"""

from __future__ import annotations

import select
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from radixlm.runtime.entrypoints.engine import Engine

__all__ = ["PROMPT", "ChatSession", "read_terminal_line"]

PROMPT = ">>> "
_HELP = "commands: /clear (start over), /bye (leave); Ctrl-C stops a reply"
# How often a prompt waiting for a line wakes, so that a Ctrl-C is seen at once
_WAKE_S = 0.1


def read_terminal_line(prompt: str) -> str:
    """``input(prompt)`` that sees Ctrl-C while it waits. The kernel may hand the SIGINT to
    any thread (the engine's run torch); Python raises KeyboardInterrupt in this thread
    only when it next runs, which a blocking read would put off until a line is typed,
    so the wait wakes every ``_WAKE_S``. Raises EOFError at the end of input."""
    sys.stdout.write(prompt)
    sys.stdout.flush()
    while not select.select([sys.stdin], [], [], _WAKE_S)[0]:
        pass
    line = sys.stdin.readline()
    if not line:
        raise EOFError
    return line.rstrip("\n")


@dataclass
class ChatSession:
    """One conversation with ``engine``.

    params: the sampling parameters of every reply (``max_new_tokens``, ...).
    verbose: after each reply, one line of its token counts (prompt, cached, generated).
    """

    engine: Engine
    params: dict[str, Any]
    verbose: bool = False
    out: TextIO = field(default_factory=lambda: sys.stdout)
    messages: list[dict[str, str]] = field(default_factory=list)

    def run(self, read_line: Callable[[str], str] = input) -> int:
        """Reads turns until ``/bye`` or end of input; returns the exit status (0)."""
        while True:
            try:
                line = read_line(PROMPT).strip()
            except EOFError:
                self.out.write("\n")
                return 0
            except KeyboardInterrupt:
                self.out.write("\nUse /bye or Ctrl-D to leave.\n")
                continue
            if line == "/bye":
                return 0
            if line == "/clear":
                self.messages.clear()
                self.out.write("Cleared the conversation.\n")
            elif line.startswith("/"):
                self.out.write(f"{_HELP}\n")
            elif line:
                self.turn(line)

    def turn(self, text: str) -> str | None:
        """Streams the reply to ``text`` and keeps both in the conversation; None (and
        nothing kept) when Ctrl-C stopped it."""
        self.messages.append({"role": "user", "content": text})
        stream = self.engine.generate(self._prompt(), self.params, stream=True)
        reply, meta = "", {}
        try:
            for chunk in stream:  # type: ignore[union-attr]
                self.out.write(chunk["delta"])
                self.out.flush()
                reply, meta = chunk["text"], chunk["meta_info"]
        except KeyboardInterrupt:
            stream.close()  # type: ignore[union-attr]  # aborts the request
            self.messages.pop()
            self.out.write("\n^C (reply stopped)\n")
            return None
        self.out.write("\n")
        if self.verbose:
            self.out.write(
                f"[prompt {meta.get('prompt_tokens')} tokens, {meta.get('cached_tokens')} "
                f"cached; {meta.get('completion_tokens')} generated]\n"
            )
        self.messages.append({"role": "assistant", "content": reply})
        return reply

    def _prompt(self) -> str:
        tokenizer = self.engine.tokenizer
        if not getattr(tokenizer, "chat_template", None):  # a base model: the turns as text
            return "".join(f"{m['content']}\n" for m in self.messages)
        return tokenizer.apply_chat_template(
            self.messages, tokenize=False, add_generation_prompt=True
        )
