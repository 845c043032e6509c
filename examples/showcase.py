"""A short tour of the offline engine on the default model: one call, a stream, a batch,
and constrained outputs (JSON schema, regex, choices).

Run with ``make demo`` (sets everything up first) or ``.venv/bin/python examples/showcase.py``.
"""

import time

import radixlm


def chat(engine: radixlm.Engine, question: str) -> str:
    return engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )


def main() -> None:
    engine = radixlm.Engine()
    greedy = {"temperature": 0, "max_new_tokens": 48}

    print("== one call ==")
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


def constrained(engine: radixlm.Engine) -> None:
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
