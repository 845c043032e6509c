"""A multi-turn chat: role blocks in the model's chat template, one gen per turn.

Each turn appends a user message and an assistant block whose content is a gen;
the gen ends at the model's end-of-turn token (the assistant block adds it as a
stop), and the next turn's prompt is the whole conversation so far, which the
radix cache already holds. ``state.messages()`` is the conversation as chat
messages. The program runs with ``stream=True``, so each answer prints as it is
generated (``text_iter`` of its variable).

Run: ``.venv/bin/python examples/chat.py``
"""

from __future__ import annotations

from typing import Any

import radixlm as sgl

QUESTIONS = [
    "Name one planet in our solar system.",
    "How far is it from the Sun, roughly?",
    "Give one fun fact about it.",
]


@sgl.function
def conversation(s, questions: list[str], max_tokens: int):
    s += sgl.system("You are a friendly assistant. Keep every answer to one or two sentences.")
    for i, question in enumerate(questions):
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen(f"answer_{i}", max_tokens=max_tokens))


def main(
    questions: list[str] = QUESTIONS, max_tokens: int = 48, backend: Any = None
) -> sgl.ProgramState:
    """Runs the conversation greedily, printing each answer as it streams; returns the
    program state."""
    state = conversation.run(
        questions=questions, max_tokens=max_tokens, backend=backend, temperature=0, stream=True
    )
    for i, question in enumerate(questions):
        print(f"user: {question}\nassistant: ", end="", flush=True)
        for piece in state.text_iter(f"answer_{i}"):
            print(piece, end="", flush=True)
        print()
    return state


if __name__ == "__main__":
    runtime = sgl.Runtime()
    sgl.set_default_backend(runtime)
    try:
        main()
    finally:
        runtime.shutdown()
