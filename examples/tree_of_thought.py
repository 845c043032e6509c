"""Tree of thought: branch into candidate thoughts, judge them, continue from the best.

::

                       question
             fork(3)  /    |    \\
      thought (gen)  A     B     C      one kind of idea per branch
    verdict (select) yes   no    yes    "is this idea sensible?"
                      \\    |    /
             join     [A, B, C], [yes, no, yes]   gathered into lists
                           |
       select best of 1..3, then the final answer (gen) from it

The branches run concurrently, each a chat of its own after the shared system
prompt (the radix cache computes that prefix once for all three). Each branch is
asked for a different kind of idea (``APPROACHES``), so that greedy decoding still
gives three distinct thoughts.

Run: ``.venv/bin/python examples/tree_of_thought.py``
"""

from __future__ import annotations

from typing import Any

import radixlm as sgl

QUESTION = "How can a small town reduce traffic jams near its school in the morning?"
APPROACHES = [
    "Suggest a change to the roads.",
    "Suggest something parents can do.",
    "Suggest a new school rule.",
]


@sgl.function
def tree_of_thought(s, question: str, max_tokens: int):
    s += sgl.system("You are a helpful assistant. Answer in one or two sentences.")
    branches = s.fork(len(APPROACHES))
    branches += lambda i: sgl.user(f"{question} {APPROACHES[i]}")
    branches += sgl.assistant(sgl.gen("thought", max_tokens=max_tokens))
    branches += sgl.user("Is this idea sensible? Answer yes or no.")
    branches += sgl.assistant(sgl.select("verdict", ["yes", "no"]))
    branches.join()

    ideas = "".join(f"Idea {i + 1}: {t.strip()}\n" for i, t in enumerate(s["thought"]))
    s += sgl.user(f"{question}\n{ideas}Which idea is best? Answer with its number.")
    s += sgl.assistant("Idea " + sgl.select("best", [str(i + 1) for i in range(len(branches))]))
    s += sgl.user("Explain that idea as the final answer.")
    s += sgl.assistant(sgl.gen("answer", max_tokens=max_tokens))


def main(question: str = QUESTION, max_tokens: int = 32, backend: Any = None) -> sgl.ProgramState:
    """Runs the tree greedily; prints each branch, the pick and the answer, and returns
    the state (``thought`` and ``verdict`` are lists, one item per branch)."""
    state = tree_of_thought.run(
        question=question, max_tokens=max_tokens, backend=backend, temperature=0
    )
    if (error := state.error()) is not None:
        raise error
    for i, (thought, verdict) in enumerate(zip(state["thought"], state["verdict"])):
        print(f"idea {i + 1} ({verdict}): {thought.strip()}")
    print(f"best: idea {state['best']}\nfinal answer: {state['answer'].strip()}")
    return state


if __name__ == "__main__":
    runtime = sgl.Runtime()
    sgl.set_default_backend(runtime)
    try:
        main()
    finally:
        runtime.shutdown()
