"""A short tour of the default model: a frontend DSL program first, then the offline
engine: one call, a stream, a batch, and constrained outputs (JSON schema, regex,
choices). More DSL programs: ``examples/agent.py``, ``chat.py``, ``json_extraction.py``,
``few_shot_eval.py``, ``tree_of_thought.py``.

Run with ``make demo`` (sets everything up first) or ``.venv/bin/python examples/showcase.py``.
"""

import time

import radixlm as sgl


def chat(engine: sgl.Engine, question: str) -> str:
    return engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )


def main() -> None:
    engine = sgl.Engine()
    greedy = {"temperature": 0, "max_new_tokens": 48}

    print("== a DSL program (radixlm.Runtime on this engine) ==")
    dsl_program(sgl.Runtime(engine=engine))

    print("\n== one call ==")
    out = engine.generate("The capital of France is", {"temperature": 0, "max_new_tokens": 16})
    print(repr(out["text"]), out["meta_info"])

    print("\n== streaming ==")
    for chunk in engine.generate(chat(engine, "Write a haiku about the sea."), greedy, stream=True):
        print(chunk["delta"], end="", flush=True)
    print()

    print("\n== a batch of 8, served together ==")
    questions = [
        "What is 2 + 2?",
        "Name a primary color.",
        "What is the largest planet?",
        "Translate 'thank you' into French.",
        "What do bees make?",
        "Who wrote Hamlet?",
        "What is H2O?",
        "How many days are in a week?",
    ]
    start = time.perf_counter()
    outs = engine.generate([chat(engine, q) for q in questions], greedy)
    elapsed = time.perf_counter() - start
    for q, o in zip(questions, outs):
        print(f"- {q} -> {o['text'].strip()[:70]!r}")
    num_tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    print(f"{num_tokens} tokens in {elapsed:.1f} s ({num_tokens / elapsed:.0f} tok/s)")

    print("\n== constrained: valid by construction ==")
    constrained(engine)
    engine.shutdown()


@sgl.function
def recommend(s, topic: str):
    s += sgl.system("You are a helpful assistant. Answer in one sentence.")
    s += sgl.user(f"Recommend one book about {topic}.")
    s += sgl.assistant(sgl.gen("book", max_tokens=32))
    s += sgl.user("Is it for beginners? Answer yes or no.")
    s += sgl.assistant(sgl.select("beginner", ["yes", "no"]))


def dsl_program(runtime: sgl.Runtime) -> None:
    state = recommend.run(topic="astronomy", backend=runtime, temperature=0)
    print(f"book: {state['book'].strip()}\nfor beginners: {state['beginner']}")
    print(f"roles: {[m['role'] for m in state.messages()]}")


USER_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 30},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 30},
        "is_member": {"type": "boolean"},
    },
    "required": ["name", "age", "city", "is_member"],
    "additionalProperties": False,
}


def constrained(engine: sgl.Engine) -> None:
    prompt = chat(engine, "Give me the details of a fictional user as JSON.")
    for jump in (False, True):
        params = {"json_schema": USER_SCHEMA, "temperature": 0, "jump_forward": jump}
        before = engine.get_stats().num_steps
        out = engine.generate(prompt, params)
        passes = engine.get_stats().num_steps - before
        print(f"json_schema (jump_forward={jump}, {passes} passes): {out['text']}")
    phone = engine.generate(
        chat(engine, "Give a US phone number for a pizza place."),
        {"regex": r"\([2-9][0-9]{2}\) [0-9]{3}-[0-9]{4}", "temperature": 0},
    )
    print(f"regex: {phone['text']}")
    answer = engine.generate(
        chat(engine, "What is the sentiment of this review: 'I love it, it works great!'"),
        {"choices": ["positive", "negative", "neutral"], "temperature": 0},
    )
    print(f"choices: {answer['text']}")


if __name__ == "__main__":
    main()
